"""Typed configuration blocks of :class:`~impulsevit.data.loading.datamodule.ImageDataModule` (``data.augment``,
``data.storage``).

Plain dataclasses, as ``ImageClassifier``'s blocks (:mod:`impulsevit.training.config`): LightningCLI / jsonargparse
accepts a mapping in a recipe and dotted overrides (``--data.init_args.augment.re_prob=0.25``), and a misspelled key or
a value of the wrong type is an error naming the key. Each block checks its ranges in ``__post_init__`` and raises a
one-line :class:`~impulsevit.errors.ConfigError` (a ``ValueError``) naming the key (``data.augment.re_prob must be in
[0, 1], got 1.5``), which ``impulsevit fit`` prints as that one line.

What lives where: the keys a user types most stay at the top level of ``data.init_args`` (``dataset``, ``root``,
``backend``, ``image_size``, ``batch_size``, ``num_workers``, ``cache_dir``, ``train_subset`` / ``val_subset``), and so
do the evaluation transform (``crop_pct``, ``interpolation``, ``mean`` / ``std``), the splits, ``seed``, ``verify``
(the registry's count check of the source, on both backends) and ``download``. The train-time augmentation is
``augment``; how the FFCV backend stores and reads ``.beton`` files is ``storage`` (ignored by the torchvision backend,
except that ``train_beton`` / ``val_beton`` require FFCV).

Example recipe fragment::

    data:
      class_path: impulsevit.data.ImageDataModule
      init_args:
        dataset: imagenet
        root: /datasets/imagenet
        image_size: 224
        augment: {auto_augment: rand-m9-mstd0.5-inc1, color_jitter: 0.3, re_prob: 0.25, repeated_aug: 3}
        storage: {preset: short256}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from impulsevit.data.storage.integrity import CheckLevel
from impulsevit.data.storage.presets import PRESETS
from impulsevit.errors import ConfigError

__all__ = ["AugmentConfig", "StorageConfig"]

EraseMode = Literal["pixel", "rand", "const"]


def _pair(value: tuple[float, float] | list[float], key: str) -> tuple[float, float]:
    """``value`` as a ``(lo, hi)`` float pair with ``lo <= hi``; :class:`ConfigError` naming ``key`` otherwise."""
    pair = tuple(float(v) for v in value)
    if len(pair) != 2 or pair[0] > pair[1]:
        raise ConfigError(f"{key} must be a pair [lo, hi] with lo <= hi, got {list(value)}")
    return pair  # type: ignore[return-value]


@dataclass
class AugmentConfig:
    """Train-time augmentation (DeiT / timm ``transforms_imagenet_train``); evaluation batches get none of it.

    The crop and flip run in the loader (FFCV's decoder or timm's transform in ``DataLoader`` workers). On the ffcv
    backend RandAugment, colour jitter and random erasing run on the device on the uint8 / normalised batch
    (:class:`~impulsevit.data.augment.device.DeviceAugment`); on the torchvision backend RandAugment and colour jitter
    run in
    the workers and random erasing on the device (as timm's prefetcher does).

    Attributes:
        scale: RandomResizedCrop area range, as fractions of the source image's area, ``0 < lo <= hi <= 1``.
        ratio: RandomResizedCrop aspect-ratio range (width / height), ``0 < lo <= hi``.
        hflip: probability of a horizontal flip, in ``[0, 1]``.
        auto_augment: timm RandAugment string (``rand-m9-mstd0.5-inc1``) or None (off). Not supported on the ffcv
            backend: AutoAugment / AugMix policies.
        color_jitter: colour-jitter strength (brightness = contrast = saturation factor range ``1 ± value``), ``>= 0``;
            None or 0: off. Ignored while RandAugment is on unless ``force_color_jitter`` (timm's rule).
        force_color_jitter: apply ``color_jitter`` even with RandAugment on.
        re_prob: probability that an image gets random erasing (timm ``RandomErasing``), in ``[0, 1]``; 0: off.
        re_mode: erasing fill: ``pixel`` (per-pixel normal noise), ``rand`` (one normal colour per box) or ``const``
            (zeros), in normalised units.
        re_count: maximum number of erased boxes per image, ``>= 1``.
        repeated_aug: copies of every image per epoch, each augmented differently (DeiT's RASampler; 3 under DDP in
            DeiT), ``>= 1``; 1 = off. An epoch keeps its number of steps and sees about ``1 / repeated_aug`` of the
            distinct images (:mod:`impulsevit.data.loading.sampling`).
    """

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    auto_augment: str | None = None
    color_jitter: float | None = None
    force_color_jitter: bool = False
    re_prob: float = 0.0
    re_mode: EraseMode = "pixel"
    re_count: int = 1
    repeated_aug: int = 1

    def __post_init__(self) -> None:
        self.scale = _pair(self.scale, "data.augment.scale")
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ConfigError(f"data.augment.scale must satisfy 0 < lo <= hi <= 1 (fractions of the image area), "
                             f"got {list(self.scale)}")
        self.ratio = _pair(self.ratio, "data.augment.ratio")
        if self.ratio[0] <= 0:
            raise ConfigError(f"data.augment.ratio must be positive, got {list(self.ratio)}")
        if not 0 <= self.hflip <= 1:
            raise ConfigError(f"data.augment.hflip must be in [0, 1], got {self.hflip}")
        if self.color_jitter is not None and self.color_jitter < 0:
            raise ConfigError(f"data.augment.color_jitter must be >= 0 or null, got {self.color_jitter}")
        if not 0 <= self.re_prob <= 1:
            raise ConfigError(f"data.augment.re_prob must be in [0, 1], got {self.re_prob}")
        if self.re_mode not in ("pixel", "rand", "const"):
            raise ConfigError(f"data.augment.re_mode must be 'pixel', 'rand' or 'const', got {self.re_mode!r}")
        if self.re_count < 1:
            raise ConfigError(f"data.augment.re_count must be >= 1, got {self.re_count}")
        if self.repeated_aug < 1:
            raise ConfigError(f"data.augment.repeated_aug must be >= 1, got {self.repeated_aug}")


LOADERS = ("threads", "processes")
"""The values of ``data.storage.loader`` (:class:`StorageConfig`)."""


@dataclass
class StorageConfig:
    """How the ffcv backend stores and reads the ``.beton`` files (the torchvision backend reads the source files and
    ignores this block; ``train_beton`` / ``val_beton`` need the ffcv backend).

    Attributes:
        preset: conversion preset name (:data:`impulsevit.data.storage.presets.PRESETS`: ``raw``, ``short256``,
        ``res256``,
            ...); None: ``raw`` for small-image datasets, ``short256`` otherwise. Part of the cached file's name.
        in_memory: ffcv backend: FFCV's OS page cache (True) or its process-level cache (False, for files larger
            than the page cache); None: True when the file fits in half the available memory. litdata backend, a
            remote set in the block order read by loader threads: its live chunks held in the training process's
            memory (True) or in files of the cache folder (False); None: memory when the live blocks of the node's
            ranks fit in half the available memory (``docs/data.md``). ``DataLoader`` worker processes always share
            the cache folder.
        train_beton / val_beton: paths of ``.beton`` files written by ``impulsevit convert``, used as they are instead
            of converting ``dataset`` (give both or neither); ``dataset`` then only supplies the normalisation
            statistics (``imagefolder``: ImageNet's) and the class count comes from the manifest. A file whose
            manifest names another dataset, class count, ``preset`` (when given), statistics or ``train_subset`` /
            ``val_subset`` than the run, or a train and val file with different class lists, is refused before any
            work (:func:`~impulsevit.data.loading.ffcv_backend.check_betons`); a file without a
            manifest (converted elsewhere) is used with one warning saying what cannot be checked.
        beton_check: at setup, check each ``.beton`` against its manifest's checksum
            (:mod:`impulsevit.data.storage.integrity`): ``sampled`` (header, size and sampled chunks; the first use of a
            file
            checks every byte and records it in ``X.verified.json``; a sampled check finds one damaged 4 MiB chunk
            of ``n > 10`` with probability ``8 / (n - 2)``), ``full`` (every byte, every time) or ``off``.
        cache_size: the litdata backend's local cache of a remote shard set (``s3://``): the most disk its
            downloaded chunks may use, in LitData's ``max_cache_size`` terms (``"200GB"``, ``"500MB"``); chunks
            beyond it are evicted oldest first and fetched again when read again (``docs/data.md``: cache size and
            network). Ignored for local shard sets and the other backends.
        read_timeout: seconds, ``> 0``: how long one chunk download of the litdata backend may wait for data from the
            store before the attempt fails (botocore's ``read_timeout``). A store that stops answering mid-epoch is
            reported after the retries of botocore, s3transfer and LitData (on the loopback test store: about 50 s at
            2 s, 2 min 15 s at the default); raise it for large chunks on a slow link. Ignored for local shard sets
            and the other backends.
        block_size: samples, ``>= 1``: the block of ``data.order='block'`` (litdata backend; what ``auto`` picks
            for a set converted ``--shuffle``): each rank's share of an epoch is read a block at a time, its samples
            shuffled within the block, so a block's chunks are what a rank needs on disk at once (with the next
            block's, downloading meanwhile). Larger:
            closer to a global shuffle, more cache (``docs/data.md``: block order).
        loader: how the litdata backend's training loader fills batches on its fast path (a crop and flip with
            nothing after them: no RandAugment, no colour jitter): ``threads`` (the default: ``num_workers`` threads
            of the training process write into the batch tensors, as FFCV's loader;
            :mod:`~impulsevit.data.loading.threaded_loader`) or ``processes`` (``DataLoader`` worker processes, the
            path of every other case). The same batches either way. Ignored by the other backends.
        convert_limit: images, ``>= 0``. In a multi-process run (world size > 1) ``prepare_data`` does not convert a
            split larger than this: it stops with the ``impulsevit convert`` command to run first (``impulsevit
            submit`` submits that as its own job). Single-process runs convert any size.
    """

    preset: str | None = None
    in_memory: bool | None = None
    train_beton: str | None = None
    val_beton: str | None = None
    beton_check: CheckLevel = "sampled"
    convert_limit: int = 200_000
    cache_size: str = "200GB"
    read_timeout: float = 30.0
    block_size: int = 65536
    loader: str = "threads"

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError(f"data.storage.preset: unknown preset {self.preset!r}; known: {sorted(PRESETS)}")
        if (self.train_beton is None) != (self.val_beton is None):
            raise ConfigError("give both data.storage.train_beton and data.storage.val_beton (files written by "
                             "`impulsevit convert`), or neither")
        if self.beton_check not in ("sampled", "full", "off"):
            raise ConfigError(f"data.storage.beton_check must be 'sampled', 'full' or 'off', got {self.beton_check!r}")
        from impulsevit.io import parse_size

        parse_size(self.cache_size, "data.storage.cache_size")
        if not self.read_timeout > 0:
            raise ConfigError(f"data.storage.read_timeout must be > 0 seconds, got {self.read_timeout}")
        if self.block_size < 1:
            raise ConfigError(f"data.storage.block_size must be >= 1 samples, got {self.block_size}")
        if self.loader not in LOADERS:
            raise ConfigError(f"data.storage.loader must be one of {', '.join(LOADERS)}, got {self.loader!r}")
        if self.convert_limit < 0:
            raise ConfigError(f"data.storage.convert_limit must be >= 0, got {self.convert_limit}")
