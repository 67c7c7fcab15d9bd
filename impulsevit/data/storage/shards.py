"""Image sources → LitData shard sets (``impulsevit convert --format litdata``), locally or in an object store.

Why LitData (``litdata`` on PyPI, Lightning AI's streaming engine): it is maintained by the Lightning team (monthly
releases), installs from wheels, reads chunks from S3 / GCS / Azure / local folders with a local chunk cache whose
size is a setting (``max_cache_size``), and — what the project needs — its ``StreamingDataset`` reads any sample
*by index* (``dataset[i]``), so the project's own resumable orders (:mod:`impulsevit.data.loading.sampling`) drive it
and resume stays exact by construction. Compared in ``docs/data.md``: WebDataset (tar shards read in sequence: no
random access, so no exact global order or exact mid-epoch resume without re-reading) and Hugging Face ``datasets``
(Arrow files, random access, but streaming mode is sequential and the local mode copies the whole set first).

A shard set of one split is a folder (or ``s3://bucket/prefix/<split>``) holding LitData's ``index.json`` and
``chunk-*.bin`` files, ``labels.npy`` (int64 labels in sample order, read without pickle) and
``impulsevit.manifest.json`` (format :data:`SHARDS_MANIFEST_FORMAT`: the beton manifest's fields — ``request``,
``num_samples``, ``classes``, ``class_counts``, ``preset``, ``normalization``, ``source_checksum`` /
``source_stat``, ``skipped`` — plus ``files``, the size of every file, which the reader compares to find a truncated
or replaced upload, and ``max_size``, the largest stored ``[height, width]``, which sizes the canvas of
``data.resample_on: device``). The manifest is written last: a set without one is incomplete.

Each sample is ``{"image": bytes, "label": int}``; ``image`` is :func:`encode_image`'s framing: ``b"R"`` + height,
width (uint16 little-endian) + raw RGB bytes, or ``b"J"`` + a JPEG file. Which one follows the storage preset exactly
as the ``.beton`` does (``raw``: every image raw, so the pixels are the source's; ``proportion``: JPEG with
probability ``jpeg_proportion``, a function of the sample index; ``jpg``: all JPEG). Samples keep the source's order
(bad inputs left out), so sample ``i`` of a set converted without ``--subset`` is image ``i`` of the split and a
run's ``train_subset`` picks the same images as on the other backends — unless the set is written shuffled
(``shuffle_seed``, ``convert --shuffle``): then sample ``i`` is the source's image ``source_index.npy[i]`` (int64,
read without pickle), a seeded permutation recorded in the manifest's ``request``, and a chunk holds a random mix of
classes instead of a run of the source's (class-sorted, for an image folder) order. The ``block`` read order needs
that: it trains on a few chunks at a time (``docs/data.md``).

Writes: chunks go to a local temporary folder through LitData's ``BinaryWriter`` (in this process, in order: its
``optimize`` runs a worker pool that may reorder inputs), then to the destination — a local destination is renamed
into place whole (:func:`impulsevit.io.commit`), a remote one is uploaded file by file with the manifest last. Nothing
else is written to the store: no temporary objects, no lock objects (two converters writing one remote set are not
serialised; locally the lock file of :mod:`impulsevit.data.locking` is).

Not supported: appending to a set; ``smart`` write mode (stored raw, as FFCV does without a threshold).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from impulsevit.data.sources.image_source import ImageSource
from impulsevit.data.storage import objstore
from impulsevit.data.storage.convert import OnError, scan_good, source_stat, up_to_date
from impulsevit.data.storage.presets import Preset
from impulsevit.errors import StoreError
from impulsevit.io import atomic_write_json, commit

__all__ = ["LABELS_NAME", "MANIFEST_NAME", "SHARDS_MANIFEST_FORMAT", "check_shard_files", "decode_image",
           "encode_image", "litdata_available", "read_shards_manifest", "write_order", "write_shards"]

SHARDS_MANIFEST_FORMAT = "impulsevit-shards-manifest/1"
MANIFEST_NAME = "impulsevit.manifest.json"
SOURCE_INDEX_NAME = "source_index.npy"
LABELS_NAME = "labels.npy"
CHUNK_BYTES = "64MB"
"""LitData chunk size: the unit a reader downloads and caches (64 MB: ~600 ImageNet images at ``short256``)."""


def litdata_available() -> bool:
    """Whether the ``litdata`` package is importable."""
    try:
        import litdata  # noqa: F401
    except ImportError:
        return False
    return True


def encode_image(image: np.ndarray, jpeg_quality: int | None) -> bytes:
    """``(H, W, 3)`` uint8 → the stored bytes: raw (``jpeg_quality`` None) or JPEG at that quality (PIL)."""
    if jpeg_quality is None:
        h, w = image.shape[:2]
        return b"R" + np.asarray([h, w], dtype="<u2").tobytes() + np.ascontiguousarray(image).tobytes()
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=int(jpeg_quality))
    return b"J" + buf.getvalue()


def _jpeg_op():  # noqa: ANN202 - torchvision's JPEG decode op, or None
    """The C++ op behind ``torchvision.io.decode_jpeg`` (``torch.ops.image.decode_jpeg(data, mode, exif)``), called
    directly: since torchvision 0.29 the Python wrapper warns of its deprecation at every call. None where this
    torchvision has no such op (then PIL decodes)."""
    try:
        import torch
        import torchvision.io  # noqa: F401 - loads the image extension that registers torch.ops.image

        return torch.ops.image.decode_jpeg
    except (ImportError, AttributeError, RuntimeError):
        return None


_JPEG_OP: list = []  # [op or None], resolved on first use


def decode_image(data: bytes | memoryview) -> np.ndarray:
    """:func:`encode_image`'s bytes → ``(H, W, 3)`` uint8 RGB (read-only when ``data`` is; a raw image is a view of
    ``data``). JPEGs are decoded by libjpeg-turbo through torchvision's ``decode_jpeg``: the pixels of PIL's
    ``Image.open(...).convert("RGB")`` (the same library and settings: accurate integer IDCT, fancy upsampling;
    ``tests/data/loading/test_litdata_backend.py`` compares them), in about 0.6 of PIL's time (PIL's decode and
    ``convert`` copy the image twice more); by PIL where torchvision has no such op.

    Raises:
        ValueError: not bytes of :func:`encode_image` (a corrupt JPEG included)."""
    kind = bytes(data[:1])
    if kind == b"R":
        h, w = (int(v) for v in np.frombuffer(data[1:5], dtype="<u2"))
        pixels = np.frombuffer(data[5:], dtype=np.uint8)
        if pixels.size != h * w * 3:
            raise ValueError(f"raw image of {pixels.size} bytes, expected {h} x {w} x 3")
        return pixels.reshape(h, w, 3)
    if kind == b"J":
        if not _JPEG_OP:
            _JPEG_OP.append(_jpeg_op())
        if _JPEG_OP[0] is None:
            from PIL import Image

            with Image.open(io.BytesIO(data[1:])) as im:
                return np.asarray(im.convert("RGB"), dtype=np.uint8)
        import torch
        from torchvision.io import ImageReadMode

        try:  # a bytearray: torch wants a writable buffer (one copy of the compressed bytes)
            chw = _JPEG_OP[0](torch.frombuffer(bytearray(data[1:]), dtype=torch.uint8), ImageReadMode.RGB.value,
                              False)
        except RuntimeError as exc:  # libjpeg's own message: not a JPEG, truncated, ...
            raise ValueError(f"stored JPEG cannot be decoded: {exc}") from None
        return np.ascontiguousarray(chw.permute(1, 2, 0).numpy())  # the op's CHW is a view of HWC pixels
    raise ValueError(f"unknown stored image kind {kind!r}")


def _stored(source: ImageSource, i: int, preset: Preset, size: tuple[int, int]) -> tuple[bytes, tuple[int, int]]:
    """Source image ``i`` (``size`` ``(width, height)`` from the scan) as stored under ``preset``: its
    :func:`encode_image` bytes and its stored ``(height, width)``."""
    w, h = size
    image = preset.shrink(source.load(i, preset.load_hint(w, h) if w and h else None))
    if preset.max_resolution is not None and max(image.shape[:2]) > preset.max_resolution:
        from PIL import Image

        nw, nh = preset.stored_size(image.shape[1], image.shape[0])
        image = np.asarray(Image.fromarray(image).resize((nw, nh), Image.Resampling.BOX))
    mode = preset.write_mode
    jpeg = mode == "jpg" or (mode == "proportion"
                             and np.random.default_rng([0x5A4D, i]).random() < preset.jpeg_proportion)
    return encode_image(image, preset.jpeg_quality if jpeg else None), (int(image.shape[0]), int(image.shape[1]))


def read_shards_manifest(location: str) -> dict | None:
    """The manifest of the shard set at ``location`` (a folder or ``s3://`` prefix); None when there is none (not a
    complete set written by ``impulsevit convert --format litdata``).

    Raises:
        StoreError: the store cannot be read (:func:`~impulsevit.data.storage.objstore.read_bytes`)."""
    data = objstore.read_bytes(objstore.join(location, MANIFEST_NAME))
    if data is None:
        return None
    try:
        manifest = json.loads(data)
    except ValueError:
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == SHARDS_MANIFEST_FORMAT else None


def write_order(good: np.ndarray, shuffle_seed: int | None) -> np.ndarray:
    """The source indices in the order they are stored: ``good`` (the readable images, ascending) as they are, or
    permuted by a generator seeded with ``shuffle_seed`` (NumPy's PCG64: the same permutation on every machine)."""
    good = np.asarray(good, dtype=np.int64)
    return good if shuffle_seed is None else np.random.default_rng(int(shuffle_seed)).permutation(good)


def _write_local(source: ImageSource, stored: np.ndarray, preset: Preset, sizes: np.ndarray, folder: Path,
                 chunk_bytes: str | int, shuffled: bool) -> tuple[int, int]:
    """Write source images ``stored`` (in that order) as a LitData set into ``folder``; returns the largest stored
    height and width (each over the set)."""
    import warnings

    from litdata.streaming.writer import BinaryWriter

    with warnings.catch_warnings():
        # LitData packs a chunk on its estimate of the on-disk bytes and warns "An item was larger than the target
        # chunk size" whenever a chunk ends more than 10 % over the target, though no item is larger (or when one
        # is: a chunk of that one item, which reads as any other): a line per chunk on every conversion, with
        # nothing to act on; index.json records each chunk's real size
        warnings.filterwarnings("ignore", message="An item was larger than the target chunk size", category=UserWarning)
        writer = BinaryWriter(str(folder), chunk_bytes=chunk_bytes)
        largest = (0, 0)
        for k, i in enumerate(stored.tolist()):
            data, (h, w) = _stored(source, i, preset, (int(sizes[i][0]), int(sizes[i][1])))
            largest = (max(largest[0], h), max(largest[1], w))
            writer.add_item(k, {"image": data, "label": int(source.labels[i])})
        writer.done()
        writer.merge()
    np.save(folder / LABELS_NAME, np.asarray(source.labels[stored], dtype=np.int64), allow_pickle=False)
    if shuffled:
        np.save(folder / SOURCE_INDEX_NAME, stored, allow_pickle=False)
    return largest


def write_shards(source: ImageSource, dst: str, preset: Preset, *, on_error: OnError = "skip",
                 progress: bool = True, request: dict | None = None, force: bool = False,
                 log: Callable[[str], None] = print, chunk_bytes: str | int = CHUNK_BYTES,
                 normalization: tuple[Sequence[float], Sequence[float]] | None = None,
                 shuffle_seed: int | None = None) -> dict:
    """Write ``source`` as a LitData shard set at ``dst`` (a local folder, or ``s3://bucket/prefix``; module
    docstring) and return its manifest. ``chunk_bytes``: LitData's chunk size (bytes, or a string like ``"64MB"``);
    ``shuffle_seed``: store the images in this seed's permutation (:func:`write_order`), recorded in the manifest's
    ``request`` (so a set written in another order is another conversion); None keeps the source's order.

    Up to date (same ``request``, preset and source fingerprint in the manifest at ``dst``, unless ``force``): nothing
    is written, the manifest is returned with ``"skipped_existing": True``.

    Raises:
        StoreError: the bucket is missing, the credentials are missing or refused, the endpoint is unreachable — found
            before the source is scanned. ConversionError: bad inputs with ``on_error='fail'``, no readable image.
        ImportError: litdata is not installed.
    """
    if not litdata_available():
        raise ImportError("--format litdata needs the litdata package (pip install 'impulsevit[litdata]')")
    remote = objstore.is_remote(dst)
    if remote:
        objstore.check_writable(dst)
    request = dict(request or {})
    if shuffle_seed is not None:
        request["shuffle_seed"] = int(shuffle_seed)
    stat = source_stat(source)
    existing = read_shards_manifest(dst)
    if up_to_date(existing, preset, stat, request, force):
        log(f"{dst}: up to date ({existing['num_samples']} images), skipped")
        return {**existing, "skipped_existing": True}
    t0 = time.perf_counter()
    scan, good, written = scan_good(source, dst, preset, workers=1, progress=progress, on_error=on_error, log=log)
    staging_parent = None if remote else Path(dst).parent
    if staging_parent is not None:
        staging_parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{Path(dst).name}.tmp-{socket.gethostname()}-{os.getpid()}-",
                                    dir=staging_parent))
    try:
        largest = _write_local(source, write_order(good, shuffle_seed), written, scan.sizes, staging, chunk_bytes,
                               shuffled=shuffle_seed is not None)
        files = {p.name: p.stat().st_size for p in sorted(staging.iterdir())}
        kept = source.labels[good]
        counts = np.bincount(kept, minlength=len(source.classes))
        manifest = {
            "format": SHARDS_MANIFEST_FORMAT,
            "engine": "litdata",
            "request": request,
            "num_samples": int(len(good)),
            "num_classes": len(source.classes),
            "classes": list(source.classes),
            "class_counts": {c: int(k) for c, k in zip(source.classes, counts)},
            "preset": asdict(preset),
            "max_size": list(largest),  # (height, width): the canvas of data.resample_on='device' holds any crop
            "source_checksum": scan.checksum,
            "source_stat": stat,
            "skipped": [asdict(p) for p in scan.problems],
            "files": files,
            "bytes": int(sum(files.values())),
            "seconds": round(time.perf_counter() - t0, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if normalization is not None:
            manifest["normalization"] = {"mean": [float(v) for v in normalization[0]],
                                         "std": [float(v) for v in normalization[1]]}
        if remote:
            client = objstore.s3_client()  # one for the set's files
            for name in files:  # the data first, the manifest (the "complete" mark) last
                objstore.upload_file(staging / name, objstore.join(dst, name), client)
            atomic_write_json(staging / MANIFEST_NAME, manifest)
            objstore.upload_file(staging / MANIFEST_NAME, objstore.join(dst, MANIFEST_NAME), client)
        else:
            atomic_write_json(staging / MANIFEST_NAME, manifest)
            commit(staging, dst, replace_dir=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    chunks = sum(name.startswith("chunk-") for name in files)
    log(f"{dst}: {manifest['bytes'] / 2**20:.2f} MiB in {chunks} chunk(s), {len(good)} images in "
        f"{manifest['seconds']:.1f} s")
    return manifest


def check_shard_files(location: str, manifest: dict) -> None:
    """Every file the manifest lists is at ``location`` with its recorded size.

    Raises:
        StoreError: one line naming the first file that is missing or of another size (a truncated or interrupted
            upload, a file replaced by hand) and the fix."""
    present = objstore.list_sizes(location)
    for name, size in (manifest.get("files") or {}).items():
        got = present.get(name)
        if got != size:
            what = "is missing" if got is None else f"is {got} bytes, the manifest records {size}"
            raise StoreError(f"shard set {location}: {name} {what} (a truncated or interrupted upload); rewrite it "
                             f"with `impulsevit convert ... --format litdata --force`")
