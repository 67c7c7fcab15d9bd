"""A real S3-compatible object store on 127.0.0.1 for the tests: moto's server mode (``moto[server]``, the dev extra),
in a thread of the test process, with a bucket. The impulsevit code under test talks to it through the standard AWS
variables only (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), as it would to a real store."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

BUCKET = "impulsevit-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopbackS3:
    """``ThreadedMotoServer`` on a fixed loopback port (so it can be stopped and started again at the same endpoint)
    and the environment a client needs to reach it (:attr:`env`)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        self._server = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def reset(self) -> None:
        """Empty the store: moto keeps its buckets in process-wide state that outlives a stopped server, so without
        this a second store in the same test process would start with the first one's objects (moto's documented
        ``POST /moto-api/reset``)."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=30)

    def client(self):  # noqa: ANN201 - a boto3 client
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")


@contextmanager
def loopback_s3() -> Iterator[LoopbackS3]:
    """A started :class:`LoopbackS3` with :data:`BUCKET` created and its variables set in ``os.environ`` meanwhile
    (subprocesses started with ``os.environ`` inherit them)."""
    store = LoopbackS3()
    store.start()
    saved = {k: os.environ.get(k) for k in store.env}
    os.environ.update(store.env)
    try:
        store.reset()
        store.client().create_bucket(Bucket=BUCKET)
        yield store
    finally:
        store.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
