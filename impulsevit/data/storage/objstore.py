"""One way to read and write a shard set's files whether it lies in a local folder or under an ``s3://bucket/prefix``.

Locations are strings: a local path, or ``s3://bucket/key-prefix`` (S3 and S3-compatible stores: MinIO, Ceph, R2,
moto). The S3 client is boto3's (a dependency of LitData, which reads the chunks): the endpoint, region and
credentials come from boto3's standard chain — the environment variables ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
``AWS_DEFAULT_REGION``, ``AWS_PROFILE`` and the files ``~/.aws/{config,credentials}``; impulsevit adds no setting of
its own, so the same variables configure the converter, the loaders (LitData reads them too) and the AWS CLI.

Every failure of the store becomes :class:`~impulsevit.errors.StoreError` (one line, exit status 2) naming the
location and what to set (:func:`store_error`): a missing bucket, missing or refused credentials, an unreachable
endpoint. The client gives up after ``CONNECT_TIMEOUT_S`` seconds and two attempts, so a dead endpoint is reported
within seconds, not after botocore's default minutes of retries.

Not supported: GCS / Azure URLs (LitData reads ``gs://`` itself, but the manifest reader and uploader here only
speak S3), anonymous (unsigned) access.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from impulsevit.errors import StoreError

__all__ = ["CONNECT_TIMEOUT_S", "check_writable", "endpoint", "is_remote", "join", "list_sizes", "read_bytes",
           "s3_client", "split_url", "store_error", "upload_file"]

CONNECT_TIMEOUT_S = 5
"""Seconds before a connection attempt to the object store is abandoned (two attempts in all)."""


def is_remote(location: str | os.PathLike) -> bool:
    """Whether ``location`` is an object-store URL (``s3://``) rather than a local path."""
    return str(location).startswith("s3://")


def join(location: str, *names: str) -> str:
    """``location`` / ``names`` for a local path or a URL (a URL keeps its ``/`` separators)."""
    if is_remote(location):
        return "/".join([location.rstrip("/"), *names])
    return str(Path(location, *names))


def endpoint() -> str:
    """The S3 endpoint the environment names (``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``), or ``""`` (AWS)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → ``("bucket", "a/b")``.

    Raises:
        StoreError: no bucket name."""
    rest = url[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StoreError(f"{url}: no bucket name (expected s3://BUCKET/PREFIX)")
    return bucket, key.strip("/")


def s3_client(read_timeout: float = 30, *, validate_checksums: bool = True) -> Any:
    """A boto3 S3 client from the standard AWS environment (module docstring), with short timeouts (``read_timeout``
    seconds waiting for data) and two attempts. ``validate_checksums=False``: responses are not checked against the
    checksum the store keeps for an object (botocore's ``response_checksum_validation="when_required"``): the chunk
    reads of the litdata backend, where that CRC32 costs 0.4 ms of CPU per MB here, as much as the download, and
    the size is checked against the set's ``index.json`` instead (over HTTPS, TLS already guards the bytes in
    transit; ``docs/data.md``)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - litdata installs boto3
        raise StoreError("reading or writing s3:// locations needs boto3 (pip install 'impulsevit[litdata]')") \
            from exc
    settings: dict[str, Any] = dict(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=read_timeout,
                                    retries={"max_attempts": 2, "mode": "standard"})
    if not validate_checksums:
        settings["response_checksum_validation"] = "when_required"
    try:
        config = Config(**settings)
    except TypeError:  # botocore < 1.36: no such setting, and no response checksums validated either
        settings.pop("response_checksum_validation", None)
        config = Config(**settings)
    # a fresh session: boto3's default one caches the credentials it found first, hiding later environment changes
    return boto3.session.Session().client("s3", config=config)


def store_error(exc: BaseException, location: str, action: str) -> StoreError:
    """``exc`` raised by boto3 while ``action`` (``reading``, ``listing``, ``writing``) ``location`` → one line
    saying which of the usual causes it is and what to set."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    where = endpoint() or "AWS S3 (default)"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return StoreError(f"{action} {location}: no credentials for the object store (set AWS_ACCESS_KEY_ID and "
                          f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)")
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        bucket = split_url(location)[0] if is_remote(location) else location
        if code == "NoSuchBucket" or (code == "404" and action != "reading"):
            return StoreError(f"{action} {location}: bucket {bucket!r} does not exist at {where} (create it, or "
                              f"fix the URL / AWS_ENDPOINT_URL)")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "ExpiredToken"):
            return StoreError(f"{action} {location}: the object store refused the credentials ({code}; check "
                              f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN and the bucket's "
                              f"policy)")
        return StoreError(f"{action} {location}: the object store answered {code or 'an error'}: "
                          f"{exc.response.get('Error', {}).get('Message', exc)}")
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    # LitData's chunk prefetch thread reports a dead connection as a RuntimeError naming botocore's error
    unreachable = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
                   "Could not connect to the endpoint URL")
    if any(word in text for word in unreachable):
        cause = next(word for word in unreachable if word in text)
        return StoreError(f"{action} {location}: cannot reach the object store at {where} ({cause}; is it up? "
                          f"check AWS_ENDPOINT_URL)")
    if isinstance(exc, EndpointConnectionError) or "Connect" in type(exc).__name__ or isinstance(exc, OSError):
        return StoreError(f"{action} {location}: cannot reach the object store at {where} ({text}; is it up? "
                          f"check AWS_ENDPOINT_URL)")
    return StoreError(f"{action} {location}: {type(exc).__name__}: {text}")


