"""The FFCV backend: the splits converted once to cached ``.beton`` files (or given ones), read by FFCV's loader.

:meth:`FFCVBackend.prepare` (rank 0 of each node) converts the requested splits
(:func:`impulsevit.data.storage.convert.convert_split`, atomic, skipped when up to date) under ``cache_dir``;
:meth:`FFCVBackend.setup` checks each file (integrity, and the manifests against the run: :func:`check_betons`); the
loaders (:func:`impulsevit.data.loading.ffcv_loader.build_ffcv_loader`) are built after the process group exists,
distributed when it has more than one rank. RandomResizedCrop + flip run in FFCV's decoder (with
``resample_on='device'`` the decoder only draws and copies the crop box, and the consumer resamples it on its device:
:mod:`impulsevit.data.loading.device_resample`); RandAugment, colour jitter and random erasing are left to the device
(``augments_on_device``).

The functions of a :class:`~impulsevit.data.loading.backends.DataSpec` here (:func:`beton_path`,
:func:`convert_command`, :func:`splits_to_convert`, :func:`check_betons`) need no FFCV package.

Not supported: AutoAugment / AugMix policies (the device augmentation implements RandAugment), interpolations other
than ``bicubic`` / ``bilinear``.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path
from typing import ClassVar

import torch
from lightning.pytorch.utilities import rank_zero_warn

from impulsevit.data.loading.backends import Backend, DataSpec, check_train_split
from impulsevit.data.loading.ffcv_loader import FFCVLoader, build_ffcv_loader
from impulsevit.data.loading.position import LoaderPosition, dist_info
from impulsevit.data.sources.registry import get_dataset
from impulsevit.data.storage.convert import convert_split, source_stat, up_to_date
from impulsevit.data.storage.integrity import BetonError, check_header, verify_beton
from impulsevit.data.storage.manifest import identity_mismatches, manifest_path, read_manifest
from impulsevit.errors import ConfigError, UserError
from impulsevit.io import claim_output

__all__ = ["FFCVBackend", "beton_path", "check_betons", "conversion_request", "convert_command", "current_manifest",
           "splits_to_convert"]


def root_tag(spec: DataSpec) -> str:
    """``root`` as the conversion request and ``impulsevit convert --root`` record it (``"None"`` without one)."""
    return str(Path(spec.root)) if spec.root is not None else "None"


def beton_path(spec: DataSpec, split: str) -> Path:
    """Cache path of the split's ``.beton``: dataset, split, preset, subset and a hash of the root in the name (or
    the file given as ``train_beton`` / ``val_beton``)."""
    if split in spec.betons:
        return spec.betons[split]
    k = spec.subset(split)
    tag = hashlib.sha1(str(Path(spec.root).resolve() if spec.root else "default").encode()).hexdigest()[:8]
    sub = f"-n{k}" if k else ""
    return spec.cache_dir / f"{spec.info.name}-{split}-{spec.preset.name}{sub}-{tag}.beton"


def conversion_request(spec: DataSpec, split: str) -> dict:
    """The request that the split's cached ``.beton`` records (and :func:`convert_command` writes): dataset, root,
    split, subset."""
    return {"dataset": spec.info.name, "root": root_tag(spec), "split": split, "subset": spec.subset(split)}


def current_manifest(spec: DataSpec, split: str) -> dict | None:
    """The manifest of the split's cached ``.beton`` when that file is this conversion of the split as it is now
    (same request and preset, and the source's fingerprint unchanged: what :meth:`FFCVBackend.prepare` skips);
    None when the file is missing or incomplete, or stale (e.g. the images of an ``imagefolder`` root were replaced,
    which the cache name, a hash of the root path, does not see). A source that cannot be read now leaves the
    complete file as the only evidence: its manifest is returned. A given ``.beton`` is not a cached one: its
    manifest as it is (no size check: converted elsewhere). Costs what the up-to-date check of ``prepare`` costs:
    the split's listing and a ``stat`` per file (array datasets: a content hash)."""
    path = beton_path(spec, split)
    if split in spec.betons:
        return read_manifest(path, check_size=False)
    manifest = read_manifest(path)
    if manifest is None:
        return None
    try:
        stat = source_stat(spec.load_source(split))
    except (UserError, OSError, ValueError):
        return manifest
    return manifest if up_to_date(manifest, spec.preset, stat, conversion_request(spec, split), False) else None


def convert_command(spec: DataSpec, split: str, workers: int | str | None = None) -> list[str]:
    """The ``impulsevit convert`` argv that writes exactly the ``.beton`` :meth:`FFCVBackend.prepare` would write
    for ``split`` (same path, preset, subset and request, so training then finds it up to date)."""
    k = spec.subset(split)
    cmd = ["impulsevit", "convert", spec.info.name, str(beton_path(spec, split)), "--split", split,
           "--preset", spec.preset.name, "--verify", spec.verify, "--on-error", "skip", "--no-progress"]
    if spec.root is not None:
        cmd += ["--root", root_tag(spec)]
    if k:
        cmd += ["--subset", str(k)]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    return cmd


def splits_to_convert(spec: DataSpec) -> list[str]:
    """FFCV splits whose cached ``.beton`` is missing, incomplete or stale (:func:`current_manifest`); empty for the
    torchvision backend and for given files."""
    if spec.backend != "ffcv" or spec.betons:
        return []
    return [s for s in spec.splits() if current_manifest(spec, s) is None]


def _canonical(manifest: dict) -> dict:
    """``manifest`` with its ``request.dataset`` as the registry's canonical name (an alias or an unregistered name
    as it is)."""
    name = (manifest.get("request") or {}).get("dataset")
    if name is None:
        return manifest
    try:
        name = get_dataset(str(name)).name
    except (KeyError, ValueError):
        return manifest
    return {**manifest, "request": {**manifest["request"], "dataset": name}}


def check_betons(spec: DataSpec) -> None:
    """Refuse (:class:`ConfigError`, one line naming each file, the field, its value and the run's) ``.beton`` files
    whose manifests contradict the run: converted from another dataset, with another class count than the dataset's
    fixed one, another storage preset than an explicit ``data.storage.preset``, other statistics than the run's
    (unless ``data.mean`` / ``data.std`` are given: then they are deliberate), a ``train_subset`` / ``val_subset`` the
    given file does not have (a given ``.beton`` is used whole), or a train and val file with different class lists.
    ``verify='warn'`` / ``'off'`` allow a given file with another class count (a modified copy). Run on given files
    at construction (before any file is written) and on the cached files at ``setup``. A given file without a
    manifest (converted elsewhere) is used with one warning naming what cannot be checked."""
    splits = spec.splits()
    paths = {split: beton_path(spec, split) for split in splits}
    manifests = {split: read_manifest(path, check_size=False) for split, path in paths.items()}
    explicit = bool(spec.betons)
    what = {split: (f"data.storage.{'train' if split == spec.train_split else 'val'}_beton {paths[split]}"
                    if explicit else f"cached {paths[split]}") for split in splits}
    unchecked = [str(paths[s]) for s in splits if manifests[s] is None]
    if explicit and unchecked:
        rank_zero_warn(f"{' and '.join(unchecked)}: no manifest ({manifest_path(unchecked[0]).name}; not written "
                       f"by `impulsevit convert`): the dataset, class list, storage preset and statistics it was "
                       f"converted with cannot be checked against this run (data.dataset {spec.info.name!r} "
                       f"supplies mean/std, the labels the class count)")
    # a dataset's fixed class count, for given files under verify='error' (a cached file was converted from the
    # source under the run's own `verify`, which may accept a modified copy)
    fixed = spec.info.num_classes if (explicit and spec.verify == "error" and spec.info.num_classes > 0
                                      and spec.info.tree_classes is None) else None
    problems: dict[str, list[str]] = {}  # phrase -> the files it applies to
    for split in splits:
        manifest = manifests[split]
        if manifest is None:
            continue
        found = identity_mismatches(
            _canonical(manifest), dataset=spec.info.name, num_classes=fixed,
            preset=spec.storage.preset if explicit else None,
            normalization=None if spec.explicit_norm else (spec.mean, spec.std))
        k = spec.subset(split)
        kept = (manifest.get("request") or {}).get("subset")
        if explicit and k and kept != k and int(manifest.get("num_samples", 0)) > k:
            key = "train_subset" if split == spec.train_split else "val_subset"
            found.append(f"holds {manifest['num_samples']} images (converted with subset {kept}) but the run's "
                         f"data.{key} is {k}; a given .beton is used whole: convert it with --subset {k}, or "
                         f"drop data.{key}")
        for phrase in found:
            problems.setdefault(phrase, []).append(what[split])
    classes = [manifests[s].get("classes") for s in splits if manifests[s] is not None]
    if len(classes) == 2 and classes[0] and classes[1] and list(classes[0]) != list(classes[1]):
        only = [c for c in classes[0] if c not in classes[1]][:3] or [c for c in classes[1]
                                                                       if c not in classes[0]][:3]
        problems[f"hold different class lists ({len(classes[0])} vs {len(classes[1])} classes"
                 + (f", e.g. {only}" if only else ", in another order")
                 + "): a label would name another class in validation than in training"] = \
            [what[splits[0]], what[splits[1]]]
    if problems:
        hint = (" (set data.dataset to the one the files were converted from, or give .beton files of this run's "
                "dataset)" if any("data.dataset" in p for p in problems) else "")
        raise ConfigError("; ".join(f"{' and '.join(files)}: {phrase}" for phrase, files in problems.items())
                          + hint)


class FFCVBackend(Backend):
    """:class:`~impulsevit.data.loading.backends.Backend` over ``.beton`` files (module docstring)."""

    name: ClassVar = "ffcv"
    augments_on_device: ClassVar = True

    def beton_path(self, split: str) -> Path:
        """The split's ``.beton`` (:func:`beton_path`)."""
        return beton_path(self.spec, split)

    def convert_command(self, split: str, workers: int | str | None = None) -> list[str]:
        """The ``impulsevit convert`` argv that writes exactly the ``.beton`` :meth:`prepare` would write for
        ``split`` (:func:`convert_command`)."""
        return convert_command(self.spec, split, workers)

    def check_given(self) -> None:
        """Given ``.beton`` files whose manifests contradict the run are refused (:func:`check_betons`); nothing to
        check for cached files here (``setup`` checks them)."""
        if self.spec.betons:
            check_betons(self.spec)

    def prepare(self, world_size: int) -> None:
        """Convert the train and val splits to ``.beton`` files unless they are up to date (nothing for given
        files). The files are written atomically so other ranks never see partial ones, and a lock file next to
        each output makes concurrent converters (other nodes sharing the cache) wait and reuse it. With
        ``world_size > 1`` a split larger than ``storage.convert_limit`` without a complete ``.beton`` stops the run
        at once with the ``impulsevit convert`` command to run.

        Raises:
            RuntimeError: such a split (the message lists the commands).
        """
        spec = self.spec
        if spec.betons:
            return
        claim_output(spec.cache_dir, False, "into", what="data.cache_dir")  # a file there: one line, not a traceback
        splits = spec.splits()
        if world_size > 1:
            too_big = [s for s in splits if current_manifest(spec, s) is None
                       and spec.split_size(s) > spec.storage.convert_limit]
            if too_big:
                commands = "\n".join("  " + shlex.join(convert_command(spec, s)) for s in too_big)
                raise RuntimeError(f"{spec.info.name}: split(s) {', '.join(too_big)} have more than "
                                   f"data.storage.convert_limit={spec.storage.convert_limit} images and no .beton "
                                   f"yet; a {world_size}-process run does not convert them inside the training job. "
                                   f"Convert first (one node, all its cores), then rerun:\n{commands}\n(`impulsevit "
                                   f"submit` does this as a separate job)")
        for split in splits:
            convert_split(spec.load_source(split), beton_path(spec, split), spec.preset,
                          workers=max(1, spec.num_workers), on_error="skip", progress=False,
                          normalization=(spec.info.mean, spec.info.std),
                          request=conversion_request(spec, split))

    def setup(self, stage: str | None, known_classes: list[str] | None) -> list[str] | None:
        """Check each split's file (present, integrity per ``storage.beton_check``, cached files' manifests against
        the run); the class names are the first manifest's (the train split's) unless ``known_classes``.

        Raises:
            FileNotFoundError: a file is missing (``prepare`` writes it). BetonError / ConfigError: a damaged file,
                or one that contradicts the run.
        """
        spec, classes = self.spec, known_classes
        for split in spec.splits():
            path = beton_path(spec, split)
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: prepare_data() converts it (the Trainer calls it; call "
                                        f"dm.prepare_data() when using the datamodule by hand)")
            manifest = read_manifest(path, check_size=False)
            verify_beton(path, manifest, spec.storage.beton_check, first_use_full=True)
            if manifest is not None and manifest.get("classes") and classes is None:
                classes = [str(c) for c in manifest["classes"]]  # the train split's, listed first
        if not spec.betons:
            check_betons(spec)  # the given files were checked at construction
        return classes

    def _loader(self, train: bool, position: LoaderPosition, batch_size: int,
                device: torch.device | None) -> FFCVLoader:
        spec = self.spec
        if (position.rank, position.world_size) != dist_info():
            raise ValueError(f"the ffcv backend shards by the process group (rank, world size) {dist_info()}; got "
                             f"a position of rank {position.rank} of {position.world_size}")
        aug = spec.augment
        loader = build_ffcv_loader(beton_path(spec, spec.train_split if train else spec.val_split), train=train,
                                   image_size=spec.image_size, batch_size=batch_size, num_workers=spec.num_workers,
                                   scale=aug.scale, ratio=aug.ratio, hflip=aug.hflip, crop_pct=spec.crop_pct,
                                   interpolation=spec.interpolation, seed=spec.seed, in_memory=spec.storage.in_memory,
                                   repeated_aug=aug.repeated_aug if train else 1, device=device,
                                   resample_on=spec.resample_on)
        if train:
            check_train_split(spec, len(loader.loader.indices), batch_size, position.world_size)
        loader.sampler.set_epoch(position.epoch)
        return loader

    def train_loader(self, position: LoaderPosition, batch_size: int,
                     device: torch.device | None = None) -> FFCVLoader:
        return self._loader(True, position, batch_size, device)

    def eval_loader(self, position: LoaderPosition, batch_size: int, device: torch.device | None = None) -> FFCVLoader:
        return self._loader(False, position, batch_size, device)

    def train_samples(self) -> int | None:
        """A given ``.beton``'s manifest (else its header), a cached ``.beton``'s manifest when it is current
        (:func:`current_manifest`), else the split's published count or listing after ``train_subset``; None when
        the split cannot be read yet."""
        spec = self.spec
        try:
            path = beton_path(spec, spec.train_split)
            manifest = current_manifest(spec, spec.train_split)
            if manifest is not None:
                return int(manifest["num_samples"])
            if spec.betons:
                return check_header(path)
            return spec.split_size(spec.train_split)
        except (OSError, ValueError, KeyError, BetonError):
            return None

    def splits_to_convert(self) -> list[str]:
        return splits_to_convert(self.spec)
