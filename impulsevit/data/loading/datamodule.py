"""``ImageDataModule``: any registry dataset through FFCV (default) or torchvision/timm, with DeiT augmentation.

Both backends yield uint8 ``(B, 3, S, S)`` images and int64 labels from their loaders; ``on_after_batch_transfer``
turns them into normalised float32 on the device (training batches also get the device-side augmentations), so the
LightningModule always sees ``(images (B, 3, S, S) float32 normalised, labels (B,) int64)``. Mixup/CutMix and label
smoothing are the module's job (timm ``Mixup``), not the datamodule's.

Backends:

- ``ffcv``: ``prepare_data`` (rank 0 of each node) converts the requested splits to cached ``.beton`` files
  (:func:`impulsevit.data.storage.convert.convert_split`, atomic, skipped when up to date) under ``cache_dir``; the
  loaders
  are built in the dataloader hooks, after the process group exists, with ``distributed=True`` under DDP (see
  :mod:`impulsevit.data.loading.ffcv_loader`). RandomResizedCrop + flip run in FFCV's decoder (with
  ``resample_on='device'`` the decoder only draws and copies the crop box, and ``on_after_batch_transfer`` resamples
  it on the device first: :mod:`impulsevit.data.loading.device_resample`, the same bytes); RandAugment, colour
  jitter and random erasing run on the device (:class:`impulsevit.data.augment.device.DeviceAugment`).
- ``torchvision``: timm's ``create_transform`` pipeline (RandomResizedCrop, flip, RandAugment or colour jitter,
  bicubic) in ``DataLoader`` workers, random erasing on the device (as timm's prefetcher does). Under DDP the
  datamodule builds a ``DistributedSampler`` itself.

Neither backend depends on Lightning's ``use_distributed_sampler``: the FFCV loader is not a ``DataLoader`` (Lightning
leaves it alone) and the torchvision loader already carries a ``DistributedSampler``; the recipes set the flag to
False anyway. Repeated augmentation (``augment.repeated_aug > 1``) follows DeiT's RASampler on both backends.

Determinism and resume: the training order of both backends is :func:`impulsevit.data.loading.sampling.epoch_sequence`,
a
function of (seed, epoch, rank, world size); the torchvision workers' augmentation draws are seeded per sample from
(seed, epoch, position in the epoch) (:class:`SourceDataset`), independent of the worker count; the FFCV decoder's
crop/flip draws are a function of (seed, epoch, sample index); the device-side augmentation's draws are seeded from
(seed, epoch, batch index in the epoch, rank). The training loaders are stateful (epoch and batches consumed on this
rank): the datamodule's ``state_dict`` puts that state in every checkpoint (the position is Lightning's training
progress at the save), and a resumed run continues the interrupted epoch after the batches it had trained on — no
sample repeated, none skipped; on a different world size the remaining samples are re-sharded
(:mod:`impulsevit.data.loading.sampling`).

Not supported: AutoAugment/AugMix on the ffcv backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import random
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from impulsevit.blocks import as_config
from impulsevit.data.augment.device import DeviceAugment, fix_timm_posterize, normalize, selects_on_host
from impulsevit.data.loading.base import (
    BaseImageDataModule,
    check_num_workers,
    check_train_batches,
    dist_info,
    worker_init_fn,
)
from impulsevit.data.loading.config import AugmentConfig, StorageConfig
from impulsevit.data.loading.device_resample import resample_canvas
from impulsevit.data.loading.ffcv_loader import build_ffcv_loader, ffcv_available
from impulsevit.data.loading.sampling import EpochSampler, ResumableDataLoader, SampleKey, sample_seed
from impulsevit.data.sources.image_source import ImageSource
from impulsevit.data.sources.registry import DatasetInfo, Verify, get_dataset
from impulsevit.data.storage.convert import convert_split, subset_indices
from impulsevit.data.storage.integrity import BetonError, check_header, verify_beton
from impulsevit.data.storage.manifest import beton_num_classes, identity_mismatches, manifest_path, read_manifest
from impulsevit.data.storage.presets import PRESETS, default_preset
from impulsevit.errors import ConfigError, DataError, UserError
from impulsevit.io import claim_output

__all__ = ["ImageDataModule", "SourceDataset", "default_cache_dir", "seeded_global_rngs"]

Backend = Literal["ffcv", "torchvision"]
ResampleOn = Literal["workers", "device"]
log = logging.getLogger("impulsevit")


def default_cache_dir() -> Path:
    """``$IMPULSEVIT_CACHE`` or ``~/.cache/impulsevit``; ``.beton`` files go to its ``ffcv/`` sub-folder."""
    return Path(os.environ.get("IMPULSEVIT_CACHE", Path.home() / ".cache" / "impulsevit"))


@contextlib.contextmanager
def seeded_global_rngs(words: np.ndarray) -> Iterator[None]:
    """Seed Python's ``random``, numpy's global RNG and torch's CPU generator from four uint32 ``words`` for the block
    (timm's and torchvision's transforms draw from these); in the main process (``num_workers=0``) their previous
    states are restored afterwards, in a worker process they are the worker's own."""
    main = torch.utils.data.get_worker_info() is None
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state()) if main else None
    random.seed((int(words[0]) << 32) | int(words[1]))
    np.random.seed(words)
    torch.default_generator.manual_seed((int(words[2]) << 32) | int(words[3]))
    try:
        yield
    finally:
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


