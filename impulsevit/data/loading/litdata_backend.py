"""The litdata backend: LitData shard sets (``impulsevit convert --format litdata``) read from a local folder or an
object store (``s3://``) through a local chunk cache, with the torchvision backend's orders and a fast decode-and-crop
path (below) beside its transforms.

How it reads: each split is a :class:`ShardSource`, an
:class:`~impulsevit.data.sources.image_source.ImageSource` whose ``load(i)`` decodes sample ``j`` of the set. The
training order is ``data.order``: ``block`` (the default, ``auto``, on a set written shuffled;
:func:`~impulsevit.data.loading.sampling.block_sequence`:
chunks shuffled and dealt to the ranks, samples shuffled within blocks of ``data.storage.block_size``), under which a
remote chunk is fetched whole, once per node (:meth:`ShardSource.fetch`) — into the training process's memory under
loader threads (:func:`holds_in_memory`), else into the node's cache folder — the next block's chunks download in
background threads of each loader process while the current block decodes (:meth:`ShardSource.follow`), and a cache
of a few blocks suffices; or ``global`` (``auto`` on a set in the source's order: one permutation of
the set), under which LitData
downloads the chunk holding sample ``j`` into the cache, evicting the oldest chunks beyond ``data.storage.cache_size``.
The loaders are the torchvision backend's
(:class:`~impulsevit.data.loading.torchvision_backend.TorchvisionBackend`): the training order is
:func:`~impulsevit.data.loading.sampling.epoch_sequence` of (seed, epoch, rank, world size[, chunk sizes, block size])
through
:class:`~impulsevit.data.loading.sampling.EpochSampler`, random erasing on the device.

The fast path (:class:`ShardDataset` with a :class:`CropPlan`, where :func:`crop_plans` gives one): a sample's stored
bytes are a view of its chunk file's memory map (:meth:`ShardSource.stored`: the Arrow column of LitData >= 0.2.76
chunks, located with the set's ``index.json``; LitData itself reads only chunks without one, and a remote set's chunks
under the global order), a JPEG is decoded by libjpeg-turbo through torchvision (PIL's pixels:
:func:`~impulsevit.data.storage.shards.decode_image`), and the crop is the FFCV decoder's, by the same numba kernels
(:func:`~impulsevit.data.loading.resample.train_crop`: draws keyed by (seed, epoch, stored sample index), only the
crop box resampled, PIL-exact bicubic / bilinear; eval: timm's resize + centre crop). Samples stay HWC and batches
are channels-last views (:func:`channels_last_batch`), as FFCV's. Profile that motivated it (``short256``, 224 px,
one worker of this shared 2-core machine, µs per sample): LitData's one-item slice 370, PIL decode 1,150 (JPEG and
raw mixed), ``Image.fromarray`` 140, torchvision's ``RandomResizedCrop`` of the whole PIL image 2,100 and
``PILToTensor`` 130, seeding the three global RNGs 340; now: the stored bytes ~50 (chunk openings included),
torchvision's JPEG decode ~600 per JPEG, the numba crop ~250. ``benchmarks/loader_speed.py`` (224 px, 2 workers,
block order, loaded machine): 0.96–1.01 of ``ffcv:short256`` on the same stored images with 400 images (before:
0.34); with 2,000, 0.73–0.75 through ``DataLoader`` worker processes (their process hop) and 0.76–0.87 through the
training loader's threads (:mod:`~impulsevit.data.loading.threaded_loader`, the default where no timm transform
follows the crop; ``docs/data.md``). What differs from the
torchvision backend: the training crops and flips (other draws, and Pillow 13's pass order on crops that shrink
both axes: a few levels on a few percent of them); with ``--preset raw`` the training batches are the FFCV loader's
image for image and the eval batches the torchvision backend's, byte for byte
(``tests/data/loading/test_litdata_backend.py``). timm's transforms after the crop (RandAugment, colour jitter) run
in PIL under the torchvision backend's seeds of (seed, epoch, position). Without numba, with another interpolation
or another train transform (a vertical flip), the torchvision backend's PIL transforms and draws run instead: its
batches byte for byte with ``--preset raw``.

LitData's own iteration order, shuffling, per-rank split and
``state_dict`` are not used: its mid-epoch resume has known gaps (LitData issues #775, the loader state not restored
through the Trainer, and #770, resume disabled after an external ``load_state_dict`` when an epoch breaks early),
while the project's :class:`~impulsevit.data.loading.position.LoaderPosition` in every checkpoint already says which
batch comes next — so resume is exact by construction (the draws depend on no worker:
``tests/e2e/test_exact_resume.py``).

The cost of the global order: it touches chunks at random, so each rank downloads a chunk as often
as the cache evicts it before its samples are all read; with a cache at least the size of the shard set (the default
``cache_size`` of 200 GB holds ImageNet-1k at ``short256``) each chunk is fetched once per node. ``docs/data.md``
gives the numbers. The loader workers of a rank share its cache folder, so one may evict a chunk another
is about to read; such a read (a chunk file missing from the cache) opens a fresh reader and fetches the chunk again,
once — a second miss is one line saying ``cache_size`` is too small, never an "unreachable store".

Checks before any work (:meth:`LitDataBackend.check_given`, at construction): the manifests of both splits are read
(a missing bucket, missing credentials, an unreachable endpoint: one line, exit 2), compared with the run as the
``.beton`` manifests are (dataset, class count, explicit preset, statistics, subset, the two class lists), and every
shard's size with the manifest's (a truncated or interrupted upload: one line). A read that fails during training
(the store went away) stops the run with one line (:class:`~impulsevit.errors.DataError`); the last checkpoint stays,
and ``--resume auto`` continues from it once the store is back.

``resample_on='device'``: the training threads (or workers) decode and copy each crop box onto a canvas sized by the
manifest's ``max_size``, and the training device resamples it (:class:`CropPlan`), as on the ffcv backend; only on the
fast path without transforms after the crop. Not supported: ``download``, ``.beton`` files
(``data.storage.train_beton``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from impulsevit.data.loading.backends import DataSpec
from impulsevit.data.loading.position import LoaderPosition
from impulsevit.data.loading.sampling import SampleKey, sample_seed
from impulsevit.data.loading.torchvision_backend import SourceDataset, TorchvisionBackend, seeded_global_rngs
from impulsevit.data.sources.image_source import ImageSource
from impulsevit.data.sources.registry import get_dataset
from impulsevit.data.storage import objstore
from impulsevit.data.storage.convert import subset_indices
from impulsevit.data.storage.manifest import identity_mismatches
from impulsevit.data.storage.shards import (
    LABELS_NAME,
    MANIFEST_NAME,
    check_shard_files,
    decode_image,
    read_shards_manifest,
)
from impulsevit.errors import ConfigError, DataError, StoreError

__all__ = ["CropPlan", "LitDataBackend", "ShardDataset", "ShardSource", "channels_last_batch", "chunk_client",
           "crop_plans", "holds_in_memory", "ranks_on_this_node", "shard_location", "shards_manifest"]


def chunk_client(read_timeout: float) -> Any:
    """The S3 client of a process's chunk downloads (:func:`~impulsevit.data.storage.objstore.s3_client` from the
    environment as it is now): ``read_timeout`` seconds of waiting for data, response checksums not validated (each
    chunk's size is checked against ``index.json`` instead; ``docs/data.md``)."""
    return objstore.s3_client(read_timeout, validate_checksums=False)


def shard_location(spec: DataSpec, split: str) -> str:
    """The shard set of ``split``: ``<root>/<split>`` (a folder or a URL prefix)."""
    return objstore.join(str(spec.root), split)


def shards_manifest(location: str) -> dict:
    """The manifest of the shard set at ``location``.

    Raises:
        StoreError: the store cannot be read. ConfigError: no complete shard set there."""
    manifest = read_shards_manifest(location)
    if manifest is None:
        raise ConfigError(f"data.root: no shard set at {location} (expected {objstore.join(location, MANIFEST_NAME)}, "
                          f"written by `impulsevit convert ... --format litdata`)")
    return manifest


@dataclasses.dataclass
class _Download:
    """A chunk download in flight (:meth:`ShardSource._hold`): set ``done`` once ``data`` or ``error`` is known."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    data: bytes | None = None
    error: BaseException | None = None


class ShardSource(ImageSource):
    """Samples ``indices`` of the shard set at ``location``, read through ``litdata.StreamingDataset`` (created on
    first use in each process, so a source pickled into ``DataLoader`` workers opens its own).

    ``classes`` / ``labels`` come from the manifest and ``labels.npy`` (no chunk is read for them). A remote set's
    chunks are fetched whole (one GET each, ``read_timeout`` seconds of waiting for data at most) into ``cache_dir``
    under a per-chunk file lock, so the processes of a node download a chunk once, and read there by LitData as a
    local set. Under the block order (:meth:`follow`) each process prefetches the next block's chunks in a background
    thread while the current block decodes, and deletes the chunks it fetched once they leave the three live blocks
    (previous, current, next); ``cache_size`` is then not LitData's eviction budget but what those blocks must fit
    in (``docs/data.md``). With :attr:`in_memory` (the threaded loader's default, :func:`holds_in_memory`) those
    chunks are held in this process's memory instead of files: the loader threads are the only readers, and a cache
    file costs a write, a mapping and a deletion per chunk, 0.4 ms of CPU per MB here, as much as the download."""

    def __init__(self, location: str, classes: Sequence[str], labels: np.ndarray, indices: np.ndarray,
                 cache_dir: Path | None, cache_size: str, read_timeout: float) -> None:
        self.location, self.classes, self.indices = location, list(classes), np.asarray(indices, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)[self.indices]
        self.cache_dir, self.cache_size, self.read_timeout = cache_dir, cache_size, read_timeout
        self.problems = []
        self._all_labels = np.asarray(labels, dtype=np.int64)
        self._dataset: Any = None
        self._chunks: list[dict] | None = None  # index.json's chunk entries (filename, chunk_size)
        self._ends: np.ndarray | None = None
        # (seed, world size, block size, lag) of the block order; lag: samples a loader worker may run ahead of another
        self.plan: tuple[int, int, int, int] | None = None
        # concurrent chunk downloads of the block order's prefetch in this process: 2 per loader worker process, and
        # 2 per thread of the threaded loader (which sets it), so both paths keep as many requests in flight
        self.prefetch_streams = 2
        # the block order's remote chunks held in this process's memory rather than in cache files (stream_blocks)
        self.in_memory = False
        self.peak_held_bytes = 0  # the most chunk bytes this process held in memory at once
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        self._fetched: set[int] = set()  # chunks this process downloaded and has not deleted
        self._live: tuple[int, int] | None = None  # (epoch, block) whose chunks are live in this process
        self._live_chunks: frozenset[int] = frozenset()  # those chunks: the window a queued prefetch must still be in
        self._orders: dict[int, np.ndarray] = {}
        self._crossing: frozenset[int] = frozenset()  # chunks of this rank's share that another rank also reads
        self._pool: Any = None
        self._client: Any = None
        # chunk -> its image column (``_compat.litdata.chunk_column`` over a memory map of the file; None: no Arrow
        # footer, read through LitData), least recently used first
        self._columns: OrderedDict[int, list | None] = OrderedDict()
        # the loader threads of one process share the source: the column cache, the prefetch window's bookkeeping
        # and LitData's reader are used under this lock (the reads and decodes themselves run outside it)
        self._lock = threading.RLock()
        self._held: dict[int, bytes] = {}  # in_memory: chunk -> its content (the live blocks' chunks)
        self._pending: dict[int, _Download] = {}  # in_memory: downloads in flight, which a second reader waits on

    def __getstate__(self) -> dict:
        state = {**self.__dict__, "_dataset": None, "_pool": None, "_client": None}
        state.update(_fetched=set(), _live=None, _orders={}, _columns=OrderedDict(), _held={}, _pending={},
                     _crossing=frozenset())
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------------------------------ chunks
    def chunk_table(self) -> list[dict]:
        """LitData's chunk entries of the set (``index.json``: ``filename``, ``chunk_size`` samples, ``chunk_bytes``
        the file's size where the index gives it), in sample order.

        Raises:
            DataError: the store cannot be read."""
        if self._chunks is None:
            import json

            try:
                data = objstore.read_bytes(objstore.join(self.location, "index.json"), self.read_timeout)
            except StoreError as exc:
                raise DataError(str(exc)) from exc
            if data is None:
                raise DataError(f"shard set {self.location}: index.json is missing (an interrupted upload); rewrite "
                                f"it with `impulsevit convert ... --format litdata --force`")
            self._chunks = [{"filename": c["filename"], "chunk_size": int(c["chunk_size"]),
                             "chunk_bytes": int(c["chunk_bytes"]) if c.get("chunk_bytes") is not None else None}
                            for c in json.loads(data)["chunks"]]
        return self._chunks

    def chunk_ends(self) -> np.ndarray:
        """The sample index one past each chunk of the set, ``(chunks,)`` int64."""
        if self._ends is None:
            self._ends = np.cumsum([c["chunk_size"] for c in self.chunk_table()]).astype(np.int64)
        return self._ends

    def chunk_of(self) -> np.ndarray:
        """The chunk holding each of this source's samples, ``(len(self),)`` int64, non-decreasing."""
        return np.searchsorted(self.chunk_ends(), self.indices, side="right").astype(np.int64)

    def chunk_sizes(self) -> np.ndarray:
        """This source's samples per chunk of the set, ``(chunks,)`` int64: the block order's ``chunk_sizes`` (the
        source's samples are in set order, so each chunk's are consecutive)."""
        return np.bincount(self.chunk_of(), minlength=len(self.chunk_table())).astype(np.int64)

    def fetch(self, chunk: int, wanted: Callable[[], bool] | None = None) -> bool:
        """Make chunk ``chunk`` of a remote set readable here: with :attr:`in_memory`, held in this process's memory
        (:meth:`_hold`); else a file of the cache folder (one GET of the whole object, its size checked against
        ``index.json``, written atomically without fsync, under the chunk's lock file: another process of the node
        waits and then finds it there; a file of another size, as a power loss may leave, is fetched again).
        ``wanted``, asked when the chunk is absent: whether it is still to be read (a prefetch queued for a window
        the reader has since left must not download a chunk that was read and deleted). Returns whether this call
        downloaded it.

        Raises:
            DataError: the store cannot be read (one line naming the location and the cause)."""
        if self._in_memory(chunk):
            return self._hold(chunk, wanted)[1]
        from impulsevit.data.locking import file_lock
        from impulsevit.io import atomic_write_bytes

        assert self.cache_dir is not None
        entry = self.chunk_table()[chunk]
        name, size = entry["filename"], entry.get("chunk_bytes")
        path = self.cache_dir / name

        def present() -> bool:  # a cache file is written without fsync: one a power loss cut short is not the chunk
            try:
                found = path.stat().st_size
            except OSError:
                return False
            return size is None or found == size

        if present():
            return False
        with file_lock(self.cache_dir / f".{name}.lock", log=lambda _: None):
            if present() or (wanted is not None and not wanted()):
                return False
            atomic_write_bytes(path, self._download(chunk), durable=False)  # a cache: present() checks what a crash
        self._fetched.add(chunk)  # left
        return True

    def _download(self, chunk: int) -> bytes:
        """Chunk ``chunk``'s object, read with one GET (this process's client, response checksums not validated:
        :func:`~impulsevit.data.storage.objstore.s3_client`) and its size checked against ``index.json``.

        Raises:
            DataError: the store cannot be read, or the object is missing or of another size."""
        entry = self.chunk_table()[chunk]
        name, size = entry["filename"], entry.get("chunk_bytes")
        try:
            if self._client is None:  # one per process (boto3's clients are thread-safe)
                self._client = chunk_client(self.read_timeout)
            data = objstore.read_bytes(objstore.join(self.location, name), self.read_timeout, self._client)
        except StoreError as exc:
            raise DataError(f"{exc} (the last checkpoint is kept: rerun with --resume auto once the store is "
                            f"back)") from exc
        if data is None or (size is not None and len(data) != size):
            what = "is missing" if data is None else f"is {len(data)} bytes where index.json says {size}"
            raise DataError(f"shard set {self.location}: chunk {name} {what} (an interrupted upload); "
                            f"rewrite it with `impulsevit convert ... --format litdata --force`")
        return data

    def _hold(self, chunk: int, wanted: Callable[[], bool] | None = None) -> tuple[bytes | None, bool]:
        """:attr:`in_memory`: chunk ``chunk``'s content and whether this call downloaded it. A chunk held already is
        returned as it is; one another thread is downloading is waited for (one GET per chunk in the process); else
        it is downloaded here, unless ``wanted`` says it is no longer to be read (then ``(None, False)``). A download
        is held for the next reads while its chunk is in the live window (:meth:`follow`) or was asked for by a
        reader (``wanted`` None); a prefetch that finishes after its window moved on is dropped.

        Raises:
            DataError: as :meth:`_download` (also in every thread that waited on the failed download)."""
        with self._lock:
            if chunk in self._held:
                return self._held[chunk], False
            if wanted is not None and not wanted():
                return None, False
            pending = self._pending.get(chunk)
            mine = pending is None
            if mine:
                pending = self._pending[chunk] = _Download()
        assert pending is not None
        if not mine:
            pending.done.wait()
            if pending.data is None:
                raise DataError(str(pending.error)) from pending.error
            return pending.data, False
        try:
            pending.data = self._download(chunk)
        except BaseException as exc:
            pending.error = exc
            raise
        finally:
            with self._lock:
                del self._pending[chunk]
                if pending.data is not None and (wanted is None or chunk in self._live_chunks):
                    self._held[chunk] = pending.data
                    self.peak_held_bytes = max(self.peak_held_bytes, sum(len(d) for d in self._held.values()))
            pending.done.set()
        return pending.data, True

    def _open(self) -> Any:
        if self._dataset is None:
            from litdata import StreamingDataset

            from impulsevit._compat.litdata import read_whole_set

            where, kwargs = self.location, {}
            if self._fetches():  # LitData reads the chunks fetched by :meth:`fetch` as a local set
                from impulsevit.io import atomic_write_bytes

                assert self.cache_dir is not None
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                if not (self.cache_dir / "index.json").is_file():
                    import json

                    data = objstore.read_bytes(objstore.join(self.location, "index.json"), self.read_timeout)
                    if data is None:
                        raise DataError(f"shard set {self.location}: index.json is missing")
                    json.loads(data)  # a whole file, not a torn one
                    atomic_write_bytes(self.cache_dir / "index.json", data)
                where = str(self.cache_dir)
            elif objstore.is_remote(self.location):  # the global order: LitData downloads, within cache_size
                from botocore.config import Config

                from impulsevit._compat.litdata import ask_early_for_missing_chunks, quiet_prefetch_crash

                quiet_prefetch_crash()  # a store that stops mid-epoch: the one line below, not LitData's traceback too
                ask_early_for_missing_chunks()  # a small cache: no 30 s wait for a chunk the prefetch never queued
                if objstore.endpoint().startswith("http://"):
                    from impulsevit._compat.litdata import sdk_chunk_downloads

                    sdk_chunk_downloads()

                assert self.cache_dir is not None
                from impulsevit._compat.litdata import clear_stale_cache_state
                from impulsevit.data.locking import claim_folder
                from impulsevit.io import parse_size

                claim_folder(self.cache_dir, clear_stale_cache_state)  # what a killed run left would stall the reads

                kwargs = dict(cache_dir=str(self.cache_dir),
                              max_cache_size=parse_size(self.cache_size, "data.storage.cache_size"),
                              storage_options={"config": Config(connect_timeout=objstore.CONNECT_TIMEOUT_S,
                                                                read_timeout=self.read_timeout,
                                                                retries={"max_attempts": 2, "mode": "standard"})})
            self._dataset = StreamingDataset(where, **kwargs)
            read_whole_set(self._dataset)  # global indices on every rank: the samplers share out the epoch
        return self._dataset

    def stream_blocks(self, seed: int, world_size: int, block_size: int, lag: int, in_memory: bool) -> None:
        """From now on read this (training) source in the block order of (``seed``, ``world_size``, ``block_size``)
        (:func:`~impulsevit.data.loading.sampling.block_sequence`): a remote set's chunks through :meth:`fetch` and
        :meth:`follow`, never LitData's downloads. ``lag``: samples one loader worker (or thread) may run ahead of
        another, kept in the live window; ``in_memory``: hold the chunks in this process's memory rather than in
        the cache folder (:func:`holds_in_memory`; only for loader threads, the one process reading them)."""
        self.plan = (seed, world_size, block_size, lag)
        self.in_memory = bool(in_memory)
        self._dataset = None

    def live_window_bytes(self, block_size: int, lag: int) -> int | None:
        """About the most chunk bytes the block order's live window holds in one process: ``2 × block_size + lag``
        samples at the set's mean stored size, plus two chunks for the window's ragged ends; None when
        ``index.json`` gives no chunk sizes (sets of older LitData releases)."""
        table = self.chunk_table()
        if any(c["chunk_bytes"] is None for c in table):
            return None
        total, samples = sum(c["chunk_bytes"] for c in table), sum(c["chunk_size"] for c in table)
        biggest = max(c["chunk_bytes"] for c in table)
        return int((2 * block_size + lag) * total / max(samples, 1)) + 2 * biggest

    def _fetches(self) -> bool:
        """Whether reads go through :meth:`fetch` (a remote set under the block order) rather than LitData's own
        downloads (a remote set under the global order, LitData's cache within ``cache_size``)."""
        return self.plan is not None and self.cache_dir is not None and objstore.is_remote(self.location)

    # ---------------------------------------------------------------------------------------------- prefetch
    def _rank_order(self, epoch: int, rank: int) -> np.ndarray:
        from impulsevit.data.loading.sampling import block_sequence

        key = epoch * 1_000_003 + rank
        if key not in self._orders:
            assert self.plan is not None
            seed, world, block, _ = self.plan
            seq, _ = block_sequence(self.chunk_sizes(), epoch=epoch, seed=seed, world_size=world, block_size=block)
            self._orders = {key: seq[rank::world]}
            owner = self.chunk_of()
            shares = [np.unique(owner[seq[r::world]]) for r in range(world)]
            held_by = np.bincount(np.concatenate(shares), minlength=len(self.chunk_table()))
            self._crossing = frozenset(c for c in shares[rank].tolist() if held_by[c] > 1)
        return self._orders[key]

    def _in_memory(self, chunk: int) -> bool:
        """Whether chunk ``chunk`` is held in memory (:attr:`in_memory`) rather than in a file of the cache folder:
        not a chunk that this epoch's order cuts between this rank and another (each rank would otherwise download
        it; through the folder a node fetches it once), nor any chunk before the order is known here."""
        return self.in_memory and self._live is not None and chunk not in self._crossing

    def follow(self, epoch: int, position: int) -> None:
        """The sample at global ``position`` of ``epoch``'s block order is about to be read (remote sets under the block
        order, :attr:`plan` set): on entering a new block, queue the chunks of this block not yet here and then the next
        block's for download in background threads, and delete the chunks this process fetched that are outside the live
        window — from ``lag`` samples before the current block (another loader worker, or thread, may still be reading
        there) to the end of the next block. Safe to call from several threads (the threaded loader calls it from the
        thread taking a batch, for the batch's keys in order)."""
        if not self._fetches():
            return
        assert self.plan is not None and self.cache_dir is not None
        seed, world, block, lag = self.plan
        rank, i = position % world, position // world
        b = i // block
        if self._live == (epoch, b):
            return
        with self._lock:
            self._follow(epoch, rank, b, block, lag)

    def _follow(self, epoch: int, rank: int, b: int, block: int, lag: int) -> None:
        assert self.cache_dir is not None
        self._live = (epoch, b)
        order, owner = self._rank_order(epoch, rank), self.chunk_of()

        def chunks(lo: int, hi: int) -> list[int]:
            return list(dict.fromkeys(owner[order[max(lo, 0):max(hi, 0)]].tolist()))

        live = frozenset(chunks(b * block - lag, (b + 2) * block))
        self._live_chunks = live  # before the deletions below: a queued prefetch of a chunk outside it is dropped
        for c in [c for c in self._columns if c not in live]:
            del self._columns[c]  # its memory map goes with the last image read from it (disk space freed then)
        for c in [c for c in self._held if c not in live]:
            del self._held[c]  # its memory goes with the last image read from it
        for c in sorted(self._fetched - live):
            with contextlib.suppress(OSError):
                (self.cache_dir / self.chunk_table()[c]["filename"]).unlink()
            self._fetched.discard(c)
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=self.prefetch_streams, thread_name_prefix="impulsevit-prefetch")
        # this block's chunks first (at an epoch's start or a resume none is here yet; the readers would otherwise
        # download them one at a time, each read waiting on its own chunk), then the next block's
        for c in dict.fromkeys(chunks(b * block, (b + 2) * block)):
            if c not in self._fetched and c not in self._held:
                self._pool.submit(self._prefetch, c)

    def _prefetch(self, chunk: int) -> None:
        with contextlib.suppress(DataError, OSError):  # a failed prefetch is retried, and reported, by the read
            self.fetch(chunk, wanted=lambda: chunk in self._live_chunks)

    MAPPED_CHUNKS: ClassVar[int] = 64
    """Chunks whose memory maps a process keeps open (least recently read closed first; under the block order,
    also those that left the live blocks)."""

    def _column(self, chunk: int) -> list | None:
        """Chunk ``chunk``'s image column (:func:`impulsevit._compat.litdata.chunk_column`) from its file (the set's
        folder, or the cache folder where :meth:`fetch` put it); None where LitData must read it (a remote set under
        the global order, whose chunks LitData downloads and evicts itself, or a chunk without an Arrow footer)."""
        with self._lock:
            return self._open_column(chunk)

    def _open_column(self, chunk: int) -> list | None:
        if chunk in self._columns:
            self._columns.move_to_end(chunk)
            return self._columns[chunk]
        if self._fetches():
            assert self.cache_dir is not None
            folder = self.cache_dir
        elif not objstore.is_remote(self.location):
            folder = Path(self.location)
        else:
            return None
        import mmap

        from impulsevit._compat.litdata import chunk_column

        with open(folder / self.chunk_table()[chunk]["filename"], "rb") as f:  # a missing file: FileNotFoundError
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        return self._remember(chunk, chunk_column(view, "image"))

    def _remember(self, chunk: int, column: list | None) -> list | None:
        """Keep ``column`` as chunk ``chunk``'s (most recently used; the least recently used beyond
        :attr:`MAPPED_CHUNKS` let go) and return it. Called under the lock."""
        self._columns[chunk] = column
        while len(self._columns) > self.MAPPED_CHUNKS:
            self._columns.popitem(last=False)
        return column

    def _held_column(self, chunk: int) -> list | None:
        """:attr:`in_memory`: chunk ``chunk``'s image column over its content in memory, the chunk fetched first
        when it is not held (outside the lock: the other threads read on meanwhile). A chunk without an Arrow footer
        is written to the cache folder and read through LitData (None)."""
        with self._lock:
            if chunk in self._columns:
                self._columns.move_to_end(chunk)
                return self._columns[chunk]
        data, _ = self._hold(chunk)
        assert data is not None
        from impulsevit._compat.litdata import chunk_column

        column = chunk_column(memoryview(data), "image")
        if column is None:
            from impulsevit.io import atomic_write_bytes

            assert self.cache_dir is not None
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.cache_dir / self.chunk_table()[chunk]["filename"], data, durable=False)
            with self._lock:
                self._fetched.add(chunk)  # deleted as the files of the block order are
        with self._lock:
            return self._remember(chunk, column)

    def stored(self, index: int) -> memoryview:
        """Sample ``index``'s stored bytes (:func:`~impulsevit.data.storage.shards.encode_image`'s framing): a view
        of the chunk file's memory map where the chunk is a local file with an Arrow footer (no LitData item
        lookup, no copy), else LitData's read of the item.

        Raises:
            DataError: the store cannot be read (one line naming the location and the cause)."""
        j = int(self.indices[index])
        for attempt in (0, 1):
            try:
                chunk = int(np.searchsorted(self.chunk_ends(), j, side="right"))
                if self._fetches() and self._in_memory(chunk):
                    column = self._held_column(chunk)
                else:
                    if self._fetches() and self._columns.get(chunk) is None:  # a mapped chunk stays readable: no stat
                        self.fetch(chunk)
                    column = self._column(chunk)
                if column is not None:
                    k = j - (int(self.chunk_ends()[chunk - 1]) if chunk else 0)
                    for first, offsets, values in reversed(column):
                        if k >= first:
                            return memoryview(values[int(offsets[k - first]):int(offsets[k - first + 1])])
                # a slice, not dataset[j]: a slice reads through the chunk file (LitData's ``on_demand_bytes``
                # would read an int index's bytes alone)
                with self._lock:  # LitData's reader is not shared between threads
                    return memoryview(self._open()[j:j + 1][0]["image"])
            except DataError:
                raise
            except Exception as exc:  # noqa: BLE001 - LitData / botocore / obstore errors share no base class
                if attempt == 0 and self._evicted(exc):
                    with self._lock:
                        self._dataset = None  # the chunk was deleted by another process: fetch it again
                    continue
                if self._evicted(exc):
                    raise DataError(f"reading {self.location}: a chunk was evicted from the cache {self.cache_dir} "
                                    f"before it was read, twice (data.storage.cache_size={self.cache_size} is too "
                                    f"small for the loader workers sharing it; raise it)") from exc
                if self._stalled_with_the_store_up(exc):
                    raise DataError(f"reading {self.location}: LitData's download of a chunk stalled while the store "
                                    f"answers (under data.order=global a data.storage.cache_size={self.cache_size} "
                                    f"below the set's size can do this: raise it to the set's size, or convert the "
                                    f"set --shuffle and read it in the block order; the last checkpoint is kept: "
                                    f"rerun with --resume auto)") from exc
                raise DataError(objstore.store_error(exc, self.location, "reading").args[0]
                                + " (the last checkpoint is kept: rerun with --resume auto once the store is back)") \
                    from exc
        raise AssertionError("unreachable")

    def _stalled_with_the_store_up(self, exc: BaseException) -> bool:
        """Whether ``exc`` is LitData giving up waiting for a chunk of a remote set (its ``ChunkWaitTimeoutError``)
        while the store still answers (``index.json`` read again, within ``read_timeout``): a stalled download, not
        an outage, so not reported as one."""
        waited = any(type(seen).__name__ == "ChunkWaitTimeoutError" for seen in _causes(exc))
        if not waited or not objstore.is_remote(self.location):
            return False
        try:
            return objstore.read_bytes(objstore.join(self.location, "index.json"), self.read_timeout) is not None
        except StoreError:
            return False

    def load(self, index: int, max_side: int | None = None) -> np.ndarray:
        """Sample ``index`` decoded (:func:`~impulsevit.data.storage.shards.decode_image`), ``(H, W, 3)`` uint8,
        read-only.

        Raises:
            DataError: the store cannot be read (one line naming the location and the cause)."""
        return decode_image(self.stored(index))

    def _evicted(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a chunk missing from this source's cache folder: another reader sharing the folder (a
        loader worker of this rank) evicted it to keep within ``cache_size`` — not a store that cannot be reached."""
        for seen in _causes(exc):
            if (isinstance(seen, FileNotFoundError) and self.cache_dir is not None and seen.filename is not None
                    and Path(str(seen.filename)).resolve().is_relative_to(self.cache_dir.resolve())):
                return True
            if type(seen).__name__ == "ChunkWaitTimeoutError" and self._fetches():  # LitData waited for a chunk
                return True  # file that another process deleted (a local set to LitData: nothing downloads it)
        return False

    def describe(self, index: int) -> str:
        return f"{self.location}[{int(self.indices[index])}]"

    def subset(self, indices: Sequence[int] | np.ndarray) -> ShardSource:
        return ShardSource(self.location, self.classes, self._all_labels, self.indices[np.asarray(indices)],
                           self.cache_dir, self.cache_size, self.read_timeout)  # the plan is the loader's to set

    def image_size(self, index: int) -> tuple[int, int]:
        return tuple(self.load(index).shape[:2])  # type: ignore[return-value]


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, innermost last."""
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


