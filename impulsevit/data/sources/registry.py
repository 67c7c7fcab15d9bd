"""Dataset registry: what each supported dataset looks like (classes, split sizes, normalisation) and how to read it.

``get_dataset(name)`` returns a :class:`DatasetInfo`; ``info.load(root, split)`` reads the split from its real on-disk
format (see :mod:`impulsevit.data.sources.formats`) and checks the class count and image count against the published
numbers.
With ``verify="error"`` (the default) a mismatch raises :class:`DatasetMismatchError` naming the root, split, what was
found and what was expected; ``"warn"`` downgrades it to a warning (a deliberately trimmed copy); ``"off"`` skips it.

``imagefolder`` is the entry for anything else: ``root/{train,val}/<class>/<image>``; it has no expected numbers and
uses ImageNet's normalisation statistics unless told otherwise.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

from impulsevit.data.sources import formats
from impulsevit.data.sources.image_source import ImageSource

__all__ = ["DATASETS", "DatasetInfo", "DatasetMismatchError", "detect_dataset", "get_dataset", "list_datasets"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Verify = Literal["error", "warn", "off"]


class DatasetMismatchError(ValueError):
    """The files on disk do not hold the dataset the registry describes (wrong counts or class count)."""


@dataclass(frozen=True)
class DatasetInfo:
    """One registry entry.

    Attributes:
        name: registry key (lower case).
        num_classes: number of classes.
        split_sizes: expected image count per split name (empty for ``imagefolder``).
        train_split / val_split: the splits a datamodule trains and validates on by default.
        mean / std: per-channel normalisation statistics on the 0–1 scale (grayscale sets repeat one value).
        reader: ``reader(root, split) -> ImageSource``.
        markers: paths relative to a root whose presence identifies this dataset (for :func:`detect_dataset`).
        default_root: where the data lives when no root is given (None: a root is required).
        small: images are small (≤ 96 px): convert to raw pixels, not JPEG.
        needs_root: False when the data ships with a package (sklearn digits).
        releases: published ``(classes, images)`` of the whole dataset per release name, for datasets without a fixed
            split (ImageNet-21K): the count check compares the tree (both splits together) against these totals.
        tree_size: ``tree_size(root) -> (classes, images)`` of the whole tree (with ``releases``).
    """

    name: str
    num_classes: int
    split_sizes: dict[str, int]
    train_split: str
    val_split: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    reader: Callable[[Path | None, str], ImageSource]
    markers: tuple[str, ...] = ()
    default_root: str | None = None
    small: bool = False
    needs_root: bool = True
    description: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)
    releases: dict[str, tuple[int, int]] = field(default_factory=dict)
    tree_size: Callable[[Path], tuple[int, int]] | None = None

    def resolve_root(self, root: str | os.PathLike | None) -> Path | None:
        if root is None and self.needs_root and self.default_root is None:
            raise ValueError(f"dataset {self.name!r} needs a root folder (it cannot be downloaded here); expected "
                             f"a folder holding {' or '.join(self.markers) or 'the dataset'}")
        if root is None:
            return Path(self.default_root) if self.default_root else None
        return Path(root)

    def load(self, root: str | os.PathLike | None, split: str, verify: Verify = "error") -> ImageSource:
        """Read ``split`` from ``root``; check class and image counts per ``verify`` (see module docstring)."""
        if self.split_sizes and split not in self.split_sizes:
            raise ValueError(f"dataset {self.name!r} has splits {sorted(self.split_sizes)}, not {split!r}")
        resolved = self.resolve_root(root)
        source = self.reader(resolved, split)
        if verify != "off" and self.releases:
            msg = self._release_mismatch(resolved)
            if msg and verify == "error":
                raise DatasetMismatchError(msg + "; pass verify='warn' to use a modified copy")
            if msg:
                warnings.warn(msg, stacklevel=2)
        elif verify != "off" and self.split_sizes:
            problems = []
            if len(source.classes) != self.num_classes:
                problems.append(f"{len(source.classes)} classes, expected {self.num_classes}")
            if len(source) != self.split_sizes[split]:
                problems.append(f"{len(source)} images, expected {self.split_sizes[split]}")
            if problems:
                msg = (f"{self.name} split {split!r} at {resolved}: found {' and '.join(problems)} "
                       f"(the published {self.description or self.name})")
                if verify == "error":
                    raise DatasetMismatchError(msg + "; pass verify='warn' to use a modified copy")
                warnings.warn(msg, stacklevel=2)
        return source

    def _release_mismatch(self, root: Path | None) -> str | None:
        """None when the whole tree holds a published release's class and image totals, else what was found."""
        assert self.tree_size is not None and root is not None
        classes, images = self.tree_size(root)
        if (classes, images) in self.releases.values():
            return None
        published = "; ".join(f"{name}: {c:,} classes, {n:,} images" for name, (c, n) in self.releases.items())
        return (f"{self.name} at {root}: the tree holds {classes:,} classes and {images:,} images (both splits), "
                f"which is no published release ({published})")


