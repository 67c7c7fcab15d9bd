"""LitData internals impulsevit uses (see :mod:`impulsevit._compat`). LitData is optional: imported when called."""

from __future__ import annotations

__all__ = ["sdk_chunk_downloads"]


def sdk_chunk_downloads() -> None:
    """From now on in this process, LitData downloads S3 chunks with its boto3 client (which follows
    ``AWS_ENDPOINT_URL`` whatever its scheme) instead of obstore. Called for plain-``http://`` endpoints (an
    S3-compatible server without TLS: MinIO or moto on a cluster's own network, the test suite's loopback store):
    LitData builds its obstore client without ``allow_http``, so every chunk read from such an endpoint fails
    (``BadScheme``). HTTPS endpoints keep obstore.

    Reaches: ``litdata.streaming.downloader._OBSTORE_AVAILABLE`` (module global, set to False)
    Checked on: litdata>=0.2.76,<0.3
    Waits for: a LitData option to pass obstore client options (``allow_http``) or to pick the download client.
    """
    import litdata.streaming.downloader as downloader

    downloader._OBSTORE_AVAILABLE = False