class CropPlan:
    """The fast path's transform of a decoded image into the ``(S, S, 3)`` uint8 the model gets, compiled by numba
    (:mod:`impulsevit.data.loading.resample`): for training, the FFCV decoder's draws and resample
    (:func:`~impulsevit.data.loading.resample.train_crop`: ``RandomResizedCrop(S, scale, ratio)`` geometry and a
    flip with probability ``flip_prob``, from the key (seed, epoch, 0, stored sample index, occurrence), occurrence 0
    — or, with repeated augmentation, 1 + the sample's global position, so the copies of an image draw
    differently); for evaluation, timm's ``Resize(floor(S / crop_pct))`` + ``CenterCrop(S)``. ``rest``: the timm
    transforms that follow the crop and flip (RandAugment, colour jitter), applied by PIL to the crop under the
    torchvision backend's seeded RNGs, or None. ``canvas`` (training without ``rest`` only; ``data.resample_on:
    device``): the side ``K`` of the canvas each sample becomes instead, ``(K + 1, K, 3)``: the same draws, the crop
    box copied unresampled with its size and flip packed in row ``K``
    (:func:`~impulsevit.data.loading.resample.train_canvas`), resampled on the training device into the same pixels
    (:func:`~impulsevit.data.loading.device_resample.resample_canvas`)."""

    def __init__(self, size: int, *, train: bool, interpolation: str, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_prob: float = 0.5, crop_pct: float = 0.875,
                 seed: int = 0, repeated: bool = False, rest: Any = None, canvas: int | None = None) -> None:
        from impulsevit.data.loading.filters import FILTERS

        if canvas is not None and (not train or rest is not None):
            raise ValueError("a canvas plan is for training crops without `rest` transforms")
        self.canvas = None if canvas is None else int(canvas)
        self.size, self.train, self.kind = int(size), bool(train), FILTERS[interpolation]
        self.scale = (float(scale[0]), float(scale[1]))
        self.log_ratio = (float(np.log(ratio[0])), float(np.log(ratio[1])))
        self.flip_prob, self.crop_pct, self.seed = float(flip_prob), float(crop_pct), int(seed)
        self.repeated, self.rest = bool(repeated), rest

    @property
    def shape(self) -> tuple[int, int, int]:
        """One output sample's shape: ``(S, S, 3)``, or ``(K + 1, K, 3)`` for a canvas plan."""
        return (self.size, self.size, 3) if self.canvas is None else (self.canvas + 1, self.canvas, 3)

    def __call__(self, pixels: np.ndarray, index: int, epoch: int = 0, position: int = 0,
                 out: np.ndarray | None = None) -> np.ndarray:
        """``pixels`` ``(H, W, 3)`` uint8 (C-contiguous) of stored sample ``index`` → :attr:`shape` uint8 (``(S, S,
        3)``, or the canvas), written into ``out`` when given (C-contiguous, e.g. one image of a batch buffer) and
        returned. The compiled kernels release the GIL."""
        from impulsevit.data.loading import resample as rs

        if out is None:
            out = np.empty(self.shape, dtype=np.uint8)
        if pixels.flags.writeable:  # one compiled variant of the kernels: read-only sources (the stored raw images)
            pixels = pixels.view()
            pixels.flags.writeable = False
        if self.canvas is not None:
            rs.train_canvas(pixels, self.seed, int(epoch), 0, int(index), int(position) + 1 if self.repeated else 0,
                            self.scale[0], self.scale[1], self.log_ratio[0], self.log_ratio[1], self.flip_prob, out)
        elif self.train:
            rs.train_crop(pixels, self.seed, int(epoch), 0, int(index), int(position) + 1 if self.repeated else 0,
                          self.scale[0], self.scale[1], self.log_ratio[0], self.log_ratio[1], self.flip_prob,
                          self.kind, out)
        else:
            rs.resize_short_crop_center(pixels, pixels.shape[0], pixels.shape[1], self.crop_pct, out, self.kind)
        return out


