"""The manifest next to every ``.beton`` written by :func:`impulsevit.data.storage.convert.convert_split`.

``X.beton`` gets ``X.manifest.json`` (format :data:`MANIFEST_FORMAT`), written after the ``.beton`` is complete (temp
file + rename): ``request`` (what was asked for: dataset, root, split, subset), ``num_samples``, ``num_classes``,
``classes``, ``class_counts``, ``preset`` (the requested :class:`~impulsevit.data.storage.presets.Preset` as a dict),
``source_checksum`` / ``source_stat`` (content hash and size/mtime fingerprint of the source), ``skipped`` (the bad
inputs left out), ``bytes`` (the ``.beton``'s size), ``checksum`` (chunk digests,
:mod:`impulsevit.data.storage.integrity`),
``expected_bytes``, ``seconds``, ``write_images_per_second``, ``created`` and, when the converter knew them,
``normalization`` (the dataset's ``mean`` / ``std`` in the registry at conversion). A ``.beton`` whose manifest is
missing, of another format or records another size counts as incomplete.

:func:`identity_mismatches` compares a manifest with what a run expects of the file (dataset, class count, storage
preset, statistics): what the datamodule refuses before training on another dataset's ``.beton``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from impulsevit.data.storage.integrity import check_header

__all__ = ["MANIFEST_FORMAT", "beton_num_classes", "identity_mismatches", "manifest_path", "read_manifest"]

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


def identity_mismatches(manifest: dict, *, dataset: str | None = None, num_classes: int | None = None,
                        preset: str | None = None,
                        normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None) -> list[str]:
    """How ``manifest`` contradicts what a run expects of its ``.beton``, one phrase per field (empty: none).

    Each expectation given (None: not checked) is compared with the manifest's record, and a field the manifest does
    not record (older manifests, files converted by the library without a ``request``) is not checked:
    ``dataset`` (a registry name, compared with ``request.dataset`` as the caller canonicalised it), ``num_classes``
    (a dataset's fixed class count), ``preset`` (the storage preset's name the run asked for) and ``normalization``
    (``(mean, std)`` the run normalises with, compared with the registry's statistics recorded at conversion, to
    1e-6). Another dataset is reported alone (the rest follows from it). Not compared: the run's image size (a
    preset that stored smaller images than the run's evaluation resize is allowed), the source root."""
    out: list[str] = []
    recorded = (manifest.get("request") or {}).get("dataset")
    if dataset is not None and recorded is not None and str(recorded) != dataset:
        # the class count and statistics follow from the dataset: this one phrase says it all
        return [f"converted from dataset {recorded!r} but the run's data.dataset is {dataset!r}"]
    if num_classes is not None and manifest.get("num_classes") is not None \
            and int(manifest["num_classes"]) != int(num_classes):
        out.append(f"holds {manifest['num_classes']} classes but dataset {dataset or recorded!r} has {num_classes}")
    stored = (manifest.get("preset") or {}).get("name")
    if preset is not None and stored is not None and stored != preset:
        out.append(f"was stored with preset {stored!r} but the run's data.storage.preset is {preset!r}")
    norm = manifest.get("normalization") or {}
    if normalization is not None and norm.get("mean") is not None and norm.get("std") is not None:
        then = (tuple(float(v) for v in norm["mean"]), tuple(float(v) for v in norm["std"]))
        now = (tuple(float(v) for v in normalization[0]), tuple(float(v) for v in normalization[1]))
        if len(then[0]) != len(now[0]) or len(then[1]) != len(now[1]) or any(
                abs(a - b) > 1e-6 for x, y in zip(then, now) for a, b in zip(x, y)):
            out.append(f"was converted with mean {list(then[0])} / std {list(then[1])} but the run normalises with "
                       f"mean {list(now[0])} / std {list(now[1])}")
    return out
