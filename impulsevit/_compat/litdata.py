"""LitData internals impulsevit uses (see :mod:`impulsevit._compat`). LitData is optional: imported when called."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ask_early_for_missing_chunks", "chunk_column", "clear_stale_cache_state", "quiet_prefetch_crash",
           "read_whole_set", "sdk_chunk_downloads"]

EARLY_FORCE_DOWNLOAD_S = 1
"""Seconds LitData's reader waits for its prefetch thread before it asks that thread for the chunk it needs
(:func:`ask_early_for_missing_chunks`); LitData's own default is 30."""


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


def read_whole_set(dataset: object) -> None:
    """Make ``dataset`` (a ``litdata.StreamingDataset``) index the whole shard set in this process, whatever the
    process group: impulsevit shares out samples itself (one :class:`~impulsevit.data.loading.sampling.EpochSampler`
    per rank) and reads them by global index. LitData sizes a dataset to the calling rank's share when
    ``torch.distributed`` is initialised, so under DDP a read of a global index past that share came back empty
    (``IndexError``: every run of 2 ranks stopped at its first batch).

    Reaches: ``StreamingDataset.distributed_env`` (replaced by a one-process ``litdata.utilities.env._DistributedEnv``)
    Checked on: litdata>=0.2.76,<0.3
    Waits for: a LitData option to index the whole set under a process group (``StreamingDataset(distributed=False)``).
    """
    from litdata.utilities.env import _DistributedEnv

    dataset.distributed_env = _DistributedEnv(world_size=1, global_rank=0, num_nodes=1)  # type: ignore[attr-defined]


def quiet_prefetch_crash() -> None:
    """From now on in this process, a LitData chunk-download thread that dies (the object store stopped answering
    mid-epoch) prints nothing: LitData keeps the exception for the reader, which raises it to
    :class:`~impulsevit.data.loading.litdata_backend.ShardSource`, which names the store in the command's one error
    line. LitData's own report is a multi-line traceback on stderr, printed before that line (``IMPULSEVIT_DEBUG=1``
    keeps it).

    Reaches: ``litdata.streaming.reader.PrepareChunksThread._report_crash`` (method, replaced by a silent one)
    Checked on: litdata>=0.2.76,<0.3
    Waits for: a LitData option (or a logger instead of ``traceback.print_exception``) for the prefetch thread's crash
        report.
    """
    import os

    from litdata.streaming.reader import PrepareChunksThread

    if os.environ.get("IMPULSEVIT_DEBUG", "") not in ("", "0") or getattr(PrepareChunksThread, "_impulsevit_quiet",
                                                                          False):
        return
    PrepareChunksThread._impulsevit_loud = PrepareChunksThread._report_crash  # type: ignore[attr-defined]
    PrepareChunksThread._report_crash = lambda self, exc: None  # type: ignore[method-assign]
    PrepareChunksThread._impulsevit_quiet = True  # type: ignore[attr-defined]


def ask_early_for_missing_chunks() -> None:
    """From now on in this process, LitData's reader asks its download thread for a chunk it is waiting on after
    :data:`EARLY_FORCE_DOWNLOAD_S` instead of 30 s — unless the user set ``FORCE_DOWNLOAD_TIME`` (LitData's own
    variable), which is then kept. With a cache of a few chunks (``data.storage.cache_size``) the thread's prefetch,
    which stops when the cache is full, often has not queued the next chunk the global order needs, and the reader
    sat idle for the whole 30 s before each such chunk (30–40 s per run in the store-outage test with a 3-chunk
    cache, then 1–4 s per batch). The request goes through the download thread's own queue, under its per-chunk lock
    and cache budget, so a chunk is not fetched twice.

    Reaches: ``litdata.streaming.item_loader._FORCE_DOWNLOAD_TIME`` (module global, read on each wait)
    Checked on: litdata>=0.2.76,<0.3
    Waits for: a LitData prefetch that keeps the next chunks of the order queued when the cache is full, or an option
        for the wait.
    """
    import os

    import litdata.streaming.item_loader as item_loader

    if "FORCE_DOWNLOAD_TIME" not in os.environ:
        item_loader._FORCE_DOWNLOAD_TIME = EARLY_FORCE_DOWNLOAD_S


def clear_stale_cache_state(cache_dir: Path) -> int:
    """Delete the cross-process bookkeeping LitData keeps beside the chunks in ``cache_dir`` (recursively): reference
    counts (``*.cnt``), download and count lock files (``*.lock``), the cache's slot budget
    (``.litdata_cache_slots*``) and half-written downloads (``*.tmp.<pid>``). For a folder no live process uses
    (:func:`~impulsevit.data.locking.claim_folder`): a run killed mid-epoch leaves counts that nobody will release,
    so LitData's prefetch skips those chunks and its reader waits ~30 s (``_FORCE_DOWNLOAD_TIME``) for each before
    downloading it itself. Whole chunk files stay (a resume reads them). Returns the number of files deleted.

    Reaches: LitData's cache-folder file names (``<chunk>.cnt``, ``<file>.lock``, ``.litdata_cache_slots``,
        ``<chunk>.tmp.<pid>``), not an API
    Checked on: litdata>=0.2.76,<0.3
    Waits for: a LitData call that resets a cache folder's bookkeeping, or counts that expire with their process.
    """
    import contextlib
    import re

    stale = re.compile(r"(\.cnt|\.lock|\.tmp\.\d+)$|^\.litdata_cache_slots")
    deleted = 0
    for path in sorted(cache_dir.rglob("*")):
        if path.is_file() and stale.search(path.name):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                deleted += 1
    return deleted


def chunk_column(chunk: memoryview, name: str) -> list[tuple[int, object, object]] | None:
    """The binary column ``name`` of a LitData chunk file's content ``chunk`` (a memory map of the file), without
    copying it: ``(first row, offsets, values)`` per Arrow record batch, ``offsets`` a numpy int32 / int64 array of
    ``rows + 1`` byte offsets into ``values`` (numpy uint8, a view of ``chunk``). None when the chunk holds no Arrow
    footer (chunks of older LitData releases, or written compressed or encrypted): read those through
    ``StreamingDataset``.

    Reaches: ``litdata.streaming.item_loader.open_arrow_footer_reader`` (the chunk's trailing Arrow IPC file or
        stream, where LitData >= 0.2.76 keeps the items of a ``PyTreeLoader`` chunk, row ``k`` = the chunk's item
        ``k``)
    Checked on: litdata>=0.2.76,<0.3
    Waits for: a LitData call that returns an item's stored bytes by index without decoding its rows.
    """
    import numpy as np
    import pyarrow as pa
    from litdata.streaming.item_loader import open_arrow_footer_reader

    opened = open_arrow_footer_reader(chunk)
    if opened is None:
        return None
    reader, is_file = opened
    batches = ([reader.get_batch(b) for b in range(reader.num_record_batches)] if is_file
               else reader.read_all().to_batches())
    out, first = [], 0
    for batch in batches:
        column = batch.column(batch.schema.get_field_index(name))
        if column.type not in (pa.binary(), pa.large_binary()) or column.null_count:
            return None
        _, offsets, values = column.buffers()
        wide = column.type == pa.large_binary()
        offsets = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[column.offset:
                                                                               column.offset + len(column) + 1]
        out.append((first, offsets, np.frombuffer(values, dtype=np.uint8) if values is not None else
                    np.zeros(0, np.uint8)))
        first += len(column)
    return out
