"""``.beton`` integrity: a structural check of the header and sizes on open, and a checksum recorded at conversion.

- :func:`check_header`: the file is a ``.beton`` FFCV can read — version, field count, page size, sample count, the
  metadata region and the allocation table inside the file, every allocation inside the data region. Cost: the header
  and the allocation table (a few KiB per thousand images). Catches truncated files and foreign / random bytes.
- :func:`file_digests` / :func:`verify_beton`: BLAKE2b digests of every ``CHUNK`` bytes, stored in the manifest by
  ``impulsevit convert``; ``level='sampled'`` (cheap default) re-hashes the first and last chunks and ``SAMPLED``
  random others, ``'full'`` re-hashes all. Catches zeroed or overwritten regions (always with ``full``; ``sampled``
  catches them when they fall into a sampled chunk — every chunk of a file up to ``(SAMPLED + 2) * CHUNK`` bytes).

Errors are :class:`BetonError` (a ``ValueError``), one line naming the file and what is wrong.
Not supported: ``.beton`` files written by other tools carry no manifest, so only :func:`check_header` applies.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Literal

import numpy as np

__all__ = ["CHUNK", "SAMPLED", "BetonError", "CheckLevel", "check_header", "file_digests", "verify_beton"]

CHUNK = 4 << 20  # bytes per digest
SAMPLED = 8  # random chunks re-hashed by a 'sampled' check (besides the first and the last)
CheckLevel = Literal["sampled", "full", "off"]


class BetonError(ValueError):
    """A ``.beton`` file is unreadable or differs from what was written; ``str()`` names the file."""


def check_header(path: str | os.PathLike) -> int:
    """Check the structure of the ``.beton`` at ``path``; return its sample count.

    Raises:
        FileNotFoundError: no such file.
        BetonError: not a ``.beton``, an unsupported version, or truncated (naming the offsets that are missing).
    """
    from ffcv.types import ALLOC_TABLE_TYPE, CURRENT_VERSION, FieldDescType, HeaderType, get_handlers, get_metadata_type

    path = Path(path)
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


def file_digests(path: str | os.PathLike, indices: list[int] | None = None) -> list[str]:
    """Hex BLAKE2b-128 digests of the ``CHUNK``-byte chunks of ``path`` (all, or those at ``indices``, in order)."""
    out = []
    with open(path, "rb") as fh:
        n = max(1, -(-os.fstat(fh.fileno()).st_size // CHUNK))
        for i in range(n) if indices is None else indices:
            fh.seek(i * CHUNK)
            out.append(hashlib.blake2b(fh.read(CHUNK), digest_size=16).hexdigest())
    return out


def verify_beton(path: str | os.PathLike, manifest: dict | None, level: CheckLevel = "sampled",
                 rng: random.Random | None = None) -> None:
    """Check ``path`` against its conversion manifest (``None``: no manifest, only :func:`check_header`).

    Args:
        level: ``'off'`` nothing; ``'sampled'`` header, size and sampled chunk digests; ``'full'`` every chunk.
        rng: picks the sampled chunks (default: a fresh random choice each call, so repeated checks cover more).

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
    if level == "full" or n <= SAMPLED + 2:
        indices = list(range(n))
    else:
        indices = sorted({0, n - 1, *(rng or random.Random()).sample(range(1, n - 1), SAMPLED)})
    for i, digest in zip(indices, file_digests(path, indices)):
        if digest != stored[i]:
            raise BetonError(f"{path}: bytes {i * CHUNK}-{min(size, (i + 1) * CHUNK)} differ from the checksum in "
                             f"its manifest (damaged on disk or modified); rebuild it with `impulsevit convert "
                             f"--force` or delete it")