def crop_plans(spec: DataSpec, train_tf: Any,
               max_size: Sequence[int] | None = None) -> tuple[CropPlan | None, CropPlan | None]:
    """The fast path's ``(train, eval)`` plans for ``spec`` (``train_tf``: timm's train transform of it,
    :func:`~impulsevit.data.loading.torchvision_backend.timm_transforms`), each None where it does not apply:
    numba not importable (the ``litdata`` extra installs it), an interpolation other than ``bicubic`` /
    ``bilinear``, or a train transform that does not start with timm's random resized crop and (optional)
    horizontal flip and end with its tensor conversion (then PIL runs timm's transforms, with their own draws).
    With ``spec.resample_on == 'device'`` the train plan makes canvases sized for ``max_size`` (the training set's
    largest stored ``(height, width)``).

    Raises:
        ConfigError: ``resample_on='device'`` where the training crop is not the fast path's (one line saying why)."""
    from timm.data.transforms import MaybePILToTensor, RandomResizedCropAndInterpolation
    from torchvision.transforms import Compose, RandomHorizontalFlip

    from impulsevit.data.loading.filters import FILTERS

    device = spec.resample_on == "device"

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"data.resample_on='device' on the litdata backend resamples the fast path's random "
                           f"resized crop on the device, and {why}; use data.resample_on=workers")

    try:
        import impulsevit.data.loading.resample  # noqa: F401 - numba
    except ImportError:
        if device:
            raise refuse("numba is not installed (pip install 'impulsevit[litdata]')") from None
        return None, None
    if spec.interpolation not in FILTERS:
        if device:
            raise refuse(f"data.interpolation={spec.interpolation!r} is not bicubic or bilinear")
        return None, None
    evaluate = CropPlan(spec.image_size, train=False, interpolation=spec.interpolation, crop_pct=spec.crop_pct)
    aug = spec.augment
    steps = list(train_tf.transforms) if isinstance(train_tf, Compose) else []
    head = 2 if aug.hflip > 0 else 1
    if (len(steps) < head + 1 or type(steps[0]) is not RandomResizedCropAndInterpolation
            or isinstance(steps[0].interpolation, (tuple, list))
            or (aug.hflip > 0 and type(steps[1]) is not RandomHorizontalFlip)
            or type(steps[-1]) is not MaybePILToTensor):
        if device:
            raise refuse("this recipe's training transform is not timm's crop and flip")
        return None, evaluate
    middle = steps[head:-1]
    canvas = None
    if device:
        from impulsevit.data.loading.device_resample import canvas_side

        if middle:
            raise refuse("this recipe's transforms after the crop (RandAugment, colour jitter) run on the crop in "
                         "the workers (the ffcv backend runs them on the device)")
        if max_size is None:
            raise refuse("the training shard set's manifest has no max_size (written by an older impulsevit: "
                         "rewrite it with `impulsevit convert ... --format litdata --force`)")
        canvas = canvas_side(np.array([max_size[0]]), np.array([max_size[1]]), tuple(aug.ratio))
    train = CropPlan(spec.image_size, train=True, interpolation=spec.interpolation, scale=tuple(aug.scale),
                     ratio=tuple(aug.ratio), flip_prob=aug.hflip, seed=spec.seed, repeated=aug.repeated_aug > 1,
                     rest=Compose([*middle, steps[-1]]) if middle else None, canvas=canvas)
    return train, evaluate


