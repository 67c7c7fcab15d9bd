"""Loader speed: FFCV (impulsevit's default backend) vs torchvision ImageFolder + DataLoader, side by side.

Generates a few thousand JPEGs (ImageNet-like sizes, ~450 × 340, 10 classes) in a temp folder, converts them with
``impulsevit.data.storage.convert`` for each preset (reporting images/s and ``.beton`` size), then times training epochs
of
each loader at 64 and 224 px with the same workers, batch size and augmentation: RandomResizedCrop (scale 0.08–1) +
horizontal flip, bicubic (PIL's filter on both sides, as the recipes) → uint8 ``(B, 3, S, S)``
batch → ``impulsevit.data.augment.device.normalize`` to float32 in the main thread
(what the datamodule does on a CPU trainer). Every decoded image is a fresh decode and crop: nothing is cached across
epochs except the files themselves (the OS page cache, for both sides).

Contenders per size: ``torchvision`` decodes the original JPEGs (PIL, ``num_workers`` processes); ``ffcv:<preset>``
reads that preset's ``.beton`` through :func:`impulsevit.data.loading.ffcv_loader.build_ffcv_loader` (``num_workers``
threads). For context only, ``torchvision@256`` decodes the same JPEGs pre-resized to max side 256 (quality 90): the
share of FFCV's gain that comes from storing smaller images rather than from the loader. ``decode-limit`` (see
:func:`decode_limit_loader`) decodes the ``short256`` ``.beton``'s images and nothing else, through FFCV's ``Loader``
with the same threads: the floor any loader of those stored images pays; ``ffcv:short256 / decode-limit`` is printed
per size. Every row shows img/s and img/s per worker core (img/s / ``num_workers``).

``ffcv:short256+device`` is ``data.resample_on=device``: the same ``.beton`` and draws, the workers decode and copy
each crop box onto a fixed canvas, and the resample runs on the training device — not in this table (no GPU here;
``benchmarks/device_resample_speed.py`` times it per image). Its consumer takes the canvas batch and does nothing
else, as a GPU run's host (FFCV's ``ToDevice`` copy, made on GPU runs, is not timed); ``ffcv:short256+device /
decode-limit`` is printed per size: the workers' side of that mode against the decode floor.

``litdata:short256`` reads a LitData shard set of the same images (``impulsevit convert --format litdata --preset
short256``, :mod:`impulsevit.data.storage.shards`) from a local folder, ``litdata:short256@s3`` the same set uploaded to
an S3-compatible server on 127.0.0.1 (moto's server mode, a dev dependency, in a process of its own) through the
backend's chunk cache (emptied before the warm-up epoch): both read as the litdata backend reads a training split
(``litdata_loader``: its own classes; the stored bytes from the chunk files' memory maps, libjpeg-turbo decode, the FFCV
decoder's draws and bicubic resample of the crop box, in ``num_workers`` threads of the process as the backend's default
``data.storage.loader=threads``, or ``--litdata-loader processes``: ``DataLoader`` worker processes), in the block order
(``--block-size`` samples, ``--chunk-bytes`` chunks: whole chunks, the next block prefetched, chunks outside the live
blocks deleted, so every epoch of the ``@s3`` row downloads the set again through a cache of a few blocks; each
remote row's ``cache peak`` line gives the largest its cache folder got, :class:`FolderPeak`, against the set's size);
``/ decode-limit`` is printed for them too.
``litdata:short256@s3-slow`` reads the same uploaded set as a distant store serves it: through
:class:`ThrottledProxy` on 127.0.0.1 in front of the moto server (``--slow-latency-ms``, default 50 ms from each
request to its response's first byte; ``--slow-rate``, default 100 MB/s per connection), its own chunk cache, so the
row shows how much of the latency the block order's background prefetch (``ShardSource.follow``) hides;
``@s3 / local`` and ``@s3-slow / local`` are printed per size, and where the CPU goes: ``CPU ms/img`` is the CPU
time per image of this process (every thread: the loader's, the proxy's, the main thread's normalisation) and its
worker processes, ``store ms/img`` that of the loopback store's process (:func:`cpu_seconds`,
:func:`store_cpu_seconds`); on a machine where the store shares the loader's cores, the ``@s3`` row can be at most
``local CPU / (its CPU + the store's)`` of the local row, which the ``CPU per image`` line prints beside the ratio a
store on cores of its own would leave.

The process runs with the malloc setting ``impulsevit fit`` applies (:mod:`impulsevit.memory`: blocks above 32 MiB,
such as a normalised 64 × 224² batch, are reused rather than page-faulted in again every batch) — for both
contenders; ``--default-malloc`` leaves glibc's defaults.

The machine is shared, so contenders are interleaved: after one untimed warm-up epoch each (numba JIT, worker start,
page cache) every round times one epoch of every contender, in rotating order; the table shows the median over
rounds. ``ratio`` = torchvision time / contender time per image (> 1: faster than torchvision).

    python benchmarks/loader_speed.py [--num-images 2000] [--workers 2] [--batch-size 64] [--rounds 3]
    python benchmarks/loader_speed.py --smoke   # seconds: 48 images, 224 px, short256 only, 1 round (the suite's)

The last line is ``ratio: X`` for ``ffcv:short256`` (the preset of the large-image recipes and the datamodule's
default for large-image datasets: shorter side stored at 256 px) at 224 px. ``res256`` (longer side capped at 256,
which loses the eval resolution) is timed for comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from impulsevit.data.augment.device import normalize
from impulsevit.data.loading.ffcv_loader import build_ffcv_loader
from impulsevit.data.sources.image_source import image_folder_source
from impulsevit.data.storage.convert import PRESETS, convert_split
from impulsevit.memory import reuse_large_allocations

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEFAULT_PRESET = "short256"
TARGET = 3.0
LIMIT, LIMIT_TARGET = "decode-limit", 0.7
DEVICE = f"ffcv:{DEFAULT_PRESET}+device"  # data.resample_on=device: the workers decode and copy, the device resamples
LOCAL, S3, SLOW = "litdata:short256", "litdata:short256@s3", "litdata:short256@s3-slow"
S3_FILES = f"{S3}-files"  # the @s3 row with its chunks in cache files (data.storage.in_memory=false)
LOCAL_DEVICE = f"{LOCAL}+device"  # the litdata backend's data.resample_on=device: threads decode and copy


def make_jpegs(root: Path, n: int, seed: int = 0) -> None:
    """``n`` smooth-plus-noise JPEGs of 400–500 × 300–375 px (quality 90), 10 class folders."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = int(rng.integers(400, 501)), int(rng.integers(300, 376))
        low = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(low).resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
        img = np.clip(img + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)
        path = root / f"class_{i % 10}" / f"{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(path, quality=90)


