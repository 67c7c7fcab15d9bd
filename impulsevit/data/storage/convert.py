"""Image sources → FFCV ``.beton`` files with a manifest (:func:`convert_split`): the conversion library behind
``impulsevit convert`` (:mod:`impulsevit.data.storage.convert_cli`) and the datamodule's ``prepare_data``. No argparse
here.

Steps per split: list the source (problems found while listing: empty class folders, non-image files, broken links);
decode every image once in parallel workers to find truncated/corrupt/unreadable ones (JPEGs are decoded at 1/8 scale,
which still reads every byte); report every bad input with its path; ``on_error='fail'`` stops there
(:class:`ConversionError`), ``'skip'`` leaves them out. The expected output size is estimated from a sample and
printed; FFCV's writer then writes to ``X.beton.tmp-<host>-<pid>``, which is renamed to ``X.beton`` only when
complete, then the manifest (:mod:`impulsevit.data.storage.manifest`) is written (also temp + rename). An interrupted
run
leaves only a temp file, which the next run removes (when its process is gone); a rerun skips splits whose manifest
matches the request and the source's current file sizes and mtimes (``force=True`` rebuilds). FFCV cannot append to a
``.beton``, so an interrupted split restarts from its beginning. Conversions of one output are serialised across
processes and nodes by a lock file next to it (:mod:`impulsevit.data.locking`).

How images are stored is a :class:`~impulsevit.data.storage.presets.Preset`; :data:`PRESETS`, :class:`Preset`,
:func:`default_preset`, :func:`read_manifest`, :func:`manifest_path` and :func:`beton_num_classes` are re-exported
here from :mod:`impulsevit.data.storage.presets` / :mod:`impulsevit.data.storage.manifest` for existing imports.

Not supported: appending to a ``.beton``; sources other than :class:`~impulsevit.data.sources.image_source.ImageSource`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from impulsevit.data.sources.image_source import (
    ArraySource,
    FileSource,
    ImageSource,
    Problem,
    bad_input_report,
    check_sample,
)
from impulsevit.data.storage.integrity import CHUNK, file_digests
from impulsevit.data.storage.manifest import MANIFEST_FORMAT, beton_num_classes, manifest_path, read_manifest
from impulsevit.data.storage.presets import PRESETS, SMALL_IMAGE_SIDE, Preset, default_preset, storage_preset
from impulsevit.io import atomic_write_json, commit, disk_errors, require_free_space, temp_path, write_error
from impulsevit.procs import die_with_parent, raise_if_stopped

__all__ = ["PRESETS", "ConversionError", "Preset", "ScanResult", "beton_num_classes", "convert_split",
           "default_preset", "estimate_size", "manifest_path", "other_conversion", "read_manifest", "scan_good",
           "scan_source", "source_stat", "subset_indices", "up_to_date"]

OnError = Literal["skip", "fail"]


class ConversionError(RuntimeError):
    """The conversion stopped (bad inputs with ``on_error='fail'``, or an input changed while being written)."""


# ---------------------------------------------------------------------------------------------------------- scanning
@dataclass
class ScanResult:
    """Outcome of checking every sample: ``good`` indices, ``problems`` (listing + decoding), the content checksum,
    per-sample ``sizes`` ``(N, 2)`` (width, height; 0 for bad ones)."""

    good: np.ndarray
    problems: list[Problem]
    checksum: str
    sizes: np.ndarray


CheckedSample = tuple[int, Problem | None, bytes, tuple[int, int]]
"""``(index, problem or None, content digest, (width, height))`` of one decode-checked sample."""


def _check_chunk(source: ImageSource, indices: list[int]) -> list[CheckedSample]:
    return [(i, *check_sample(source, i)) for i in indices]


# The source of the scan pool's worker processes, set in each worker by its initializer and never in the parent.
# Pool tasks can only carry picklable arguments: passing the source with every chunk would pickle it (for a FileSource,
# every path of the split) once per 64 images, whereas the initializer's argument reaches the forked workers without
# pickling. A per-process global is the only state a Pool initializer can leave for its tasks.
_WORKER_SOURCE: ImageSource | None = None


def _worker_init(source: ImageSource, parent: int) -> None:
    global _WORKER_SOURCE
    die_with_parent(parent)  # a scan worker never outlives the conversion (kill -9 included)
    _WORKER_SOURCE = source


def _worker_check(indices: list[int]) -> list[CheckedSample]:
    assert _WORKER_SOURCE is not None, "_worker_check runs only in scan_source's pool"
    return _check_chunk(_WORKER_SOURCE, indices)


def scan_source(source: ImageSource, workers: int = 1, progress: bool = True) -> ScanResult:
    """Decode-check every sample of ``source`` and hash its content: in ``workers`` forked processes when
    ``workers > 1`` and the source has more than 256 samples, else in this process. Array sources are not decoded
    (their content hash is the array's)."""
    n = len(source)
    sizes = np.zeros((n, 2), dtype=np.int64)
    problems = list(source.problems)
    h = hashlib.sha256()
    h.update(json.dumps(source.classes).encode())
    h.update(np.asarray(source.labels, dtype=np.int64).tobytes())
    if isinstance(source, ArraySource):
        h.update(source.checksum().encode())
        if n:
            sizes[:] = (source.images.shape[2], source.images.shape[1])
        return ScanResult(np.arange(n), problems, h.hexdigest(), sizes)
    digests: list[bytes] = [b""] * n
    bad: set[int] = set()
    chunks = [list(range(s, min(n, s + 64))) for s in range(0, n, 64)]
    bar = _progress(n, "check", progress)
    if workers > 1 and n > 256:
        ctx = mp.get_context("fork")
        with ctx.Pool(workers, initializer=_worker_init, initargs=(source, os.getpid())) as pool:
            for res in pool.imap(_worker_check, chunks):
                _collect(res, digests, sizes, bad, problems, bar)
    else:  # in this process: the source is passed explicitly, no module state is touched
        for chunk in chunks:
            _collect(_check_chunk(source, chunk), digests, sizes, bad, problems, bar)
    bar.close()
    for d in digests:
        h.update(d)
    good = np.asarray([i for i in range(n) if i not in bad], dtype=np.int64)
    return ScanResult(good, problems, h.hexdigest(), sizes)


def _collect(res: list[CheckedSample], digests: list[bytes], sizes: np.ndarray, bad: set[int], problems: list[Problem],
             bar) -> None:  # noqa: ANN001 - a tqdm bar
    for i, problem, digest, size in res:
        digests[i] = digest
        sizes[i] = size
        if problem is not None:
            problems.append(problem)
            bad.add(i)
    bar.update(len(res))


def _progress(total: int, desc: str, enabled: bool):  # noqa: ANN202
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=not enabled, file=sys.stderr, leave=False)