def channels_last_batch(samples: list[tuple[Any, int]]) -> tuple[Any, Any]:
    """``DataLoader``'s default collation of ``(uint8 (S, S, 3) tensor, label)`` samples (in a worker, into shared
    memory), the images then viewed as ``(B, 3, S, S)`` (channels-last strides)."""
    from torch.utils.data import default_collate

    images, labels = default_collate(samples)
    return images.permute(0, 3, 1, 2), labels


class ShardDataset(SourceDataset):
    """A :class:`~impulsevit.data.loading.torchvision_backend.SourceDataset` over a :class:`ShardSource` that,
    given a :class:`CropPlan`, decodes and crops with it: ``(uint8 (S, S, 3) tensor, label)`` collated by
    :attr:`collate_fn` (:func:`channels_last_batch`) into the ``(B, 3, S, S)`` batches of the other paths, or
    ``(uint8 (3, S, S) tensor, label)`` where the plan has timm transforms to run after the crop; without a plan,
    the torchvision backend's PIL transforms."""

    def __init__(self, source: ShardSource, transform: Any, seed: int = 0, plan: CropPlan | None = None) -> None:
        super().__init__(source, transform, seed)
        self.plan = plan
        # the plan's samples are (S, S, 3) HWC tensors: stacked as they are and handed on as a channels-last
        # (B, 3, S, S) view, as the FFCV loader's batches (a CHW sample would cost a transposing copy each)
        self.collate_fn = channels_last_batch if plan is not None and plan.rest is None else None

    def fill(self, key: SampleKey, out: np.ndarray) -> int:
        """Decode and crop the training sample ``key`` into ``out`` (the plan's :attr:`CropPlan.shape` uint8,
        C-contiguous: an image of a batch buffer) as :meth:`__getitem__` does, and return its label. Not supported:
        a plan with ``rest`` transforms, no plan. The caller hands ``key`` to :meth:`ShardSource.follow` first (in
        order)."""
        assert self.plan is not None and self.plan.rest is None
        i, pixels = self._readable(key.index)
        self.plan(pixels, int(self.source.indices[i]), key.epoch, key.position, out=out)
        return int(self.source.labels[i])

    def __getitem__(self, key: int | SampleKey):  # noqa: ANN204
        if self.plan is None:
            return super().__getitem__(key)
        import torch

        sample = isinstance(key, SampleKey)
        if sample:
            self.source.follow(key.epoch, key.position)
        i, pixels = self._readable(key.index if sample else int(key))
        label = int(self.source.labels[i])
        out = self.plan(pixels, int(self.source.indices[i]), *((key.epoch, key.position) if sample else ()))
        if self.plan.rest is None:
            return torch.from_numpy(out), label
        from PIL import Image

        with seeded_global_rngs(sample_seed(self.seed, key.epoch, key.position)) if sample \
                else contextlib.nullcontext():
            return self.plan.rest(Image.fromarray(out)), label


