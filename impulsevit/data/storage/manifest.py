"""The manifest next to every ``.beton`` written by :func:`impulsevit.data.storage.convert.convert_split`.

``X.beton`` gets ``X.manifest.json`` (format :data:`MANIFEST_FORMAT`), written after the ``.beton`` is complete (temp
file + rename): ``request`` (what was asked for: dataset, root, split, subset), ``num_samples``, ``num_classes``,
``classes``, ``class_counts``, ``preset`` (the requested :class:`~impulsevit.data.storage.presets.Preset` as a dict),
``source_checksum`` / ``source_stat`` (content hash and size/mtime fingerprint of the source), ``skipped`` (the bad
inputs left out), ``bytes`` (the ``.beton``'s size), ``checksum`` (chunk digests,
:mod:`impulsevit.data.storage.integrity`),
``expected_bytes``, ``seconds``, ``write_images_per_second`` and ``created``. A ``.beton`` whose manifest is missing,
of another format or records another size counts as incomplete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from impulsevit.data.storage.integrity import check_header

__all__ = ["MANIFEST_FORMAT", "beton_num_classes", "manifest_path", "read_manifest"]

MANIFEST_FORMAT = "impulsevit-beton-manifest/1"


def manifest_path(beton: str | os.PathLike) -> Path:
    """``X.manifest.json`` next to ``X.beton``."""
    beton = Path(beton)
    return beton.with_name(beton.name.removesuffix(".beton") + ".manifest.json")


def read_manifest(beton: str | os.PathLike, check_size: bool = True) -> dict | None:
    """The manifest of a complete ``.beton`` (file present with the recorded size, unless not ``check_size``), else
    None."""
    mpath = manifest_path(beton)
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("format") != MANIFEST_FORMAT:
        return None
    try:
        if check_size and os.path.getsize(beton) != manifest.get("bytes"):
            return None
    except OSError:
        return None
    return manifest


def beton_num_classes(path: str | os.PathLike) -> int:
    """Class count of a ``.beton``: from its manifest, else the largest label + 1 (read from the file's metadata)."""
    manifest = read_manifest(path)
    if manifest is not None:
        return int(manifest["num_classes"])
    from ffcv.reader import Reader

    check_header(path)
    reader = Reader(str(path))
    names = list(reader.handlers)
    if "label" not in names:
        raise ValueError(f"{path}: no 'label' field (fields: {names})")
    return int(reader.metadata[f"f{names.index('label')}"].max()) + 1