def cap_jpegs(src: Path, dst: Path, max_side: int) -> None:
    """Copy of the ImageFolder ``src`` with every image resized (area filter) to longer side ``max_side``."""
    for path in sorted(src.rglob("*.jpg")):
        img = Image.open(path)
        scale = max_side / max(img.size)
        if scale < 1:
            img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BOX)
        out = dst / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        img.save(out, quality=90)


def normalize_batch(images: torch.Tensor) -> None:
    """The consumer of a CPU trainer: the datamodule normalises every uint8 batch in the main thread."""
    normalize(images, MEAN, STD)


def take_canvas(images: torch.Tensor) -> None:
    """The consumer of ``ffcv:<preset>+device`` as a GPU run's host sees it: the canvas batch is handed on (FFCV's
    ``ToDevice`` copies it; not timed here, no GPU), its resample and normalisation run on the device (timed
    separately by ``benchmarks/device_resample_speed.py``)."""


def cpu_seconds(excluded: frozenset[int] = frozenset()) -> float:
    """CPU seconds (user + system) used so far by this process (all its threads) and its live descendants, leaving
    out the processes in ``excluded`` and their descendants (the loopback store: its CPU is the store's, not the
    loader's). A descendant that exits meanwhile counts as 0 from then on (the loaders' workers are persistent)."""
    import psutil

    me = psutil.Process()
    skip = set(excluded)
    for pid in excluded:
        try:
            skip.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            pass
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        if child.pid not in skip:
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
    return total


def store_cpu_seconds(store: frozenset[int]) -> float:
    """CPU seconds used so far by the processes in ``store`` (the loopback S3 server) and their descendants."""
    import psutil

    total = 0.0
    for pid in store:
        try:
            proc = psutil.Process(pid)
            total += sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])
        except psutil.Error:
            pass
    return total


class FolderPeak:
    """The largest total size (bytes) of the files directly in ``folder`` while the ``with`` block runs, sampled every
    ``every_s`` seconds by a background thread (and once at each end): a remote row's chunk cache, temp files of
    downloads in flight included. A file written and deleted between two samples is missed, so the peak is a lower
    bound within one sample's worth of downloads; a missing folder counts as 0 bytes."""

    def __init__(self, folder: Path, every_s: float = 0.01) -> None:
        self.folder, self.every_s, self.peak = Path(folder), every_s, 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def size(self) -> int:
        """The total size (bytes) of the files directly in the folder now; 0 when it does not exist."""
        try:
            with os.scandir(self.folder) as entries:
                total = 0
                for entry in entries:
                    with contextlib.suppress(OSError):  # deleted between the listing and the stat
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                return total
        except FileNotFoundError:
            return 0

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.size())

    def __enter__(self) -> FolderPeak:
        self.peak = max(self.peak, self.size())
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="cache-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, self.size())