def source_stat(source: ImageSource) -> str:
    """A cheap fingerprint: class names, labels and (for files) every path's size and mtime; (arrays) content hash."""
    h = hashlib.sha256()
    h.update(json.dumps(source.classes).encode())
    h.update(np.asarray(source.labels, dtype=np.int64).tobytes())
    if isinstance(source, ArraySource):
        h.update(source.checksum().encode())
    else:
        assert isinstance(source, FileSource)
        for p in source.paths:
            try:
                st = os.stat(p)
                h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            except OSError:
                h.update(f"{p}\0missing\n".encode())
    h.update(json.dumps([str(p) for p in source.problems]).encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------------- writing
def other_conversion(existing: dict | None, preset: Preset, request: dict) -> list[str]:
    """How the conversion recorded by the manifest ``existing`` (a ``.beton``'s or a shard set's; None: nothing written
    yet) differs from the one asked for: ``"KEY: OLD, here NEW"`` per request key (``dataset``, ``root``, ``split``,
    ``subset``) and for the preset's name or fields; empty when it is the same conversion (possibly of an older state
    of the source: :func:`up_to_date` tells). Used by both formats' writers and by ``impulsevit convert``'s output
    claim, which refuses to replace another conversion without ``--overwrite``."""
    if existing is None:
        return []
    old_request = existing.get("request") if isinstance(existing.get("request"), dict) else {}
    diffs = [f"{k}: {old_request.get(k)!r}, here {request.get(k)!r}" for k in sorted({*old_request, *request})
             if old_request.get(k) != request.get(k)]
    old_preset = existing.get("preset")
    if old_preset != asdict(preset):
        name = old_preset.get("name") if isinstance(old_preset, dict) else old_preset
        diffs.append(f"preset: {name!r}, here {preset.name!r}" if name != preset.name else
                     f"preset {preset.name!r}: other fields")
    return diffs


def up_to_date(existing: dict | None, preset: Preset, stat: str, request: dict, force: bool) -> bool:
    """Whether the manifest ``existing`` (None: nothing written yet) already records this conversion: the same preset
    and request (:func:`other_conversion` finds no difference) and source fingerprint (:func:`source_stat`), and
    ``force`` not given."""
    return (not force and existing is not None and not other_conversion(existing, preset, request)
            and existing.get("source_stat") == stat)


def scan_good(source: ImageSource, where: str | os.PathLike, preset: Preset, *, workers: int, progress: bool,
              on_error: OnError, log: Callable[[str], None]) -> tuple[ScanResult, np.ndarray, Preset]:
    """Scan ``source`` before writing ``where``: the bad inputs are logged one per line (``on_error='fail'``: then
    refused), and the preset actually written is chosen from the readable images' sizes.

    Returns:
        ``(scan, good, written)``: the scan, the indices of the readable images, and the preset to write
        (``storage_preset``: raw when every image is small).

    Raises:
        ConversionError: a bad input with ``on_error='fail'``, or no readable image at all."""
    scan = scan_source(source, workers=workers, progress=progress)
    for line in bad_input_report(scan.problems, str(where)):
        log(line)
    if scan.problems:
        if on_error == "fail":
            raise ConversionError(f"{len(scan.problems)} bad input(s) in the source of {where} (first: "
                                  f"{scan.problems[0]}); rerun with --on-error skip to leave them out")
    good = scan.good
    if len(good) == 0:
        raise ConversionError(f"no readable images for {where}")
    written = storage_preset(preset, scan.sizes[good])
    if written is not preset:
        log(f"{where}: every image is at most {SMALL_IMAGE_SIDE} px: stored raw (JPEG would lose detail and save "
            f"little)")
    return scan, good, written


def estimate_size(source: ImageSource, indices: np.ndarray, preset: Preset, sample: int = 48, seed: int = 0) -> int:
    """Expected ``.beton`` size in bytes: encode a random sample of images with ``preset`` and extrapolate."""
    from ffcv.fields.rgb_image import encode_jpeg, resizer

    if len(indices) == 0:
        return 0
    pick = np.random.default_rng(seed).choice(indices, size=min(sample, len(indices)), replace=False)
    total = 0.0
    for i in pick:
        img = resizer(preset.shrink(source.load(int(i), preset.max_resolution)), preset.max_resolution)
        raw = img.nbytes
        if preset.write_mode == "raw":
            total += raw
            continue
        jpg = encode_jpeg(img, preset.jpeg_quality).nbytes
        if preset.write_mode == "jpg":
            total += jpg
        elif preset.write_mode == "proportion":
            total += preset.jpeg_proportion * jpg + (1 - preset.jpeg_proportion) * raw
        else:  # smart: FFCV stores raw unless a threshold is set; treat as raw
            total += raw
    per_image = total / len(pick) + 32  # + per-sample metadata (mode, size, pointer, label)
    return int(per_image * len(indices))


class _WriterDataset:
    """What FFCV's writer indexes: ``(image HxWx3 uint8, label)``. A sample that fails to load here (it changed after
    the check) becomes a 1×1 placeholder and its path is appended to ``error_log`` so the caller can fail the split;
    raising inside FFCV's writer processes would hang its progress loop."""

    def __init__(self, source: ImageSource, preset: Preset, sizes: np.ndarray, error_log: str, fail_log: str = "",
                 ffcv_worker: Callable | None = None) -> None:
        self.source, self.preset, self.sizes, self.error_log = source, preset, sizes, error_log
        self.fail_log, self.ffcv_worker = fail_log, ffcv_worker  # see _guarded_worker
        self.owner = os.getpid()  # the converting process: FFCV's writer processes die with it

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        try:
            w, h = (int(v) for v in self.sizes[i])
            img = self.preset.shrink(self.source.load(i, self.preset.load_hint(w, h) if w and h else None))
        except Exception as exc:  # any decode failure must not escape into FFCV's worker
            with open(self.error_log, "a") as fh:
                fh.write(f"{self.source.describe(i)}\t{type(exc).__name__}: {exc}\n")
            img = np.zeros((1, 1, 3), dtype=np.uint8)
        # FFCV's 'proportion' mode draws np.random.rand() in the encode that follows this call (in this writer
        # process): seeding here makes the JPEG / raw choice a function of the sample index, so two conversions of
        # the same source write the same file whatever the worker count
        np.random.seed(i % 2**32)
        return img, int(self.source.labels[i])


def _guarded_worker(*args: object) -> None:
    """FFCV's writer-process job, made to fail visibly: an exception (a full disk in a page flush, …) is appended to
    the dataset's ``fail_log`` and an empty allocation list is queued, so the parent's wait does not block on it.
    (FFCV itself only prints the traceback; its parent then polls a progress counter forever at 0 % CPU.)"""
    dataset = args[-1]
    assert isinstance(dataset, _WriterDataset) and dataset.ffcv_worker is not None
    die_with_parent(dataset.owner)  # no orphan writer holding the temp file and the lock after a kill -9
    try:
        dataset.ffcv_worker(*args)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        with open(dataset.fail_log, "a") as fh:
            fh.write(f"{getattr(exc, 'errno', None) or ''}\t{type(exc).__name__}: {exc}\n")
        allocator = args[4]
        with allocator.next_page_written.get_lock():  # pass on the page-writing turn this process held, if any
            if allocator.next_page_written.value == allocator.my_page:
                allocator.next_page_written.value += 1
        args[6].put([])  # the allocations queue: the parent reads one entry per worker


def _write_guarded(writer, dataset: _WriterDataset, indices: list[int], out: Path, needed: int) -> None:  # noqa: ANN001
    """``writer.from_indexed_dataset`` that raises within ~0.1 s when a writer process fails (see
    :func:`_guarded_worker`) instead of waiting forever; the failed write's processes and shared memory are freed.
    A full-disk / read-only failure becomes :class:`impulsevit.io.WriteError` naming ``out``.

    FFCV's writer processes call ``ffcv.writer.worker_job_indexed_dataset`` / ``sleep`` by module-global name, so the
    guard replaces those two for the duration of the write (:func:`impulsevit._compat.ffcv.replaced_writer_worker`):
    not supported are two conversions in threads of one process at the same time (separate processes are fine)."""
    import multiprocessing

    import ffcv.writer as fw

    from impulsevit._compat.ffcv import replaced_writer_worker

    dataset.ffcv_worker = fw.worker_job_indexed_dataset
    fail_log = Path(dataset.fail_log)

    class _WorkerFailed(Exception):
        pass

    def sleep_and_check(seconds: float) -> None:
        time.sleep(seconds)
        raise_if_stopped()  # a SIGTERM / SIGINT whose exception a fork hook swallowed (impulsevit.procs)
        if fail_log.exists() and fail_log.stat().st_size:
            raise _WorkerFailed

    def free_shared_memory() -> None:
        sm = getattr(writer, "metadata_sm", None)
        if sm is not None and not isinstance(sm, int):
            with contextlib.suppress(Exception):
                sm.close()
                sm.unlink()

    before = set(multiprocessing.active_children())
    try:
        with replaced_writer_worker(_guarded_worker, sleep_and_check):
            writer.from_indexed_dataset(dataset, indices=indices, chunksize=100)
    except _WorkerFailed:
        pass
    except BaseException:  # a signal (impulsevit.procs.Stopped) or an error here: the write is abandoned
        free_shared_memory()
        raise
    finally:
        for p in set(multiprocessing.active_children()) - before:
            p.terminate()
            p.join(5)
    if fail_log.exists() and fail_log.stat().st_size:
        free_shared_memory()
        code, _, what = fail_log.read_text().splitlines()[0].partition("\t")
        if code.isdigit():
            raise write_error(OSError(int(code), os.strerror(int(code))), out, needed)
        raise ConversionError(f"an FFCV writer process failed while writing {out}: {what}")


def _page_size(sizes: np.ndarray, preset: Preset) -> int:
    from ffcv.writer import MIN_PAGE_SIZE

    biggest = max((int(np.prod(preset.stored_size(int(w), int(h)))) for w, h in sizes), default=0) * 3
    need = max(MIN_PAGE_SIZE, 2 * biggest + 4096)
    return 1 << (need - 1).bit_length()


def _remove_stale_temps(out: Path, log: Callable[[str], None]) -> None:
    host = socket.gethostname()
    for tmp in out.parent.glob(out.name + ".tmp-*"):
        tag = tmp.name[len(out.name) + len(".tmp-"):]
        tmp_host, _, pid = tag.rpartition("-")
        if tmp_host != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        log(f"removing {tmp} left by an interrupted conversion")
        tmp.unlink(missing_ok=True)


def _one_writer(convert: Callable[..., dict]) -> Callable[..., dict]:
    """Serialise conversions of the same output across processes and nodes with the lock file ``<out>.lock``
    (:func:`impulsevit.data.locking.file_lock`): one converts, the others wait and then find it up to date."""
    import functools

    @functools.wraps(convert)
    def locked(source: ImageSource, out: str | os.PathLike, *args, **kwargs) -> dict:  # noqa: ANN002, ANN003
        from impulsevit.data.locking import file_lock

        out = Path(out)
        with file_lock(out.with_name(out.name + ".lock"), what=f"the conversion of {out}",
                       log=kwargs.get("log", print)):
            return convert(source, out, *args, **kwargs)

    return locked


@_one_writer
def convert_split(source: ImageSource, out: str | os.PathLike, preset: Preset, *, workers: int = 1,
                  on_error: OnError = "skip", progress: bool = True, request: dict | None = None, force: bool = False,
                  log: Callable[[str], None] = print, check_free_space: bool = True,
                  normalization: tuple[Sequence[float], Sequence[float]] | None = None) -> dict:
    """Write ``source`` to the ``.beton`` ``out`` (atomically) and its manifest; return the manifest.

    ``request`` is recorded in the manifest and, together with the preset and the source's stat fingerprint, decides
    whether an existing output is up to date (then nothing is written and the old manifest is returned, with
    ``"skipped_existing": True``). Raises :class:`ConversionError` for bad inputs with ``on_error='fail'``, and
    :class:`impulsevit.io.WriteError` (one line: the path, the bytes needed and free) when the filesystem is full,
    read-only or forbidden — before writing when the expected size does not fit (``check_free_space``), else as soon
    as a writer process fails; no temp file is left either way. ``normalization``: the dataset's ``(mean, std)``,
    recorded so that a run normalising differently is refused (not part of the up-to-date check).
    """
    from ffcv.fields import IntField
    from ffcv.writer import DatasetWriter

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out, log)
    request = dict(request or {})
    stat = source_stat(source)
    existing = read_manifest(out)
    if up_to_date(existing, preset, stat, request, force):
        log(f"{out}: up to date ({existing['num_samples']} images), skipped")
        return {**existing, "skipped_existing": True}

    t0 = time.perf_counter()
    requested = preset
    scan, good, preset = scan_good(source, out, preset, workers=workers, progress=progress, on_error=on_error, log=log)
    page_size = _page_size(scan.sizes[good], preset)
    workers = max(1, workers)
    data_bytes = estimate_size(source, good, preset)
    # the header + per-sample metadata region is padded to whole pages, then every writer process fills whole pages of
    # its own, so the file grows in page-sized steps per worker
    header_pages = int(np.ceil((4096 + 64 * len(good)) / page_size))
    expected = (header_pages + int(np.ceil(data_bytes / workers / page_size)) * workers) * page_size
    log(f"{out}: writing {len(good)} images, preset {preset.name} ({preset.write_mode}, max side "
        f"{preset.max_resolution or 'unchanged'}, max short side {preset.max_short_side or 'unchanged'}), "
        f"expected size ~{expected / 2**20:.1f} MiB")

    if check_free_space:
        require_free_space(out, expected)
    tmp = temp_path(out)
    error_log = out.with_name(f"{out.name}.errors-{os.getpid()}")
    fail_log = out.with_name(f"{out.name}.failed-{os.getpid()}")
    for f in (error_log, fail_log):
        f.unlink(missing_ok=True)
    try:
        with disk_errors(out, expected):
            writer = DatasetWriter(str(tmp), {"image": preset.field(), "label": IntField()},
                                   page_size=page_size, num_workers=workers)
            dataset = _WriterDataset(source, preset, scan.sizes, str(error_log), str(fail_log))
            t1 = time.perf_counter()
            with contextlib.redirect_stderr(open(os.devnull, "w")) if not progress else contextlib.nullcontext():
                _write_guarded(writer, dataset, good.tolist(), out, expected)
            write_seconds = time.perf_counter() - t1
        if error_log.exists() and error_log.read_text().strip():
            failed = error_log.read_text().strip().splitlines()
            raise ConversionError(f"{len(failed)} input(s) changed or broke while {out} was written (first: "
                                  f"{failed[0]}); nothing was written, rerun the conversion")
        digests = file_digests(tmp)
        commit(tmp, out)
    finally:
        for f in (tmp, error_log, fail_log):
            f.unlink(missing_ok=True)
    kept = source.labels[good]
    counts = np.bincount(kept, minlength=len(source.classes))
    manifest = {
        "format": MANIFEST_FORMAT,
        "beton": out.name,
        "request": request,
        "num_samples": int(len(good)),
        "num_classes": len(source.classes),
        "classes": list(source.classes),
        "class_counts": {c: int(k) for c, k in zip(source.classes, counts)},
        "preset": asdict(requested),
        "source_checksum": scan.checksum,
        "source_stat": stat,
        "skipped": [asdict(p) for p in scan.problems],
        "bytes": out.stat().st_size,
        "checksum": {"algorithm": "blake2b-128", "chunk_bytes": CHUNK, "chunks": digests},
        "expected_bytes": expected,
        "seconds": round(time.perf_counter() - t0, 3),
        "write_images_per_second": round(len(good) / max(write_seconds, 1e-9), 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if normalization is not None:
        manifest["normalization"] = {"mean": [float(v) for v in normalization[0]],
                                     "std": [float(v) for v in normalization[1]]}
    atomic_write_json(manifest_path(out), manifest)
    log(f"{out}: {manifest['bytes'] / 2**20:.1f} MiB, {len(good)} images in {manifest['seconds']:.1f} s "
        f"({manifest['write_images_per_second']:.0f} img/s written)")
    return manifest


def subset_indices(n: int, k: int | None, seed: int = 0) -> np.ndarray | None:
    """The first ``k`` of a seeded permutation of ``range(n)``, sorted (None when ``k`` is None or ≥ ``n``)."""
    if k is None or k >= n:
        return None
    if k <= 0:
        raise ValueError(f"subset size must be positive, got {k}")
    return np.sort(np.random.default_rng(seed).permutation(n)[:k])