DATASETS: dict[str, DatasetInfo] = {}


def _register(info: DatasetInfo) -> None:
    DATASETS[info.name] = info
    for alias in info.aliases:
        DATASETS[alias] = info


_register(DatasetInfo(
    "cifar10", 10, {"train": 50_000, "test": 10_000}, "train", "test",
    (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), partial(formats.read_cifar, num_classes=10),
    markers=("cifar-10-batches-py/batches.meta", "batches.meta"), small=True, description="CIFAR-10",
    aliases=("cifar-10",)))
_register(DatasetInfo(
    "cifar100", 100, {"train": 50_000, "test": 10_000}, "train", "test",
    (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), partial(formats.read_cifar, num_classes=100),
    markers=("cifar-100-python/meta",), small=True, description="CIFAR-100", aliases=("cifar-100",)))
_register(DatasetInfo(
    "stl10", 10, {"train": 5_000, "test": 8_000}, "train", "test",
    (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713), formats.read_stl10,
    markers=("stl10_binary/train_X.bin", "train_X.bin"), small=True, description="STL-10 labelled splits",
    aliases=("stl-10",)))
_register(DatasetInfo(
    "flowers102", 102, {"train": 1_020, "val": 1_020, "test": 6_149, "trainval": 2_040}, "trainval", "test",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_flowers102, markers=("flowers-102/setid.mat", "setid.mat"),
    description="Oxford Flowers-102", aliases=("flowers", "oxford_flowers102")))
_register(DatasetInfo(
    "pets", 37, {"trainval": 3_680, "test": 3_669}, "trainval", "test",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_pets,
    markers=("oxford-iiit-pet/annotations/trainval.txt", "annotations/trainval.txt"),
    description="Oxford-IIIT Pets", aliases=("oxford_pets", "oxford-iiit-pet")))
_register(DatasetInfo(
    "food101", 101, {"train": 75_750, "test": 25_250}, "train", "test",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_food101, markers=("food-101/meta/train.json", "meta/train.json"),
    description="Food-101", aliases=("food-101",)))
_register(DatasetInfo(
    "imagenet", 1000, {"train": 1_281_167, "val": 50_000}, "train", "val",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_imagenet,
    markers=("ILSVRC/Data/CLS-LOC/train", "LOC_val_solution.csv"), description="ImageNet-1K (ILSVRC-2012)",
    aliases=("imagenet1k", "in1k", "imagenet-1k")))
_register(DatasetInfo(
    "imagenet21k", 19_167, {"train": 0, "val": 0}, "train", "val",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_imagenet21k, markers=formats.IMAGENET21K_RELEASES,
    description="ImageNet-21K full release (winter21_whole or fall11_whole; validation = the first min(50, n // 2) "
                "images of each class)",
    aliases=("in21k", "imagenet-21k", "imagenet21k_winter21"),
    releases={"winter21_whole": (19_167, 13_153_500), "fall11_whole": (21_841, 14_197_122)},
    tree_size=formats.imagenet21k_tree_size))
_register(DatasetInfo(
    "fashion_mnist", 10, {"train": 60_000, "test": 10_000}, "train", "test",
    (0.2860,) * 3, (0.3530,) * 3, formats.read_fashion_mnist,
    markers=("FashionMNIST/raw/train-images-idx3-ubyte", "FashionMNIST/raw/train-images-idx3-ubyte.gz"),
    default_root=formats.FASHION_MNIST_SYSTEM_DIR, small=True, description="Fashion-MNIST",
    aliases=("fashion-mnist", "fashionmnist")))
_register(DatasetInfo(
    "digits", 10, {"train": 1_437, "test": 360}, "train", "test",
    (0.3053,) * 3, (0.3759,) * 3, formats.read_digits, small=True, needs_root=False,
    description="scikit-learn digits (1,797 8x8 images)", aliases=("sklearn_digits",)))
_register(DatasetInfo(
    "imagefolder", 0, {}, "train", "val", IMAGENET_MEAN, IMAGENET_STD, formats.read_image_folder_split,
    description="generic ImageFolder tree", aliases=("image_folder",)))


def get_dataset(name: str) -> DatasetInfo:
    """The registry entry for ``name`` (case-insensitive; aliases accepted)."""
    key = name.lower()
    if key not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(list_datasets())}")
    return DATASETS[key]


def list_datasets() -> list[str]:
    """Registry names (without aliases)."""
    return sorted({info.name for info in DATASETS.values()})


def detect_dataset(root: str | os.PathLike) -> DatasetInfo | None:
    """The registry entry whose marker files exist under ``root`` (a torchvision-style dataset folder), else None."""
    root = Path(root)
    for name in list_datasets():
        info = DATASETS[name]
        if any((root / m).exists() for m in info.markers):
            return info
    return None