def time_epoch(loader: Iterable, consume: Callable[[torch.Tensor], None] = normalize_batch,
               store: frozenset[int] = frozenset()) -> tuple[float, int, float, float]:
    """Seconds, images, loader CPU seconds (:func:`cpu_seconds`: this process, its threads and workers, the store
    left out) and store CPU seconds (the processes ``store``) for one pass over ``loader``, every batch handed to
    ``consume``."""
    cpu, served = cpu_seconds(store), store_cpu_seconds(store)
    start, n = time.perf_counter(), 0
    for images, _labels in loader:
        consume(images)
        n += images.shape[0]
    seconds = time.perf_counter() - start
    return seconds, n, cpu_seconds(store) - cpu, store_cpu_seconds(store) - served


def torchvision_loader(root: Path, size: int, workers: int, batch: int) -> torch.utils.data.DataLoader:
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.RandomResizedCrop(size, interpolation=transforms.InterpolationMode.BICUBIC),
                             transforms.RandomHorizontalFlip(),
                             transforms.PILToTensor()])
    ds = datasets.ImageFolder(str(root), transform=tf)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                       persistent_workers=workers > 0)


def decode_limit_loader(path: Path, workers: int, batch: int):  # noqa: ANN201 - an ffcv Loader
    """The floor any JPEG loader of ``path`` pays: FFCV's ``Loader`` (same threads, order and reads as
    ``ffcv:<preset>``) with an image decoder that only decodes — every JPEG through FFCV's libjpeg-turbo
    ``imdecode`` (the fastest decoder installed here: ``benchmarks/loader_profile.py`` times it against PIL and
    ``cv2.imdecode``), every raw image copied once with FFCV's ``memcpy`` — into a per-sample scratch buffer, and
    emits one byte per image: no crop, resample or collation into a batch."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import IMAGE_MODES, ResizedCropRGBImageDecoder
    from ffcv.libffcv import imdecode, memcpy
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline.compiler import Compiler
    from ffcv.transforms import ToTensor, ToTorchImage

    from impulsevit._compat.ffcv import replaced_os_cache_manager
    from impulsevit.data.loading.ffcv_loader import keep_torch_threads

    class DecodeOnly(ResizedCropRGBImageDecoder):
        def __init__(self) -> None:
            super().__init__((1, 1))  # a 1 × 1 output slot per image; the scratch buffer holds the decoded image

        @property
        def get_crop_generator(self):  # noqa: ANN202 - unused: generate_code is replaced
            return None

        def generate_code(self):  # noqa: ANN202
            jpg = IMAGE_MODES["jpg"]
            mem_read = self.memory_read
            my_range = Compiler.get_iterator()
            imdecode_c, memcpy_c = Compiler.compile(imdecode), Compiler.compile(memcpy)

            def decode(batch_indices, my_storage, metadata, storage_state):  # noqa: ANN001, ANN202
                destination, temp_storage = my_storage
                for dst_ix in my_range(len(batch_indices)):
                    field = metadata[batch_indices[dst_ix]]
                    image_data = mem_read(field["data_ptr"], storage_state)
                    temp = temp_storage[dst_ix]
                    if field["mode"] == jpg:
                        h32, w32 = np.uint32(field["height"]), np.uint32(field["width"])
                        imdecode_c(image_data, temp, h32, w32, h32, w32, 0, 0, 1, 1, False, False)
                    else:
                        memcpy_c(image_data, temp[:image_data.size])
                    destination[dst_ix, 0, 0, 0] = temp[0]
                return destination[:len(batch_indices)]

            decode.is_parallel = True
            return decode

    with keep_torch_threads(), replaced_os_cache_manager():  # as build_ffcv_loader's: numba's types left unedited
        return Loader(str(path), batch_size=batch, num_workers=workers, os_cache=True, order=OrderOption.RANDOM,
                      drop_last=True, pipelines={"image": [DecodeOnly(), ToTensor(), ToTorchImage()],
                                                 "label": [IntDecoder(), ToTensor()]})


def litdata_loader(location: str, cache: Path | None, size: int, workers: int, batch: int,
                   block_size: int, kind: str = "threads", device: bool = False,
                   in_memory: bool | None = None) -> torch.utils.data.DataLoader:
    """The litdata contender: what the litdata backend builds for a training split —
    :class:`~impulsevit.data.loading.litdata_backend.ShardSource` (stored bytes read from the chunk files' memory
    maps), :class:`~impulsevit.data.loading.litdata_backend.ShardDataset` with the fast path's
    :class:`~impulsevit.data.loading.litdata_backend.CropPlan` (libjpeg-turbo decode, the FFCV decoder's draws and
    bicubic resample of the crop box only, the flip) in ``workers`` threads (``kind`` ``threads``:
    :class:`~impulsevit.data.loading.threaded_loader.ThreadedLoader`) or processes (``processes``), the block order
    of ``block_size`` samples (:class:`~impulsevit.data.loading.sampling.EpochSampler`; each key first handed to
    :meth:`ShardSource.follow`: a remote set's next block prefetched, chunks outside the live blocks deleted).
    ``device``: ``data.resample_on=device`` — the plan copies each crop box onto a canvas sized by the manifest's
    ``max_size`` and the batches are canvases (the resample is the training device's). ``in_memory``:
    ``data.storage.in_memory`` (None: the backend's choice, :func:`~impulsevit.data.loading.litdata_backend.
    holds_in_memory`: a remote set's chunks held in the process's memory under loader threads)."""
    from impulsevit.data.loading.config import StorageConfig
    from impulsevit.data.loading.litdata_backend import (
        CropPlan,
        ShardDataset,
        ShardSource,
        holds_in_memory,
        shards_manifest,
    )
    from impulsevit.data.loading.sampling import EpochSampler
    from impulsevit.data.storage import objstore
    from impulsevit.data.storage.shards import LABELS_NAME

    manifest = shards_manifest(location)
    labels = np.load(io.BytesIO(objstore.read_bytes(objstore.join(location, LABELS_NAME))), allow_pickle=False)
    storage = StorageConfig()  # the backend's defaults (cache size, read timeout): one source of each
    source = ShardSource(location, manifest["classes"], labels, np.arange(len(labels)), cache, storage.cache_size,
                         storage.read_timeout)
    lag = max(workers, 1) * 2 * batch  # as the backend's
    source.stream_blocks(0, 1, block_size, lag, in_memory=holds_in_memory(  # seed 0, one rank
        source, block_size, lag, threads=kind == "threads", setting=in_memory, ranks_here=1))
    canvas = None
    if device:
        from impulsevit.data.loading.device_resample import canvas_side

        canvas = canvas_side(np.array(manifest["max_size"][:1]), np.array(manifest["max_size"][1:]), (3 / 4, 4 / 3))
    ds = ShardDataset(source, None, seed=0, plan=CropPlan(size, train=True, interpolation="bicubic", canvas=canvas))
    sampler = EpochSampler(ds, seed=0, batch_size=batch, chunk_sizes=source.chunk_sizes(), block_size=block_size)
    if kind == "threads":
        from impulsevit.data.loading.threaded_loader import ThreadedLoader

        return ThreadedLoader(ds, sampler=sampler, batch_size=batch, threads=workers)
    return torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers, drop_last=True,
                                       persistent_workers=workers > 0, collate_fn=ds.collate_fn)


class MotoProcess:
    """moto's S3 server (``python -m moto.server``) on 127.0.0.1 in a process of its own, as a real store is: in the
    benchmark's process its Python request handling would share the GIL with the litdata loader's threads (its
    request log goes nowhere). The server gets SIGTERM when this process exits."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        import socket
        import subprocess
        import sys
        import urllib.request

        from impulsevit.procs import popen

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's server did not start on {self.endpoint}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        """End the server process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def start_loopback_s3() -> tuple[MotoProcess, str]:
    """moto's S3 server on 127.0.0.1 (:class:`MotoProcess`) with a bucket ``bench``; its endpoint and keys set in
    ``os.environ``."""
    import boto3

    server = MotoProcess()
    os.environ.update(AWS_ENDPOINT_URL=server.endpoint, AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    boto3.session.Session().client("s3").create_bucket(Bucket="bench")
    return server, "s3://bench/set"


class ThrottledProxy:
    """A TCP proxy on 127.0.0.1 in front of the HTTP endpoint ``upstream`` (``http://host:port``) that makes a
    loopback object store look distant: the first byte of every response is held until ``latency_s`` after the first
    byte of its request (a round trip plus the store's time to first byte), and each connection's responses stream
    at ``rate`` bytes/s at most (paced after every read of up to 64 KiB). Requests pass unthrottled.

    A response is whatever the upstream sends after the client has sent something, which is plain HTTP/1.1's
    request–response on a keep-alive connection (boto3's); not supported: pipelined requests, TLS (only the timing of
    whole responses would be off: the bytes pass unchanged). Hand-written on stdlib ``socketserver`` threads (two per
    connection) because no installed package throttles a TCP stream (toxiproxy is a separate Go server)."""

    CHUNK = 64 * 1024

    def __init__(self, upstream: str, latency_s: float = 0.05, rate: float = 100e6) -> None:
        import socketserver
        import threading
        from urllib.parse import urlsplit

        url = urlsplit(upstream)
        if url.scheme != "http" or url.hostname is None or url.port is None:
            raise ValueError(f"ThrottledProxy: upstream must be http://host:port, not {upstream!r}")
        if latency_s < 0 or rate <= 0:
            raise ValueError(f"ThrottledProxy: latency_s >= 0 and rate > 0 needed (got {latency_s}, {rate})")
        self.upstream, self.latency_s, self.rate = (url.hostname, url.port), latency_s, rate
        self._open: set = set()  # the sockets of live connections, closed by stop()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads, request_queue_size = True, 64

        self._server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="throttled-proxy", daemon=True)
        self._thread.start()

    def _serve(self, client) -> None:  # noqa: ANN001 - a connected socket
        import contextlib
        import socket
        import threading

        upstream = socket.create_connection(self.upstream)
        self._open |= {client, upstream}
        asked = threading.Event()  # the client sent a request whose response has not begun
        asked_at = [0.0]

        def forward_requests() -> None:
            with contextlib.suppress(OSError):
                while data := client.recv(self.CHUNK):
                    if not asked.is_set():
                        asked_at[0] = time.perf_counter()
                        asked.set()
                    upstream.sendall(data)
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)  # the client is done: the upstream closes, ending the loop below

        requests = threading.Thread(target=forward_requests, daemon=True)
        requests.start()
        start, sent = time.perf_counter(), 0
        with contextlib.suppress(OSError):
            while data := upstream.recv(self.CHUNK):
                if asked.is_set():  # the first bytes of a response
                    asked.clear()
                    time.sleep(max(0.0, asked_at[0] + self.latency_s - time.perf_counter()))
                    start, sent = time.perf_counter(), 0
                client.sendall(data)
                sent += len(data)
                time.sleep(max(0.0, start + sent / self.rate - time.perf_counter()))
        for sock in (upstream, client):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        upstream.close()
        requests.join()
        self._open -= {client, upstream}

    def stop(self) -> None:
        """Stop accepting and cut the live connections."""
        import contextlib
        import socket

        self._server.shutdown()
        self._server.server_close()
        for sock in list(self._open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _use_endpoint(endpoint: str, then: Callable[[int], None] | None, worker_id: int) -> None:
    """A loader worker's ``worker_init_fn``: this process's S3 clients (created lazily, after it) go to
    ``endpoint``."""
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    if then is not None:
        then(worker_id)


def through_endpoint(loader: torch.utils.data.DataLoader, endpoint: str) -> torch.utils.data.DataLoader:
    """``loader`` reading the object store at ``endpoint`` instead of the process's ``AWS_ENDPOINT_URL`` (other
    loaders keep theirs): a threaded loader's source gets its chunk client from there (the one client its
    :meth:`~impulsevit.data.loading.litdata_backend.ShardSource.fetch` uses); a ``DataLoader``'s worker processes
    get the endpoint as theirs, which needs ``num_workers >= 1`` (the chunk reads of a 0-worker loader run in the
    main process)."""
    import functools

    from impulsevit.data.loading.litdata_backend import chunk_client
    from impulsevit.data.loading.threaded_loader import ThreadedLoader

    if isinstance(loader, ThreadedLoader):
        source, saved = loader.dataset.source, os.environ["AWS_ENDPOINT_URL"]
        os.environ["AWS_ENDPOINT_URL"] = endpoint  # boto3 reads it when the client is made
        try:
            source._client = chunk_client(source.read_timeout)
        finally:
            os.environ["AWS_ENDPOINT_URL"] = saved
        return loader
    if loader.num_workers < 1:
        raise ValueError("through_endpoint: needs a loader with worker processes (num_workers >= 1)")
    loader.worker_init_fn = functools.partial(_use_endpoint, endpoint, loader.worker_init_fn)
    return loader


def interleaved(loaders: dict[str, Iterable], rounds: int,
                consumers: dict[str, Callable[[torch.Tensor], None]] | None = None,
                store: frozenset[int] = frozenset(),
                caches: dict[str, FolderPeak] | None = None) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Median images/s of each loader over ``rounds`` timed epochs, interleaved (after one warm-up epoch each), and
    the median CPU milliseconds per image ``(loader, store)`` (:func:`time_epoch`; ``store``: the loopback store's
    process ids); ``consumers`` (by name; default :func:`normalize_batch`) is what the main thread does with each
    batch; ``caches`` (by name): a :class:`FolderPeak` watching that row's chunk cache through its timed epochs."""
    consumers, caches = consumers or {}, caches or {}
    for name, loader in loaders.items():
        time_epoch(loader, consumers.get(name, normalize_batch), store)
    names = list(loaders)
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            with caches.get(name) or contextlib.nullcontext():
                seconds, n, loader_cpu, store_cpu = time_epoch(loaders[name], consumers.get(name, normalize_batch),
                                                               store)
            rates[name].append(n / seconds)
            cpu[name].append((1000 * loader_cpu / n, 1000 * store_cpu / n))
    return ({name: statistics.median(v) for name, v in rates.items()},
            {name: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v)) for name, v in cpu.items()})


def convert_table(source, tmp: Path, presets: list[str], workers: int, n: int) -> dict[str, float]:  # noqa: ANN001
    """Convert ``source`` with every preset; print throughput and size; return the size in MiB per preset."""
    print(f"\n{'preset':<8} {'convert img/s':>14} {'total img/s':>12} {'.beton MiB':>11} {'expected MiB':>13}  "
          f"(write-only and check + write; {workers} workers)")
    sizes = {}
    for name in presets:
        t = time.perf_counter()
        m = convert_split(source, tmp / f"{name}.beton", PRESETS[name], workers=workers, progress=False,
                          log=lambda _: None)
        sizes[name] = m["bytes"] / 2**20
        print(f"{name:<8} {m['write_images_per_second']:>14.0f} {n / (time.perf_counter() - t):>12.0f} "
              f"{sizes[name]:>11.1f} {m['expected_bytes'] / 2**20:>13.1f}")
    return sizes


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-images", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="timed epochs per contender (median reported)")
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 224])
    p.add_argument("--presets", nargs="+", default=["short256", "res256", "short320", "res512"],
                   help="presets to convert (throughput and size)")
    p.add_argument("--loader-presets", nargs="+", default=["short256", "res256"],
                   help="converted presets whose FFCV loader is timed")
    p.add_argument("--no-capped", action="store_true", help="skip the torchvision@256 context row")
    p.add_argument("--no-device", action="store_true", help=f"skip the {DEVICE} row")
    p.add_argument("--no-litdata", action="store_true", help="skip the litdata rows (local folder, loopback S3)")
    p.add_argument("--files-row", action="store_true",
                   help=f"add {S3_FILES}: the @s3 row with its chunks in cache files (data.storage.in_memory=false), "
                        f"where the threaded @s3 row holds them in memory")
    p.add_argument("--no-slow", action="store_true", help=f"skip the {SLOW} row (loopback S3 behind a throttled proxy)")
    p.add_argument("--slow-latency-ms", type=float, default=50.0,
                   help=f"the {SLOW} row's proxy: milliseconds from each request to its response's first byte")
    p.add_argument("--slow-rate", type=float, default=100.0,
                   help=f"the {SLOW} row's proxy: MB/s per connection at most (decimal megabytes)")
    p.add_argument("--block-size", type=int, default=256,
                   help="the litdata rows' data.storage.block_size (samples; the backend's default is 65,536: a "
                        "benchmark set is small; the remote rows' cache holds the loader's lag plus two blocks, "
                        "printed as 'cache peak')")
    p.add_argument("--litdata-loader", choices=("threads", "processes"), default="threads",
                   help="the litdata rows' loader (data.storage.loader): threads of this process (the default) or "
                        "DataLoader worker processes")
    p.add_argument("--default-malloc", action="store_true",
                   help="leave glibc malloc at its defaults instead of the setting `impulsevit fit` applies")
    p.add_argument("--chunk-bytes", default="1MB",
                   help="the litdata shard sets' chunk size (LitData's chunk_bytes; the converter's default is 64MB, "
                        "~600 images: a benchmark set of a few thousand images would be a handful of chunks)")
    p.add_argument("--smoke", action="store_true",
                   help=f"a few seconds: 48 images, batch 16, 1 worker, 224 px, the short256 preset only, 1 round, "
                        f"no torchvision@256 row, the loopback S3 only through the proxy ({SLOW}: the @s3 row's "
                        f"code path and the proxy; checks that every contender runs; the numbers mean nothing)")
    args = p.parse_args(argv)
    if args.smoke:
        args.num_images, args.batch_size, args.workers, args.rounds = 48, 16, 1, 1
        args.sizes, args.presets, args.loader_presets, args.no_capped = [224], [DEFAULT_PRESET], [DEFAULT_PRESET], True
        args.block_size = 16
    for name in {*args.presets, *args.loader_presets, DEFAULT_PRESET}:
        if name not in PRESETS:
            p.error(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    torch.set_num_threads(1)
    log: Callable[[str], None] = print
    # the process setting `impulsevit fit` applies (impulsevit/memory.py), for both contenders (forked torchvision
    # workers inherit it): large per-batch blocks are reused instead of page-faulted in again every batch
    heap_reuse = False if args.default_malloc else reuse_large_allocations()
    log(f"malloc: {'large blocks reused (as `impulsevit fit` sets it)' if heap_reuse else 'glibc defaults'}")
    with tempfile.TemporaryDirectory(prefix="loader-speed-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        make_jpegs(tmp / "jpegs", args.num_images)
        src_bytes = sum(f.stat().st_size for f in (tmp / "jpegs").rglob("*.jpg"))
        log(f"generated {args.num_images} JPEGs ({src_bytes / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s; "
            f"{os.cpu_count()} CPUs, {args.workers} workers, batch {args.batch_size}, median of {args.rounds} "
            f"interleaved epochs")
        if not args.no_capped:
            cap_jpegs(tmp / "jpegs", tmp / "jpegs256", 256)
        source = image_folder_source(tmp / "jpegs")
        to_convert = list(dict.fromkeys([*args.presets, *args.loader_presets, DEFAULT_PRESET]))
        mib = convert_table(source, tmp, to_convert, args.workers, args.num_images)
        server = proxy = None
        if not args.no_litdata:
            from impulsevit.data.storage.shards import write_shards

            shard_dirs = {LOCAL: str(tmp / "shards")}
            m = write_shards(source, shard_dirs[LOCAL], PRESETS[DEFAULT_PRESET], progress=False,
                             log=lambda _: None, chunk_bytes=args.chunk_bytes)
            server, url = start_loopback_s3()
            write_shards(source, url, PRESETS[DEFAULT_PRESET], progress=False, log=lambda _: None,
                         chunk_bytes=args.chunk_bytes)
            shard_dirs[S3] = url
            if args.files_row:
                shard_dirs[S3_FILES] = url
            mib["litdata"] = m["bytes"] / 2**20
            log(f"litdata shard set ({DEFAULT_PRESET}): {mib['litdata']:.1f} MiB, local and on loopback S3 {url}; "
                f"read by {args.workers} {args.litdata_loader} (data.storage.loader)")
            if args.no_slow:
                pass
            elif args.workers < 1 and args.litdata_loader == "processes":
                log(f"{SLOW}: left out (its worker processes read through the proxy: needs --workers >= 1)")
            else:
                proxy = ThrottledProxy(os.environ["AWS_ENDPOINT_URL"], args.slow_latency_ms / 1000,
                                       args.slow_rate * 1e6)
                shard_dirs[SLOW] = url
                log(f"{SLOW}: the same set through a throttled proxy {proxy.endpoint}: {args.slow_latency_ms:g} ms "
                    f"to each response's first byte, {args.slow_rate:g} MB/s per connection")
                if args.smoke:  # the same code path as the @s3 row's, the proxy added: one of the two suffices
                    del shard_dirs[S3]

        loader_presets = list(dict.fromkeys([DEFAULT_PRESET, *args.loader_presets]))
        ratios: dict[tuple[int, str], float] = {}
        limits: dict[int, float] = {}
        device_limits: dict[int, float] = {}
        if not args.no_device:
            log(f"\nnote: {DEVICE} (data.resample_on=device): the workers decode and copy each crop box onto a canvas; "
                f"the resample runs on the training device and is not in this table (benchmarks/"
                f"device_resample_speed.py times it); its consumer only takes the canvas batch, as a GPU run's host "
                f"does (FFCV's ToDevice copy is not timed: no GPU here)")
        log(f"\n{'size':>5} {'loader':<24} {'img/s':>7} {'img/s/core':>10} {'ratio':>6} {'data MiB':>9} "
            f"{'CPU ms/img':>10} {'store ms/img':>12}")
        for size in args.sizes:
            caches: dict[str, FolderPeak] = {}  # the remote rows' chunk caches, watched through the timed epochs
            loaders: dict[str, Iterable] = {
                "torchvision": torchvision_loader(tmp / "jpegs", size, args.workers, args.batch_size)}
            if not args.no_capped:
                loaders["torchvision@256"] = torchvision_loader(tmp / "jpegs256", size, args.workers,
                                                                args.batch_size)
            loaders[LIMIT] = decode_limit_loader(tmp / f"{DEFAULT_PRESET}.beton", args.workers, args.batch_size)
            for name in loader_presets:
                loaders[f"ffcv:{name}"] = build_ffcv_loader(tmp / f"{name}.beton", train=True, image_size=size,
                                                            batch_size=args.batch_size, num_workers=args.workers,
                                                            in_memory=True)
            if not args.no_device:
                loaders[DEVICE] = build_ffcv_loader(tmp / f"{DEFAULT_PRESET}.beton", train=True, image_size=size,
                                                    batch_size=args.batch_size, num_workers=args.workers,
                                                    in_memory=True, resample_on="device")
            if not args.no_litdata:
                import shutil

                shutil.rmtree(tmp / "chunk-cache", ignore_errors=True)
                for name, where in shard_dirs.items():  # each remote row its own chunk cache
                    cache = tmp / "chunk-cache" / name.split("@")[1] if "@" in name else None
                    if cache is not None:
                        caches[name] = FolderPeak(cache)
                    loaders[name] = litdata_loader(where, cache, size, args.workers, args.batch_size, args.block_size,
                                                   args.litdata_loader, in_memory=False if name == S3_FILES else None)
                if not args.no_device and LOCAL in shard_dirs:
                    loaders[LOCAL_DEVICE] = litdata_loader(shard_dirs[LOCAL], None, size, args.workers,
                                                           args.batch_size, args.block_size, args.litdata_loader,
                                                           device=True)
                if proxy is not None:
                    through_endpoint(loaders[SLOW], proxy.endpoint)
            store = frozenset() if server is None else frozenset({server.proc.pid})
            rates, cpu_ms = interleaved(loaders, args.rounds, {DEVICE: take_canvas, LOCAL_DEVICE: take_canvas}, store,
                                        caches)
            data_mib = {"torchvision": src_bytes / 2**20, **{f"ffcv:{k}": v for k, v in mib.items()},
                        LIMIT: mib[DEFAULT_PRESET], DEVICE: mib[DEFAULT_PRESET]}
            if not args.no_litdata:
                data_mib |= {name: mib["litdata"] for name in [*shard_dirs, LOCAL_DEVICE] if name in rates}
            if not args.no_capped:
                data_mib["torchvision@256"] = sum(f.stat().st_size for f in (tmp / "jpegs256").rglob("*")) / 2**20
            for name, rate in rates.items():
                ratios[size, name] = rate / rates["torchvision"]
                log(f"{size:>5} {name:<24} {rate:>7.0f} {rate / args.workers:>10.0f} {ratios[size, name]:>6.2f} "
                    f"{data_mib[name]:>9.1f} {cpu_ms[name][0]:>10.2f} {cpu_ms[name][1]:>12.2f}")
            limits[size] = rates[f"ffcv:{DEFAULT_PRESET}"] / rates[LIMIT]
            log(f"{size:>5} ratio ffcv:{DEFAULT_PRESET} / {LIMIT}: {limits[size]:.2f} (img/s per worker core)")
            for name in [n for n in rates if n.startswith("litdata:")]:
                log(f"{size:>5} ratio {name} / {LIMIT}: {rates[name] / rates[LIMIT]:.2f} (img/s per worker core)")
            remote = [n for n in (S3, S3_FILES, SLOW) if n in rates]
            for name in remote:
                log(f"{size:>5} ratio {name} / local: {rates[name] / rates[LOCAL]:.2f} (img/s)")
            for name in [n for n in remote if n in caches]:
                held = loaders[name].dataset.source  # type: ignore[attr-defined]
                where, peak = ("memory", held.peak_held_bytes) if held.in_memory else ("folder", caches[name].peak)
                log(f"{size:>5} cache peak: {name} {peak / 2**20:.1f} MiB in {where}, "
                    f"{100 * peak / 2**20 / mib['litdata']:.0f} % of the shard set")
            for name in remote:
                loader_ms, store_ms = cpu_ms[name]
                log(f"{size:>5} CPU per image: {name} {loader_ms:.2f} ms in the loader + {store_ms:.2f} ms in the "
                    f"store's process, {LOCAL} {cpu_ms[LOCAL][0]:.2f} ms; loader CPU ratio local / remote: "
                    f"{cpu_ms[LOCAL][0] / loader_ms:.2f} (what a store on cores of its own leaves), and "
                    f"{cpu_ms[LOCAL][0] / (loader_ms + store_ms):.2f} with the store's CPU counted (the img/s ratio "
                    f"when both rows are CPU-bound on the same cores)")
            if DEVICE in rates:
                device_limits[size] = rates[DEVICE] / rates[LIMIT]
                log(f"{size:>5} ratio {DEVICE} / {LIMIT}: {device_limits[size]:.2f} (img/s per worker core; "
                    f"its resample runs on the training device, timed separately)")
            if LOCAL_DEVICE in rates and DEVICE in rates:
                log(f"{size:>5} ratio {LOCAL_DEVICE} / {DEVICE}: {rates[LOCAL_DEVICE] / rates[DEVICE]:.2f} (img/s; "
                    f"the same bytes, both resampled on the device)")
            del loaders
        top = max(args.sizes)
        met = [name for (size, name), r in ratios.items()
           if size == top and name.startswith("ffcv:") and name != DEVICE and r >= TARGET]
        log(f"\ntarget FFCV >= {TARGET:g}x torchvision at {top} px: "
            + (f"met by {', '.join(met)}" if met else "not met by any preset tried"))
        log(f"target ffcv:{DEFAULT_PRESET} >= {LIMIT_TARGET:g} of the {LIMIT} at {top} px: "
            + ("met" if limits[top] >= LIMIT_TARGET else "not met") + f" ({limits[top]:.2f})")
        if top in device_limits:
            log(f"target {DEVICE} >= {LIMIT_TARGET:g} of the {LIMIT} at {top} px (worker side only): "
                + ("met" if device_limits[top] >= LIMIT_TARGET else "not met") + f" ({device_limits[top]:.2f})")
        if proxy is not None:
            proxy.stop()
        if server is not None:
            server.stop()
    ratio = ratios.get((top, f"ffcv:{DEFAULT_PRESET}"), float("nan"))
    print(f"ratio: {ratio:.2f}")
    return ratio


if __name__ == "__main__":
    main()