def auto_order(manifest: dict) -> str:
    """``data.order='auto'`` for the training shard set of ``manifest``: ``block`` where it was written shuffled
    (``convert --shuffle``: a seeded permutation, so a block of chunks already holds a mix of the set, and the
    paired study in docs/results.md finds no loss against ``global``), else ``global`` (a set in the source's order,
    often class order, would train near chance under ``block``)."""
    return "block" if (manifest.get("request") or {}).get("shuffle_seed") is not None else "global"


def warn_unmixed(source: ShardSource, block_size: int, batch_size: int, where: str) -> None:
    """One warning line (rank 0) when the block order would see far fewer labels per batch than the global order
    (:func:`~impulsevit.data.loading.sampling.block_mixing` below 0.8 of it): a set stored in class order, which the
    block order trains on a few classes at a time — measured to train near chance (docs/results.md)."""
    from lightning.pytorch.utilities import rank_zero_warn

    from impulsevit.data.loading.sampling import block_mixing

    block, shuffled = block_mixing(source.labels, source.chunk_sizes(), block_size=block_size,
                                   batch_size=batch_size)
    if block < 0.8 * shuffled:
        rank_zero_warn(f"data.order=block on shard set {where}: a batch holds {block:.1f} distinct labels against "
                       f"{shuffled:.1f} under the global order (the set is stored in class order), and a model "
                       f"trained a few classes at a time forgets the rest; rewrite the set with `impulsevit convert "
                       f"... --format litdata --shuffle`, or use data.order=global")