class SourceDataset(Dataset):
    """A torch ``Dataset`` over an :class:`ImageSource`: ``(transform(PIL RGB image), label int)``.

    Indexed by an int, or by a :class:`~impulsevit.data.loading.sampling.SampleKey` (what the training sampler yields):
    the
    transform's random draws are then seeded by :func:`~impulsevit.data.loading.sampling.sample_seed` ``(seed, epoch,
    position)``, so they do not depend on the worker process, the number of workers or a resume."""

    def __init__(self, source: ImageSource, transform=None, seed: int = 0) -> None:  # noqa: ANN001 - any callable
        self.source, self.transform, self.seed = source, transform, int(seed)
        self.bad: dict[int, str] = {}  # index -> why it could not be read (found in this process)

    def __len__(self) -> int:
        return len(self.source)

    def _readable(self, i: int) -> tuple[int, np.ndarray]:
        """``(index, pixels)`` of sample ``i``, or — when its file is corrupt, empty or unreadable — of the next
        readable sample after it (wrapping around), the same one every time, so the batch keeps its size and the
        order stays a function of the seed. Each unreadable file is logged once per process (the loader's worker
        processes each name those they meet), as the FFCV conversion lists and leaves out its bad inputs.

        Raises:
            DataError: no sample of the split can be read."""
        n = len(self.source)
        for step in range(n):
            j = (i + step) % n
            if j in self.bad:
                continue
            try:
                return j, self.source.load(j)
            except (OSError, SyntaxError, ValueError) as exc:  # PIL: truncated, corrupt, empty or not an image
                self.bad[j] = ("not an image file PIL can identify (empty, or another format)"
                               if type(exc).__name__ == "UnidentifiedImageError" else f"{type(exc).__name__}: {exc}")
                log.warning("impulsevit: skipped unreadable image %s (%s); it is replaced by the next readable "
                            "one", self.source.describe(j), self.bad[j])
        raise DataError(f"none of the {n} images of this split can be read (first: {self.source.describe(i)}: "
                        f"{self.bad.get(i, '?')}); check the files under the data root")

    def __getitem__(self, key: int | SampleKey):  # noqa: ANN204
        from PIL import Image

        i = key.index if isinstance(key, SampleKey) else int(key)
        i, pixels = self._readable(i)
        img = Image.fromarray(pixels)
        if self.transform is None:
            return img, int(self.source.labels[i])
        if isinstance(key, SampleKey):
            with seeded_global_rngs(sample_seed(self.seed, key.epoch, key.position)):
                return self.transform(img), int(self.source.labels[i])
        return self.transform(img), int(self.source.labels[i])


