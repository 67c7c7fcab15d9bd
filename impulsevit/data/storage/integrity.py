"""``.beton`` integrity: a structural check of the header and sizes on open, and a checksum recorded at conversion.

- :func:`check_header`: the file is a ``.beton`` FFCV can read — version, field count, page size, sample count, the
  metadata region and the allocation table inside the file, every allocation inside the data region. Cost: the header
  and the allocation table (a few KiB per thousand images). Catches truncated files and foreign / random bytes.
- :func:`file_digests` / :func:`verify_beton`: BLAKE2b digests of every ``CHUNK`` bytes, stored in the manifest by
  ``impulsevit convert``; ``level='sampled'`` (cheap default) re-hashes the first and last chunks and ``SAMPLED``
  random others, ``'full'`` re-hashes all. Catches zeroed or overwritten regions (always with ``full``; ``sampled``
  catches them when they fall into a sampled chunk — every chunk of a file up to ``(SAMPLED + 2) * CHUNK`` = 40 MiB;
  beyond, one damaged interior chunk of ``n`` is found with probability ``SAMPLED / (n - 2)``
  (:func:`sampled_detection_probability`): 8/17 = 47 % for a 74 MB file, 0.2 % for 16 GB).
- ``first_use_full`` (what the datamodule's ``storage.beton_check='sampled'`` uses): the first check of a file is
  full, and a passed full check is recorded in ``X.verified.json`` next to the manifest, keyed by the file's size,
  modification time and the manifest's chunk digests; later checks of the same file are sampled. A rewritten or
  replaced file (new mtime / size / manifest) is checked in full again. Files over ``FULL_FIRST_USE_MAX`` bytes
  are only sampled, with a one-line notice giving the probability and the full-check command.

Errors are :class:`BetonError` (a ``ValueError``), one line naming the file and what is wrong.
Not supported: ``.beton`` files written by other tools carry no manifest, so only :func:`check_header` applies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Literal

import numpy as np

from impulsevit.io import atomic_write_json

__all__ = ["CHUNK", "FULL_FIRST_USE_MAX", "SAMPLED", "BetonError", "CheckLevel", "check_header", "file_digests",
           "sampled_detection_probability", "verified_path", "verify_beton"]

CHUNK = 4 << 20  # bytes per digest
SAMPLED = 8  # random chunks re-hashed by a 'sampled' check (besides the first and the last)
FULL_FIRST_USE_MAX = 32 << 30  # bytes: larger files are not read in full at their first use (sampled, with a notice)
CheckLevel = Literal["sampled", "full", "off"]


class BetonError(ValueError):
    """A ``.beton`` file is unreadable or differs from what was written; ``str()`` names the file."""


def check_header(path: str | os.PathLike) -> int:
    """Check the structure of the ``.beton`` at ``path``; return its sample count.

    Raises:
        FileNotFoundError: no such file.
        BetonError: a folder, not a ``.beton``, an unsupported version, or truncated (naming the offsets that are
            missing).
    """
    from ffcv.types import ALLOC_TABLE_TYPE, CURRENT_VERSION, FieldDescType, HeaderType, get_handlers, get_metadata_type

    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.beton"))
        hint = f" (it holds {', '.join(inside[:4])}{', ...' if len(inside) > 4 else ''})" if inside else ""
        raise BetonError(f"{path} is a folder, not a .beton file{hint}; give the .beton file's path")
    if not path.is_file():
        raise FileNotFoundError(f"FFCV file {path} does not exist")
    size = path.stat().st_size
    bad = f"{path} is not a readable .beton file"
    if size < HeaderType.itemsize:
        raise BetonError(f"{bad}: {size} bytes, shorter than the {HeaderType.itemsize}-byte header (truncated?)")
    header = np.fromfile(path, dtype=HeaderType, count=1)[0]
    if int(header["version"]) != CURRENT_VERSION:
        raise BetonError(f"{bad}: format version {int(header['version'])}, expected {CURRENT_VERSION} (not written "
                         f"by FFCV {CURRENT_VERSION}.x, or overwritten)")
    page, n, nf = int(header["page_size"]), int(header["num_samples"]), int(header["num_fields"])
    alloc_ptr = int(header["alloc_table_ptr"])
    if page <= 0 or page & (page - 1) or not 0 < nf < 64 or n <= 0:
        raise BetonError(f"{bad}: header says page_size={page}, num_fields={nf}, num_samples={n}")
    fields_end = HeaderType.itemsize + nf * FieldDescType.itemsize
    if fields_end > size:
        raise BetonError(f"{bad}: truncated at {size} bytes inside the field table (ends at {fields_end})")
    descriptors = np.fromfile(path, dtype=FieldDescType, count=nf, offset=HeaderType.itemsize)
    try:
        metadata_type = get_metadata_type(get_handlers(descriptors))
    except Exception as exc:  # noqa: BLE001 - unknown field type ids mean a damaged field table
        raise BetonError(f"{bad}: damaged field table ({type(exc).__name__}: {exc})") from exc
    metadata_end = fields_end + n * metadata_type.itemsize
    if not metadata_end <= alloc_ptr <= size:
        raise BetonError(f"{bad}: truncated or damaged: {size} bytes, the allocation table is said to start at "
                         f"{alloc_ptr} and the metadata of {n} samples to end at {metadata_end}")
    if (size - alloc_ptr) % ALLOC_TABLE_TYPE.itemsize:
        raise BetonError(f"{bad}: truncated inside the allocation table ({size - alloc_ptr} bytes after offset "
                         f"{alloc_ptr}, not a multiple of {ALLOC_TABLE_TYPE.itemsize})")
    table = np.fromfile(path, dtype=ALLOC_TABLE_TYPE, offset=alloc_ptr)
    if len(table) and (int(table["sample_id"].max()) >= n or
                       int((table["ptr"] + table["size"]).max()) > alloc_ptr or int(table["ptr"].min()) < metadata_end):
        raise BetonError(f"{bad}: the allocation table points outside the data region (damaged or truncated)")
    return n


def file_digests(path: str | os.PathLike, indices: list[int] | None = None, chunk: int = CHUNK) -> list[str]:
    """Hex BLAKE2b-128 digests of the ``chunk``-byte chunks of ``path`` (all, or those at ``indices``, in order)."""
    out = []
    with open(path, "rb") as fh:
        n = max(1, -(-os.fstat(fh.fileno()).st_size // chunk))
        for i in range(n) if indices is None else indices:
            fh.seek(i * chunk)
            out.append(hashlib.blake2b(fh.read(chunk), digest_size=16).hexdigest())
    return out


def sampled_detection_probability(num_chunks: int) -> float:
    """The chance that a ``'sampled'`` check finds one damaged chunk (an interior one; the first and last chunks are
    always checked) of a file of ``num_chunks`` chunks: 1 up to ``SAMPLED + 2`` chunks, else ``SAMPLED / (n - 2)``."""
    return 1.0 if num_chunks <= SAMPLED + 2 else SAMPLED / (num_chunks - 2)


def verified_path(beton: str | os.PathLike) -> Path:
    """``X.verified.json`` next to ``X.beton``: the record of the last full check that passed."""
    beton = Path(beton)
    return beton.with_name(beton.name.removesuffix(".beton") + ".verified.json")


def _identity(path: Path, stored: list[str]) -> dict:
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "chunks_digest": hashlib.blake2b("".join(stored).encode(), digest_size=16).hexdigest()}


def _verified_before(path: Path, stored: list[str]) -> bool:
    try:
        return json.loads(verified_path(path).read_text()) == _identity(path, stored)
    except (OSError, ValueError):
        return False


def _record_verified(path: Path, stored: list[str]) -> None:
    with contextlib.suppress(OSError):  # a read-only cache folder: the next use checks in full again
        atomic_write_json(verified_path(path), _identity(path, stored))


def verify_beton(path: str | os.PathLike, manifest: dict | None, level: CheckLevel = "sampled",
                 rng: random.Random | None = None, first_use_full: bool = False) -> None:
    """Check ``path`` against its conversion manifest (``None``: no manifest, only :func:`check_header`).

    Args:
        level: ``'off'`` nothing; ``'sampled'`` header, size and sampled chunk digests (one damaged interior chunk
            is found with :func:`sampled_detection_probability`); ``'full'`` every chunk.
        rng: picks the sampled chunks (default: a fresh random choice each call, so repeated checks cover more).
        first_use_full: with ``'sampled'``, check every chunk unless a full check of this very file (size, mtime,
            manifest digests) passed before (``X.verified.json``); files over ``FULL_FIRST_USE_MAX`` stay sampled,
            with a one-line notice on stderr. A passed full check is recorded (both levels, when this is set).

    Raises:
        BetonError: the structure is damaged, the size differs from the manifest's, or a chunk's digest differs
            (naming the byte range).
    """
    if level == "off":
        return
    if level not in ("sampled", "full"):
        raise ValueError(f"beton check level must be 'sampled', 'full' or 'off', got {level!r}")
    path = Path(path)
    check_header(path)
    if manifest is None:
        return
    size = path.stat().st_size
    if manifest.get("bytes") is not None and size != manifest["bytes"]:
        raise BetonError(f"{path} is {size} bytes, its manifest says {manifest['bytes']} (truncated or replaced)")
    stored = (manifest.get("checksum") or {}).get("chunks")
    if not stored:
        return  # written before checksums were recorded
    n = len(stored)
    chunk = int((manifest.get("checksum") or {}).get("chunk_bytes") or CHUNK)
    if level == "sampled" and first_use_full and not _verified_before(path, stored):
        if size <= FULL_FIRST_USE_MAX:
            level = "full"
        elif n > SAMPLED + 2:
            print(f"impulsevit: {path} ({size / 2**30:.0f} GiB) is checked by sampled chunks only: one damaged chunk "
                  f"is found with probability {sampled_detection_probability(n):.1%}; run `impulsevit convert "
                  f"--check {path} --full` once to check every byte", file=sys.stderr)
    if level == "full" or n <= SAMPLED + 2:
        indices = list(range(n))
    else:
        indices = sorted({0, n - 1, *(rng or random.Random()).sample(range(1, n - 1), SAMPLED)})
    for i, digest in zip(indices, file_digests(path, indices, chunk)):
        if digest != stored[i]:
            raise BetonError(f"{path}: bytes {i * chunk}-{min(size, (i + 1) * chunk)} differ from the checksum in "
                             f"its manifest (damaged on disk or modified); rebuild it with `impulsevit convert "
                             f"--force` or delete it")
    if first_use_full and len(indices) == n:
        _record_verified(path, stored)