def holds_in_memory(source: ShardSource, block_size: int, lag: int, *, threads: bool, setting: bool | None,
                    ranks_here: int) -> bool:
    """Whether the block order holds a remote set's chunks in the training process's memory
    (:attr:`ShardSource.in_memory`) rather than in cache files: never for a local set (read in place) or for
    ``DataLoader`` worker processes (``threads`` False: the workers share the cache folder, so a node fetches each
    chunk once); ``setting`` (``data.storage.in_memory``) where given; else when the live windows of the node's
    ``ranks_here`` processes (:meth:`ShardSource.live_window_bytes`) fit in half the memory now available."""
    if not threads or not objstore.is_remote(source.location):
        return False
    if setting is not None:
        return bool(setting)
    window = source.live_window_bytes(block_size, lag)
    if window is None:
        return False
    import psutil

    return window * max(ranks_here, 1) < 0.5 * psutil.virtual_memory().available


def ranks_on_this_node(world_size: int) -> int:
    """The training processes of this node: ``LOCAL_WORLD_SIZE`` (torchrun), else ``SLURM_NTASKS_PER_NODE``, else
    ``world_size`` (every rank counted here: an over-estimate on several nodes, which only errs towards files)."""
    import os

    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return world_size


class LitDataBackend(TorchvisionBackend):
    """:class:`~impulsevit.data.loading.backends.Backend` over LitData shard sets (module docstring)."""

    name: ClassVar = "litdata"
    augments_on_device: ClassVar = False

    def __init__(self, spec: DataSpec) -> None:
        super().__init__(spec)
        self._manifests: dict[str, dict] = {}

    def setup(self, stage: str | None, known_classes: list[str] | None) -> list[str] | None:
        """The torchvision backend's datasets, as :class:`ShardDataset` with the fast path's plans
        (:func:`crop_plans`) where they apply."""
        from impulsevit.data.loading.torchvision_backend import timm_transforms

        classes = super().setup(stage, known_classes)
        largest = self.manifest(self.spec.train_split).get("max_size") if self.spec.resample_on == "device" else None
        plans = dict(zip(("train", "val"), crop_plans(self.spec, timm_transforms(self.spec)[0], largest)))
        for name, ds in self.sets.items():
            assert isinstance(ds.source, ShardSource)
            self.sets[name] = ShardDataset(ds.source, ds.transform, ds.seed, plans[name])
        return classes

    def location(self, split: str) -> str:
        """The shard set of ``split`` (:func:`shard_location`)."""
        return shard_location(self.spec, split)

    def manifest(self, split: str) -> dict:
        """The manifest of ``split``'s shard set, read once (:func:`shards_manifest`)."""
        if split not in self._manifests:
            self._manifests[split] = shards_manifest(self.location(split))
        return self._manifests[split]

    def cache_folder(self, split: str) -> Path | None:
        """Where a remote split's chunks are cached: ``cache_dir/<hash of the URL and of the set's manifest>`` (None
        for a local set, read in place). The manifest is part of the name because the cache outlives a run: a set
        rewritten at the same URL (``convert --force``) may keep every chunk's name and size (fixed-size raw samples
        in another ``--shuffle`` order), and a cache keyed by the URL alone would serve the old set's chunks. The old
        set's folder is left as it is (another job may still read it)."""
        import json

        where = self.location(split)
        if not objstore.is_remote(where):
            return None
        identity = json.dumps(self.manifest(split), sort_keys=True)
        return self.spec.cache_dir / hashlib.sha1(f"{where}\0{identity}".encode()).hexdigest()[:16]

    def _indices(self, split: str) -> np.ndarray:
        manifest, k = self.manifest(split), self.spec.subset(split)
        n = int(manifest["num_samples"])
        kept = (manifest.get("request") or {}).get("subset")
        sub = subset_indices(n, k) if k and kept is None else None
        return np.arange(n) if sub is None else sub

    def check_given(self) -> None:
        """Refuse shard sets that contradict the run or are incomplete, before any work (module docstring).

        Raises:
            ConfigError: a contradiction (one line naming each set, the field, its value and the run's), or no shard
                set. StoreError: the store cannot be read, or a shard is missing / of another size."""
        spec = self.spec
        splits = spec.splits()
        problems: dict[str, list[str]] = {}
        fixed = spec.info.num_classes if spec.info.num_classes > 0 and spec.info.tree_classes is None else None
        for split in splits:
            manifest, where = self.manifest(split), self.location(split)
            name = (manifest.get("request") or {}).get("dataset")
            try:
                canonical = get_dataset(str(name)).name if name is not None else None
            except (KeyError, ValueError):
                canonical = name
            found = identity_mismatches(
                {**manifest, "request": {**(manifest.get("request") or {}), "dataset": canonical}},
                dataset=spec.info.name, num_classes=fixed if spec.verify == "error" else None,
                preset=spec.storage.preset, normalization=None if spec.explicit_norm else (spec.mean, spec.std))
            k, kept = spec.subset(split), (manifest.get("request") or {}).get("subset")
            if k and kept is not None and kept != k:
                key = "train_subset" if split == spec.train_split else "val_subset"
                found.append(f"was converted with --subset {kept} but the run's data.{key} is {k} (the other "
                             f"backends would pick other images): convert without --subset, or with --subset {k}")
            for phrase in found:
                problems.setdefault(phrase, []).append(f"shard set {where}")
        classes = [self.manifest(s).get("classes") for s in splits]
        if len(classes) == 2 and classes[0] and classes[1] and list(classes[0]) != list(classes[1]):
            problems[f"hold different class lists ({len(classes[0])} vs {len(classes[1])} classes): a label would "
                     f"name another class in validation than in training"] = [f"shard set {self.location(s)}"
                                                                              for s in splits]
        if problems:
            hint = (" (set data.dataset to the one the shards were converted from)"
                    if any("data.dataset" in p for p in problems) else "")
            raise ConfigError("; ".join(f"{' and '.join(files)}: {phrase}" for phrase, files in problems.items())
                              + hint)
        for split in splits:
            check_shard_files(self.location(split), self.manifest(split))
        if spec.order == "auto":
            self.spec = dataclasses.replace(spec, order=auto_order(self.manifest(spec.train_split)))

    def open_source(self, split: str) -> ShardSource:
        manifest, where = self.manifest(split), self.location(split)
        data = objstore.read_bytes(objstore.join(where, LABELS_NAME))
        if data is None:
            raise StoreError(f"shard set {where}: {LABELS_NAME} is missing (an interrupted upload); rewrite it with "
                             f"`impulsevit convert ... --format litdata --force`")
        import io

        labels = np.load(io.BytesIO(data), allow_pickle=False)
        return ShardSource(where, manifest["classes"], labels, self._indices(split), self.cache_folder(split),
                           self.spec.storage.cache_size, self.spec.storage.read_timeout)

    def train_loader(self, position: LoaderPosition, batch_size: int, device: Any = None) -> Any:
        """On the fast path without ``rest`` transforms and with ``data.storage.loader='threads'`` (the default):
        a :class:`~impulsevit.data.loading.threaded_loader.ThreadedLoader` of ``num_workers`` threads; else the
        torchvision backend's ``DataLoader`` of worker processes. The same batches and loader state either way."""
        if not self._threaded():
            return super().train_loader(position, batch_size, device)
        ds = self.sets["train"]
        import torch

        from impulsevit.data.loading.threaded_loader import ThreadedLoader

        return ThreadedLoader(ds, sampler=self.train_sampler(position, batch_size), batch_size=batch_size,
                              threads=self.spec.num_workers, pin_memory=torch.cuda.is_available())

    def _threaded(self) -> bool:
        """Whether the training loader is the threaded one (:meth:`train_loader`)."""
        plan = getattr(self.sets["train"], "plan", None)
        return self.spec.storage.loader == "threads" and plan is not None and plan.rest is None

    def order_arguments(self, position: LoaderPosition, batch_size: int) -> dict[str, Any]:
        """The block order's chunk sizes and block size (``data.order='block'``), also handed to the training
        source for its prefetch (:meth:`ShardSource.follow`); none under the global order."""
        if self.spec.order != "block":
            return {}
        source = self.sets["train"].source
        assert isinstance(source, ShardSource)
        block = self.spec.storage.block_size
        # DataLoader's default prefetch_factor: 2 batches per worker; the threaded loader's window is the same
        lag = self.spec.num_workers * 2 * batch_size
        memory = holds_in_memory(source, block, lag, threads=self._threaded(), setting=self.spec.storage.in_memory,
                                 ranks_here=ranks_on_this_node(position.world_size))
        source.stream_blocks(self.spec.seed, position.world_size, block, lag, in_memory=memory)
        warn_unmixed(source, block, batch_size, self.location(self.spec.train_split))
        return {"chunk_sizes": source.chunk_sizes(), "block_size": block}

    def train_samples(self) -> int | None:
        """The training shard set's sample count after ``train_subset`` (from its manifest)."""
        try:
            return len(self._indices(self.spec.train_split))
        except (ConfigError, StoreError):
            return None