class ImageDataModule(BaseImageDataModule):
    """Registry dataset → batches for ``ImageClassifier``.

    Args:
        dataset: registry name (``fashion_mnist``, ``digits``, ``cifar10``, ``cifar100``, ``stl10``, ``flowers102``,
            ``pets``, ``food101``, ``imagenet``, ``imagenet21k``, ``imagefolder``, or one a plugin module registered
            with :func:`~impulsevit.data.register_dataset`).
        root: the dataset's folder (None: the registry default, e.g. Debian's Fashion-MNIST).
        backend: ``ffcv`` or ``torchvision``.
        image_size: output side S in pixels.
        batch_size: per device. num_workers: FFCV threads / DataLoader worker processes.
        crop_pct: evaluation centre crop as a fraction of the resized side, in ``(0, 1]`` (timm's meaning).
        interpolation: ``bicubic`` | ``bilinear`` (PIL's filters, on both backends and for both the training crop and
            the evaluation resize; the FFCV decoder supports no other).
        train_subset / val_subset: use a seeded random subset of this many images (fast CPU recipes).
        train_split / val_split: override the registry's default splits.
        cache_dir: where converted ``.beton`` files live (default :func:`default_cache_dir` ``/ffcv``).
        seed: data-order and augmentation seed (epoch order is ``seed + epoch``).
        verify: registry count check on loading the source (``error`` | ``warn`` | ``off``).
        mean / std: override the registry's normalisation statistics (per channel, 0–1 scale).
        download: fetch the dataset with ``torchvision.datasets`` in ``prepare_data`` when its files are missing
            (:mod:`impulsevit.data.sources.download`; CIFAR-10/100, STL-10, Flowers-102, Pets, Food-101, Fashion-MNIST);
            without ``root`` it goes to ``<cache>/datasets/<name>``.
        augment: train-time augmentation (:class:`~impulsevit.data.loading.config.AugmentConfig`: crop scale / ratio,
        flip,
            RandAugment, colour jitter, random erasing, repeated augmentation); a mapping or None (the defaults).
        resample_on: where the ffcv backend's training crops are resized to S × S: ``workers`` (FFCV's threads,
            the default) or ``device`` (the threads decode and copy the crop box; ``on_after_batch_transfer``
            resamples the batch on the training device, to the same bytes — for GPU runs whose loader threads
            are the bottleneck; on a CPU trainer it costs the training thread the resize, and a warning says
            so). Evaluation always resamples in the threads. Needs ``backend='ffcv'``.
        storage: ``.beton`` storage of the ffcv backend (:class:`~impulsevit.data.loading.config.StorageConfig`: preset,
            page cache, ready-made ``train_beton`` / ``val_beton``, integrity check, conversion limit); a mapping or
            None (the defaults).
    """

    def __init__(
        self,
        dataset: str = "fashion_mnist",
        root: str | None = None,
        backend: Backend = "ffcv",
        image_size: int = 224,
        batch_size: int = 64,
        num_workers: int = 2,
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        train_subset: int | None = None,
        val_subset: int | None = None,
        train_split: str | None = None,
        val_split: str | None = None,
        cache_dir: str | None = None,
        seed: int = 0,
        verify: Verify = "error",
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        download: bool = False,
        augment: AugmentConfig | None = None,
        storage: StorageConfig | None = None,
        resample_on: ResampleOn = "workers",
    ) -> None:
        aug: AugmentConfig = as_config(AugmentConfig, augment, "augment", section="data")
        store: StorageConfig = as_config(StorageConfig, storage, "storage", section="data")
        info = get_dataset(dataset)
        if download and root is None and info.needs_root and info.default_root is None:
            root = str(default_cache_dir() / "datasets" / info.name)
        if backend not in ("ffcv", "torchvision"):
            raise ConfigError(f"data.backend must be 'ffcv' or 'torchvision', got {backend!r}")
        if backend == "ffcv" and not ffcv_available():
            raise ImportError("backend='ffcv' needs the ffcv package (pip install 'impulsevit[ffcv]' after installing "
                              "libopencv-dev libturbojpeg0-dev pkg-config); use backend='torchvision' where FFCV "
                              "does not build")
        if backend == "ffcv" and interpolation not in ("bicubic", "bilinear"):
            raise ConfigError(f"interpolation {interpolation!r} is not supported on the ffcv backend (bicubic or "
                              f"bilinear); use backend='torchvision' for other filters")
        if resample_on not in ("workers", "device"):
            raise ConfigError(f"data.resample_on must be 'workers' or 'device', got {resample_on!r}")
        if resample_on == "device" and backend != "ffcv":
            raise ConfigError(f"data.resample_on='device' needs backend='ffcv' (the torchvision backend resizes in "
                              f"its workers), got backend={backend!r}")
        if not 0 < crop_pct <= 1:
            raise ConfigError(f"data.crop_pct must be in (0, 1], got {crop_pct}")
        if cache_dir and Path(cache_dir).exists() and not Path(cache_dir).is_dir():
            raise ConfigError(f"data.cache_dir {cache_dir} is a file, not a folder (expected a folder for the "
                              f"converted .beton files; give another path)")
        if root is not None and not download and store.train_beton is None and not Path(root).is_dir():
            what = "is a file, not a folder" if Path(root).exists() else "does not exist"
            raise ConfigError(f"data.root {root} {what} (dataset {info.name!r}"
                              + (f"; expected {info.layout.format(root=root)})" if info.layout else ")"))
        num_classes = info.num_classes
        if store.train_beton is not None:
            if backend != "ffcv":
                raise ConfigError("data.storage.train_beton/val_beton need backend='ffcv'")
            num_classes = beton_num_classes(store.train_beton)
        elif info.tree_classes is not None:  # the registration counts the classes of the tree (ImageFolder, IN-21K)
            if root is None and not num_classes:
                raise ConfigError(f"dataset={info.name!r} needs root"
                                  + (f" ({info.layout.format(root='ROOT')})" if info.layout else ""))
            if root is not None:
                counted = info.tree_classes(Path(root), train_split or info.train_split, val_split or info.val_split)
                num_classes = num_classes if counted is None else counted
        super().__init__(num_classes, image_size, batch_size, mean=tuple(mean or info.mean), std=tuple(std or info.std))
        # save_hyperparameters() records the arguments as they are at this point (``root`` after download's default),
        # the two blocks as plain dicts, as ImageClassifier does: checkpoints stay loadable with weights_only=True.
        augment, storage = dataclasses.asdict(aug), dataclasses.asdict(store)
        self.save_hyperparameters()
        self.info: DatasetInfo = info
        self.augment, self.storage = aug, store
        self.root, self.backend, self.num_workers = root, backend, check_num_workers(num_workers)
        self.crop_pct, self.interpolation = float(crop_pct), interpolation
        self.resample_on: ResampleOn = resample_on
        self.train_subset, self.val_subset = train_subset, val_subset
        self.train_split, self.val_split = train_split or info.train_split, val_split or info.val_split
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir() / "ffcv"
        self.seed, self.verify = int(seed), verify
        self.preset = PRESETS[store.preset] if store.preset else default_preset(info.small)
        self.betons = ({self.train_split: Path(store.train_beton), self.val_split: Path(store.val_beton)}
                       if store.train_beton else {})
        self.download = bool(download)
        self._device_augment: DeviceAugment | None = None
        self._augment_logged = False
        self._cpu_resample_warned = False
        self._sets: dict[str, SourceDataset] = {}
        self._explicit_norm = mean is not None or std is not None
        if self.betons:
            self.check_betons()

    # ------------------------------------------------------------------ sources and cached files
    def load_source(self, split: str) -> ImageSource:
        """The (subset of the) split as an :class:`ImageSource`.

        Raises:
            DataError: the split cannot be read from ``root`` (missing files, no images, other counts than the
                published dataset); the message names the dataset, split and path. ConfigError: the split does not
                fit the configuration (e.g. a class folder the training split lacks), with the same prefix.
        """
        try:
            source = self.info.load(self.root, split, verify=self.verify)
        except (FileNotFoundError, NotADirectoryError, ValueError) as e:
            kind = type(e) if isinstance(e, UserError) else DataError  # a ConfigError keeps its exit status (2)
            raise kind(f"dataset {self.info.name!r}, split {split!r}: {e}") from e
        k = self.train_subset if split == self.train_split else self.val_subset
        sub = subset_indices(len(source), k)
        return source.subset(sub) if sub is not None else source

    def beton_path(self, split: str) -> Path:
        """Cache path of the split's ``.beton``: dataset, split, preset, subset and a hash of the root in the name
        (or the file given as ``train_beton`` / ``val_beton``)."""
        if split in self.betons:
            return self.betons[split]
        k = self.train_subset if split == self.train_split else self.val_subset
        root_tag = hashlib.sha1(str(Path(self.root).resolve() if self.root else "default").encode()).hexdigest()[:8]
        sub = f"-n{k}" if k else ""
        return self.cache_dir / f"{self.info.name}-{split}-{self.preset.name}{sub}-{root_tag}.beton"

    def prepare_data(self) -> None:
        """``download``: fetch the dataset when missing. FFCV backend: convert the train and val splits to ``.beton``
        files unless they are up to date. Lightning runs this on local rank 0 only; the files are written atomically
        so other ranks never see partial ones, and a lock file next to each output makes concurrent converters (other
        nodes sharing the cache) wait and reuse it. In a multi-process run a split larger than ``storage.convert_limit``
        without a complete ``.beton`` stops the run at once with the ``impulsevit convert`` command to run."""
        if self.download:
            from impulsevit.data.sources.download import ensure_dataset

            ensure_dataset(self.info, self.root, verify=self.verify)
        if self.backend != "ffcv" or self.betons:
            return
        claim_output(self.cache_dir, False, "into", what="data.cache_dir")  # a file there: one line, not a traceback
        trainer = getattr(self, "trainer", None)
        world = int(getattr(trainer, "world_size", 0) or 0) or dist_info()[1]
        splits = list(dict.fromkeys((self.train_split, self.val_split)))
        if world > 1:
            too_big = [s for s in splits if read_manifest(self.beton_path(s)) is None
                       and self._split_size(s) > self.storage.convert_limit]
            if too_big:
                commands = "\n".join("  " + shlex.join(self.convert_command(s)) for s in too_big)
                raise RuntimeError(f"{self.info.name}: split(s) {', '.join(too_big)} have more than "
                                   f"data.storage.convert_limit={self.storage.convert_limit} images and no .beton yet; "
                                   f"a {world}-process run does not convert them inside the training job. Convert "
                                   f"first (one node, all its cores), then rerun:\n{commands}\n(`impulsevit submit` "
                                   f"does this as a separate job)")
        for split in splits:
            k = self.train_subset if split == self.train_split else self.val_subset
            convert_split(self.load_source(split), self.beton_path(split), self.preset,
                          workers=max(1, self.num_workers), on_error="skip", progress=False,
                          normalization=(self.info.mean, self.info.std),
                          request={"dataset": self.info.name, "root": self._root_tag(), "split": split, "subset": k})

    def _root_tag(self) -> str:
        return str(Path(self.root)) if self.root is not None else "None"

    def _split_size(self, split: str) -> int:
        """Images in ``split`` after the subset: the published count when the registry has one, else listed."""
        k = self.train_subset if split == self.train_split else self.val_subset
        published = self.info.split_sizes.get(split) or 0
        n = published if published > 0 else len(self.info.load(self.root, split, verify="off"))
        return min(n, k) if k else n

    def convert_command(self, split: str, workers: int | str | None = None) -> list[str]:
        """The ``impulsevit convert`` argv that writes exactly the ``.beton`` ``prepare_data`` would write for
        ``split`` (same path, preset, subset and request, so training then finds it up to date)."""
        k = self.train_subset if split == self.train_split else self.val_subset
        cmd = ["impulsevit", "convert", self.info.name, str(self.beton_path(split)), "--split", split,
               "--preset", self.preset.name, "--verify", self.verify, "--on-error", "skip", "--no-progress"]
        if self.root is not None:
            cmd += ["--root", self._root_tag()]
        if k:
            cmd += ["--subset", str(k)]
        if workers is not None:
            cmd += ["--workers", str(workers)]
        return cmd

    def splits_to_convert(self) -> list[str]:
        """FFCV splits whose ``.beton`` is missing or incomplete (no valid manifest); empty for other backends."""
        if self.backend != "ffcv" or self.betons:
            return []
        splits = dict.fromkeys((self.train_split, self.val_split))
        return [s for s in splits if read_manifest(self.beton_path(s)) is None]

    def check_betons(self) -> None:
        """Refuse (:class:`ConfigError`, one line naming each file, the field, its value and the run's) ``.beton``
        files whose manifests contradict the run: converted from another dataset, with another class count than the
        dataset's fixed one, another storage preset than an explicit ``data.storage.preset``, other statistics than
        the run's (unless ``data.mean`` / ``data.std`` are given: then they are deliberate), a ``train_subset`` /
        ``val_subset`` the given file does not have (a given ``.beton`` is used whole), or a train and val file with
        different class lists. ``verify='warn'`` / ``'off'`` allow a given file with another class count (a
        modified copy). Run on given files at construction (before any file is written) and on the cached
        files at ``setup``. A given file without a manifest (converted elsewhere) is used with one warning naming
        what cannot be checked."""
        splits = list(dict.fromkeys((self.train_split, self.val_split)))
        paths = {split: self.beton_path(split) for split in splits}
        manifests = {split: read_manifest(path, check_size=False) for split, path in paths.items()}
        explicit = bool(self.betons)
        what = {split: (f"data.storage.{'train' if split == self.train_split else 'val'}_beton {paths[split]}"
                        if explicit else f"cached {paths[split]}") for split in splits}
        unchecked = [str(paths[s]) for s in splits if manifests[s] is None]
        if explicit and unchecked:
            rank_zero_warn(f"{' and '.join(unchecked)}: no manifest ({manifest_path(unchecked[0]).name}; not written "
                           f"by `impulsevit convert`): the dataset, class list, storage preset and statistics it was "
                           f"converted with cannot be checked against this run (data.dataset {self.info.name!r} "
                           f"supplies mean/std, the labels the class count)")
        # a dataset's fixed class count, for given files under verify='error' (a cached file was converted from the
        # source under the run's own `verify`, which may accept a modified copy)
        fixed = self.info.num_classes if (explicit and self.verify == "error" and self.info.num_classes > 0
                                          and self.info.tree_classes is None) else None
        problems: dict[str, list[str]] = {}  # phrase -> the files it applies to
        for split in splits:
            manifest = manifests[split]
            if manifest is None:
                continue
            found = identity_mismatches(
                self._canonical(manifest), dataset=self.info.name, num_classes=fixed,
                preset=self.storage.preset if explicit else None,
                normalization=None if self._explicit_norm else (self.mean, self.std))
            k = self.train_subset if split == self.train_split else self.val_subset
            kept = (manifest.get("request") or {}).get("subset")
            if explicit and k and kept != k and int(manifest.get("num_samples", 0)) > k:
                key = "train_subset" if split == self.train_split else "val_subset"
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

    @staticmethod
    def _canonical(manifest: dict) -> dict:
        """``manifest`` with its ``request.dataset`` as the registry's canonical name (an alias or an unregistered
        name as it is)."""
        name = (manifest.get("request") or {}).get("dataset")
        if name is None:
            return manifest
        try:
            name = get_dataset(str(name)).name
        except (KeyError, ValueError):
            return manifest
        return {**manifest, "request": {**manifest["request"], "dataset": name}}

    def train_samples(self) -> int | None:
        """Training images per epoch, before any conversion or write: a given ``.beton``'s manifest (else its
        header), a complete cached ``.beton``'s manifest, else the split's published count or listing after
        ``train_subset``; None when the split cannot be read yet (``setup`` then says why)."""
        split = self.train_split
        try:
            if self.backend == "ffcv":
                path = self.beton_path(split)
                manifest = read_manifest(path, check_size=not self.betons)
                if manifest is not None:
                    return int(manifest["num_samples"])
                if self.betons:
                    return check_header(path)
            return self._split_size(split)
        except (OSError, ValueError, KeyError, BetonError):
            return None

    def check_train_loader(self, num_samples: int, world_size: int) -> None:
        split, k = self.train_split, self.train_subset
        where = f" (data.storage.train_beton {self.betons[split]})" if split in self.betons else \
            f" (data.train_subset={k})" if k else ""
        check_train_batches(num_samples, self.batch_size, world_size, repeats=self.augment.repeated_aug,
                            what=f"the training split {split!r} of dataset {self.info.name!r}{where}",
                            more="raise data.train_subset" if k and split not in self.betons
                            else "use more training images")

    def setup(self, stage: str | None = None) -> None:
        if self.backend == "ffcv":
            for split in dict.fromkeys((self.train_split, self.val_split)):
                if not self.beton_path(split).is_file():
                    raise FileNotFoundError(f"{self.beton_path(split)} is missing: prepare_data() converts it (the "
                                            f"Trainer calls it; call dm.prepare_data() when using the datamodule "
                                            f"by hand)")
                path = self.beton_path(split)
                manifest = read_manifest(path, check_size=False)
                verify_beton(path, manifest, self.storage.beton_check, first_use_full=True)
                if manifest is not None and manifest.get("classes") and self.class_names is None:
                    self.class_names = [str(c) for c in manifest["classes"]]  # the train split's, listed first
            if not self.betons:
                self.check_betons()  # the given files were checked at construction
            return
        train_tf, eval_tf = self._timm_transforms()
        if stage in (None, "fit"):
            self._sets["train"] = SourceDataset(self.load_source(self.train_split), train_tf, seed=self.seed)
        self._sets["val"] = SourceDataset(self.load_source(self.val_split), eval_tf)
        self.class_names = list(self._sets["train" if "train" in self._sets else "val"].source.classes)

    def eval_data_config(self) -> dict:
        """The evaluation transform of both backends in timm's terms: resize the shorter side to
        ``floor(S / crop_pct)`` with ``interpolation``, centre crop ``S``, normalise with ``mean`` / ``std``."""
        return {**super().eval_data_config(), "interpolation": self.interpolation, "crop_pct": self.crop_pct}

    def describe(self) -> str:
        subsets = "".join(f", {what} subset of {k}" for what, k in (("train", self.train_subset),
                                                                     ("val", self.val_subset)) if k)
        return f"{self.info.name} (train split {self.train_split!r}, val split {self.val_split!r}{subsets})"

    def _timm_transforms(self):  # noqa: ANN202
        """timm's ImageNet train/eval transforms (what ``create_transform`` builds; called directly because
        ``create_transform`` does not pass ``force_color_jitter``), in prefetcher mode: uint8 CHW tensors out."""
        from timm.data.transforms_factory import transforms_imagenet_eval, transforms_imagenet_train

        common = dict(interpolation=self.interpolation, mean=self.mean, std=self.std, use_prefetcher=True)
        aug = self.augment
        train = transforms_imagenet_train(self.image_size, scale=aug.scale, ratio=aug.ratio, hflip=aug.hflip,
                                          color_jitter=aug.color_jitter or None,
                                          force_color_jitter=aug.force_color_jitter, auto_augment=aug.auto_augment,
                                          re_prob=0.0, **common)
        evaluate = transforms_imagenet_eval(self.image_size, crop_pct=self.crop_pct, **common)
        fix_timm_posterize(train)
        return train, evaluate

    # ------------------------------------------------------------------ loaders
    def _ffcv(self, train: bool):  # noqa: ANN202
        split = self.train_split if train else self.val_split
        epoch = self.trainer.current_epoch if getattr(self, "trainer", None) is not None else 0
        trainer = getattr(self, "trainer", None)
        device = trainer.strategy.root_device if trainer is not None else None
        loader = build_ffcv_loader(self.beton_path(split), train=train, image_size=self.image_size,
                                   batch_size=self.batch_size, num_workers=self.num_workers,
                                   scale=self.augment.scale, ratio=self.augment.ratio, hflip=self.augment.hflip,
                                   crop_pct=self.crop_pct, interpolation=self.interpolation, seed=self.seed,
                                   in_memory=self.storage.in_memory,
                                   repeated_aug=self.augment.repeated_aug if train else 1, device=device,
                                   resample_on=self.resample_on)
        if train:
            self.check_train_loader(len(loader.loader.indices), dist_info()[1])
        loader.sampler.set_epoch(epoch)
        return self.stateful_train_loader(loader) if train else loader

    def _torch_loader(self, train: bool) -> DataLoader:
        key = "train" if train else "val"
        if key not in self._sets:
            self.setup("fit" if train else "validate")
        ds = self._sets[key]
        rank, world = dist_info()
        # Explicit generators: a DataLoader without one draws its worker base seed from torch's global RNG at every
        # iter(), which would shift the training stream (drop path, mixup) between fresh and resumed runs.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + rank)
        common = dict(batch_size=self.batch_size, num_workers=self.num_workers, generator=generator,
                      persistent_workers=self.num_workers > 0, pin_memory=torch.cuda.is_available(),
                      worker_init_fn=worker_init_fn(rank))
        if train:
            self.check_train_loader(len(ds), world)
            # The order is a function of (seed, epoch) and the epoch is set here: on a resumed run Lightning fetches
            # the first batch before its own set_epoch call.
            sampler = EpochSampler(ds, num_replicas=world, rank=rank, seed=self.seed,
                                   repeats=self.augment.repeated_aug, batch_size=self.batch_size)
            trainer = getattr(self, "trainer", None)
            sampler.set_epoch(trainer.current_epoch if trainer is not None else 0)
            return self.stateful_train_loader(ResumableDataLoader(ds, sampler=sampler, drop_last=True, **common))
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False, seed=self.seed) \
            if world > 1 else None
        return DataLoader(ds, sampler=sampler, drop_last=False, **common)

    def train_dataloader(self):  # noqa: ANN201 - FFCVLoader or DataLoader
        return self._ffcv(True) if self.backend == "ffcv" else self._torch_loader(True)

    def val_dataloader(self):  # noqa: ANN201
        return self._ffcv(False) if self.backend == "ffcv" else self._torch_loader(False)

    def test_dataloader(self):  # noqa: ANN201
        return self.val_dataloader()

    def predict_dataloader(self):  # noqa: ANN201
        return self.val_dataloader()

    # ------------------------------------------------------------------ device side
    def device_augment(self) -> DeviceAugment:
        """The training-batch augmenter, created on first use with this process's rank (so ranks draw differently).
        The ffcv backend runs RandAugment / colour jitter here; the torchvision backend ran them in its workers."""
        if self._device_augment is None:
            rank = getattr(getattr(self, "trainer", None), "global_rank", None)
            on_device, aug = self.backend == "ffcv", self.augment
            self._device_augment = DeviceAugment(
                self.mean, self.std, auto_augment=aug.auto_augment if on_device else None,
                color_jitter=aug.color_jitter if on_device else None, force_color_jitter=aug.force_color_jitter,
                re_prob=aug.re_prob, re_mode=aug.re_mode, re_count=aug.re_count, seed=self.seed,
                rank=dist_info()[0] if rank is None else int(rank), interpolation=self.interpolation)
        return self._device_augment

    def _log_augment_strategy(self, device: torch.device) -> None:
        """Say once which way the training augmentation runs on ``device`` (the choice is automatic)."""
        aug = self.device_augment()
        if self._augment_logged or (aug.rand_augment is None and aug.color_jitter is None):
            return
        self._augment_logged = True
        how = ("each op on the images that drew it (Pillow for the geometric ops and Equalize)"
               if selects_on_host(device) else "every op on the whole batch, kept per image (sync-free)")
        rank_zero_info(f"augmentation on {device.type}: {how}; same draws and pixels either way")

    def train_pixels(self, images: torch.Tensor) -> torch.Tensor:
        """A training loader's image batch → uint8 ``(B, 3, S, S)``: with ``resample_on='device'`` the FFCV canvas
        batch ``(B, 3, K + 1, K)`` resampled where it lies
        (:func:`~impulsevit.data.loading.device_resample.resample_canvas`, the workers' pixels byte for byte), else
        the batch unchanged."""
        if self.resample_on != "device":
            return images
        if images.device.type == "cpu" and not self._cpu_resample_warned:
            self._cpu_resample_warned = True
            rank_zero_warn("data.resample_on='device' on a CPU trainer: the crop resample runs in the training thread "
                           "with torch, 10-50x the workers' cost per image (docs/benchmarks.md); it is meant for GPU "
                           "runs, 'workers' gives the same pixels faster here")
        return resample_canvas(images, self.image_size, self.interpolation)

    def batch_augment(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 training batch → augmented, normalised float32 (labels unchanged: mixup is the module's). The draws
        are keyed by (epoch, index of the batch in the epoch), Lightning's restored loop counters on a resumed run."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return self.device_augment()(images), labels
        # batch_to_device runs before the loop counts the batch as ready: `ready` is this batch's index in the epoch
        step = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        self._log_augment_strategy(images.device)
        return self.device_augment()(images, epoch=trainer.current_epoch, step=step), labels

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):  # noqa: ANN001, ANN201
        """Batches the FFCV pipeline already put on ``device`` (its ``ToDevice`` stage on GPU runs) pass through
        untouched; anything else is moved as Lightning does."""
        if all(isinstance(t, torch.Tensor) and t.device == device for t in batch):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):  # noqa: ANN001, ANN201 - Lightning hook
        images, labels = batch[0], batch[1]
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.training:
            images, labels = self.batch_augment(self.train_pixels(images), labels)
        else:
            images = normalize(images, self.mean, self.std)
        return images, labels.long()