def _guard(location: str, action: str, call, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call(*args, **kwargs)
    except (BotoCoreError, ClientError, OSError) as exc:
        raise store_error(exc, location, action) from exc


def read_bytes(location: str, read_timeout: float = 30, client: Any = None) -> bytes | None:
    """The content of the file / object at ``location``; None when it does not exist (the bucket does);
    ``read_timeout``: seconds a read may wait for data (remote only); ``client``: a client of :func:`s3_client` to
    reuse (a new one costs tens of milliseconds).

    Raises:
        StoreError: the bucket is missing, the credentials are missing or refused, the endpoint is unreachable."""
    if not is_remote(location):
        try:
            return Path(location).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
    from botocore.exceptions import ClientError

    bucket, key = split_url(location)
    client = client or s3_client(read_timeout)
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            _guard(location, "reading", client.head_bucket, Bucket=bucket)  # a missing bucket says so
            return None
        raise store_error(exc, location, "reading") from exc
    except Exception as exc:  # noqa: BLE001 - botocore's connection errors have no common base with ClientError
        raise store_error(exc, location, "reading") from exc


def list_sizes(location: str) -> dict[str, int]:
    """``{name: bytes}`` of the files directly under the folder / prefix ``location`` (empty when none).

    Raises:
        StoreError: as :func:`read_bytes`."""
    if not is_remote(location):
        folder = Path(location)
        return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}
    bucket, key = split_url(location)
    prefix = key + "/" if key else ""
    client = s3_client()
    out: dict[str, int] = {}
    pages = _guard(location, "listing", lambda: list(client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix, Delimiter="/")))
    for page in pages:
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix):]] = int(obj["Size"])
    return out


def check_writable(location: str) -> None:
    """Before any work: the bucket of ``location`` exists and the credentials are accepted (a local folder is
    claimed by the caller).

    Raises:
        StoreError: as :func:`read_bytes`."""
    if is_remote(location):
        bucket, _ = split_url(location)
        _guard(location, "writing", s3_client().head_bucket, Bucket=bucket)


def upload_file(local: str | os.PathLike, location: str, client: Any = None) -> None:
    """Copy the local file ``local`` to the object ``location`` (boto3's managed transfer: multipart for large
    files, one object appears whole or not at all); ``client``: a client of :func:`s3_client` to reuse (a new one
    costs about 0.09 s of CPU here, more than uploading a small chunk).

    Raises:
        StoreError: as :func:`read_bytes`."""
    bucket, key = split_url(location)
    _guard(location, "writing", (client or s3_client()).upload_file, str(local), bucket, key)
