"""Dataset registry: what each supported dataset looks like (classes, split sizes, normalisation) and how to read it.

``get_dataset(name)`` returns a :class:`DatasetInfo`; ``info.load(root, split)`` reads the split from its real on-disk
format (see :mod:`impulsevit.data.sources.formats`) and checks the class count and image count against the published
numbers.
With ``verify="error"`` (the default) a mismatch raises :class:`DatasetMismatchError` naming the root, split, what was
found and what was expected; ``"warn"`` downgrades it to a warning (a deliberately trimmed copy); ``"off"`` skips it.

Where a dataset lives when no root is given (:meth:`DatasetInfo.default_location`): its registration's
``default_root`` when that folder exists (a system copy: Debian's ``dataset-fashion-mnist`` in
``/usr/share/datasets/fashion-mnist``), else, for a dataset with a ``download``, ``<data home>/<name>`` with the data
home :func:`data_home` (``$IMPULSEVIT_DATA``, else ``<cache>/datasets`` with the cache of :func:`cache_home`:
``$IMPULSEVIT_CACHE``, else ``$XDG_CACHE_HOME/impulsevit``, else ``~/.cache/impulsevit``), the user cache a
``pip install`` user expects, filled by ``download: true`` or ``impulsevit download``.

``imagefolder`` is the entry for anything else: ``root/{train,val}/<class>/<image>``; it has no expected numbers and
uses ImageNet's normalisation statistics unless told otherwise.

:func:`register_dataset` is the one way a dataset enters the registry — the built-ins below and a user's own module
alike (exported as ``impulsevit.data.register_dataset``; the module is imported by ``impulsevit`` as a plugin, see
:mod:`impulsevit.cli.extensions`). Its :class:`DatasetInfo` says everything the datamodule, ``impulsevit convert`` and
``impulsevit download`` use: the reader, class and image counts, splits, statistics, how to count the classes of a
tree without a fixed count, and how to download it::

    from impulsevit.data import DatasetInfo, register_dataset

    register_dataset(DatasetInfo(name="tiny", num_classes=3, split_sizes={"train": 48, "val": 12},
                                 train_split="train", val_split="val", mean=(0.5,) * 3, std=(0.25,) * 3,
                                 reader=read_tiny, small=True, needs_root=False, download=fetch_tiny))
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
from impulsevit.data.sources.image_source import ImageSource, image_folder_source
from impulsevit.errors import ConfigError

__all__ = ["DATASETS", "DatasetInfo", "DatasetMismatchError", "TorchvisionDownload", "detect_dataset",
           "downloadable", "get_dataset", "list_datasets", "register_dataset"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Verify = Literal["error", "warn", "off"]


_USE_A_MODIFIED_COPY = ("; to use a modified copy pass --data.init_args.verify=warn (impulsevit download / convert: "
                        "--verify warn)")
"""The end of a count mismatch's message: the setting that accepts a modified copy, as each command spells it."""


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
        tree_classes: ``tree_classes(root, train_split, val_split) -> int | None``: the class count of the tree at
            ``root`` for a dataset whose count is not fixed (``imagefolder``, ImageNet-21K's releases); None keeps
            ``num_classes``; raises :class:`~impulsevit.errors.ConfigError` naming the layout it expected. A dataset
            with ``num_classes=0`` and this set needs a root.
        layout: the folder layout under ``{root}`` a missing root's message quotes (``str.format`` with ``root``).
        download: ``download(root)`` fetches every split the reader reads into ``root`` (None: not downloadable);
            what ``impulsevit download NAME ROOT`` and the datamodule's ``download: true`` call.
        manual_download: for a dataset that cannot be fetched automatically, what to obtain and how to lay it out.
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
    tree_classes: Callable[[Path, str, str], int | None] | None = None
    layout: str = ""
    download: Callable[[Path], None] | None = None
    manual_download: str = ""

    def default_location(self) -> Path | None:
        """The folder read when no root is given (module docstring): ``default_root`` if it is a folder, else
        ``data_home() / name`` for a downloadable dataset, else ``default_root`` (may not exist: the reader says what
        is missing) or None (a root is required, or none is needed: ``needs_root=False``)."""
        if not self.needs_root:
            return None
        if self.default_root is not None and Path(self.default_root).is_dir():
            return Path(self.default_root)
        if self.download is not None:
            return data_home() / self.name
        return Path(self.default_root) if self.default_root is not None else None

    def resolve_root(self, root: str | os.PathLike | None) -> Path | None:
        if root is not None:
            return Path(root)
        where = self.default_location()
        if where is None and self.needs_root:
            raise ValueError(f"dataset {self.name!r} needs a root folder (it cannot be downloaded here); expected "
                             f"a folder holding {' or '.join(self.markers) or 'the dataset'}")
        return where

    def load(self, root: str | os.PathLike | None, split: str, verify: Verify = "error") -> ImageSource:
        """Read ``split`` from ``root``; check class and image counts per ``verify`` (see module docstring)."""
        if self.split_sizes and split not in self.split_sizes:
            raise ValueError(f"dataset {self.name!r} has splits {sorted(self.split_sizes)}, not {split!r}")
        resolved = self.resolve_root(root)
        source = self.reader(resolved, split)
        if verify != "off" and self.releases:
            msg = self._release_mismatch(resolved)
            if msg and verify == "error":
                raise DatasetMismatchError(msg + _USE_A_MODIFIED_COPY)
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
                    raise DatasetMismatchError(msg + _USE_A_MODIFIED_COPY)
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


def cache_home() -> Path:
    """impulsevit's cache folder: ``$IMPULSEVIT_CACHE``, else ``$XDG_CACHE_HOME/impulsevit``, else
    ``~/.cache/impulsevit`` (converted ``.beton`` files go to its ``ffcv/``, downloaded datasets to ``datasets/``)."""
    if os.environ.get("IMPULSEVIT_CACHE"):
        return Path(os.environ["IMPULSEVIT_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "impulsevit"


def data_home() -> Path:
    """Where downloadable datasets go when no root is given: ``$IMPULSEVIT_DATA``, else ``cache_home() / "datasets"``
    (one folder per dataset name below it)."""
    return Path(os.environ["IMPULSEVIT_DATA"]) if os.environ.get("IMPULSEVIT_DATA") else cache_home() / "datasets"


DATASETS: dict[str, DatasetInfo] = {}


def register_dataset(info: DatasetInfo) -> DatasetInfo:
    """Add ``info`` to the registry under its name and aliases (lower case) and return it.

    Raises:
        ValueError: the name or an alias is already taken by another dataset (the message names both).
    """
    keys = [info.name.lower(), *(a.lower() for a in info.aliases)]
    for key in keys:
        other = DATASETS.get(key)
        if other is not None and other is not info:
            raise ValueError(f"register_dataset: name {key!r} of dataset {info.name!r} is already registered "
                             f"(dataset {other.name!r}, reader {getattr(other.reader, '__module__', '?')})")
    for key in keys:
        DATASETS[key] = info
    return info


@dataclass(frozen=True)
class TorchvisionDownload:
    """A ``download(root)`` through ``torchvision.datasets.<cls>(root, download=True, **kwargs)``: torchvision's own
    URLs, mirrors and MD5 checksums; files already there are not fetched again."""

    cls: str
    kwargs: dict = field(default_factory=dict)

    def __call__(self, root: Path) -> None:
        import torchvision.datasets

        getattr(torchvision.datasets, self.cls)(str(root), download=True, **self.kwargs)


def _image_folder_classes(root: Path, train: str, val: str) -> int:
    """The class count of an ImageFolder tree ``root/{train,val}/<class>/<image>`` (``val`` may be ``test``).

    Raises:
        ConfigError: a split folder is missing or ``train`` has no class sub-folders (the message gives the layout).
    """
    layout = f"expected {root}/{train}/<class>/<image> and {root}/{val}/<class>/<image>"
    train_dir = root / train
    if not train_dir.is_dir():
        raise ConfigError(f"ImageFolder root {root} has no {train}/ folder ({layout})")
    if not (root / val).is_dir() and not (val == "val" and (root / "test").is_dir()):
        raise ConfigError(f"ImageFolder root {root} has no {val}/ folder ({layout})")
    if not any(d.is_dir() and not d.name.startswith(".") for d in train_dir.iterdir()):
        raise ConfigError(f"ImageFolder {train_dir} has no class sub-folders ({layout})")
    return len(image_folder_source(train_dir).classes)


def _imagenet21k_classes(root: Path, train: str, val: str) -> int | None:
    """The class folders (one per wnid) of the release under ``root`` (winter21 or fall11); None when none is there."""
    base = formats.imagenet21k_base(root)
    if not base.is_dir():
        return None
    return sum(1 for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))


_IMAGENET_MANUAL = (
    "ImageNet-1K (ILSVRC-2012) needs an account at https://image-net.org (or the Kaggle ILSVRC challenge "
    "'imagenet-object-localization-challenge'). Obtain ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and "
    "ILSVRC2012_devkit_t12.tar.gz, then lay them out under ROOT as: train/<wnid>/*.JPEG (extract the train tar, "
    "then each of its 1,000 per-class tars into a folder of that name); val/ILSVRC2012_val_%08d.JPEG flat with "
    "the devkit extracted at ROOT/ILSVRC2012_devkit_t12/ (its data/meta.mat and "
    "data/ILSVRC2012_validation_ground_truth.txt label them), or val flat with Kaggle's LOC_val_solution.csv next "
    "to it, or val/<wnid>/*.JPEG; Kaggle's ROOT/ILSVRC/Data/CLS-LOC/{train,val} tree is read as it is.")
_IMAGENET21K_MANUAL = (
    "ImageNet-21K needs an account at https://image-net.org: obtain the full release winter21_whole.tar.gz "
    "(19,167 classes, 13,153,500 images) or fall11_whole.tar (21,841 classes, 14,197,122 images), extract it to "
    "ROOT/winter21_whole/ (or ROOT/fall11_whole/) and each per-class n*.tar inside into a folder of that name "
    "(for f in n*.tar; do mkdir -p ${f%.tar} && tar -xf $f -C ${f%.tar}; done). Any per-class counts are read; "
    "validation is the first min(50, n // 2) files of each class.")


register_dataset(DatasetInfo(
    "cifar10", 10, {"train": 50_000, "test": 10_000}, "train", "test",
    (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), partial(formats.read_cifar, num_classes=10),
    markers=("cifar-10-batches-py/batches.meta", "batches.meta"), small=True, description="CIFAR-10",
    aliases=("cifar-10",), download=TorchvisionDownload("CIFAR10", {"train": True})))
register_dataset(DatasetInfo(
    "cifar100", 100, {"train": 50_000, "test": 10_000}, "train", "test",
    (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), partial(formats.read_cifar, num_classes=100),
    markers=("cifar-100-python/meta",), small=True, description="CIFAR-100", aliases=("cifar-100",),
    download=TorchvisionDownload("CIFAR100", {"train": True})))
register_dataset(DatasetInfo(
    "stl10", 10, {"train": 5_000, "test": 8_000}, "train", "test",
    (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713), formats.read_stl10,
    markers=("stl10_binary/train_X.bin", "train_X.bin"), small=True, description="STL-10 labelled splits",
    aliases=("stl-10",), download=TorchvisionDownload("STL10", {"split": "train"})))
register_dataset(DatasetInfo(
    "flowers102", 102, {"train": 1_020, "val": 1_020, "test": 6_149, "trainval": 2_040}, "trainval", "test",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_flowers102, markers=("flowers-102/setid.mat", "setid.mat"),
    description="Oxford Flowers-102", aliases=("flowers", "oxford_flowers102"),
    download=TorchvisionDownload("Flowers102", {"split": "train"})))
register_dataset(DatasetInfo(
    "pets", 37, {"trainval": 3_680, "test": 3_669}, "trainval", "test",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_pets,
    markers=("oxford-iiit-pet/annotations/trainval.txt", "annotations/trainval.txt"),
    description="Oxford-IIIT Pets", aliases=("oxford_pets", "oxford-iiit-pet"),
    download=TorchvisionDownload("OxfordIIITPet", {"split": "trainval"})))
register_dataset(DatasetInfo(
    "food101", 101, {"train": 75_750, "test": 25_250}, "train", "test",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_food101, markers=("food-101/meta/train.json", "meta/train.json"),
    description="Food-101", aliases=("food-101",),
    download=TorchvisionDownload("Food101", {"split": "train"})))
register_dataset(DatasetInfo(
    "imagenet", 1000, {"train": 1_281_167, "val": 50_000}, "train", "val",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_imagenet,
    markers=("ILSVRC/Data/CLS-LOC/train", "LOC_val_solution.csv"), description="ImageNet-1K (ILSVRC-2012)",
    aliases=("imagenet1k", "in1k", "imagenet-1k"), manual_download=_IMAGENET_MANUAL))
register_dataset(DatasetInfo(
    "imagenet21k", 19_167, {"train": 0, "val": 0}, "train", "val",
    IMAGENET_MEAN, IMAGENET_STD, formats.read_imagenet21k, markers=formats.IMAGENET21K_RELEASES,
    description="ImageNet-21K full release (winter21_whole or fall11_whole; validation = the first min(50, n // 2) "
                "images of each class)",
    aliases=("in21k", "imagenet-21k", "imagenet21k_winter21"),
    releases={"winter21_whole": (19_167, 13_153_500), "fall11_whole": (21_841, 14_197_122)},
    tree_size=formats.imagenet21k_tree_size, tree_classes=_imagenet21k_classes, manual_download=_IMAGENET21K_MANUAL))
register_dataset(DatasetInfo(
    "fashion_mnist", 10, {"train": 60_000, "test": 10_000}, "train", "test",
    (0.2860,) * 3, (0.3530,) * 3, formats.read_fashion_mnist,
    markers=("FashionMNIST/raw/train-images-idx3-ubyte", "FashionMNIST/raw/train-images-idx3-ubyte.gz",
             "train-images-idx3-ubyte.gz"),  # the last: Debian's flat layout
    default_root=formats.FASHION_MNIST_SYSTEM_DIR, small=True, description="Fashion-MNIST",
    aliases=("fashion-mnist", "fashionmnist"), download=TorchvisionDownload("FashionMNIST", {"train": True})))
register_dataset(DatasetInfo(
    "digits", 10, {"train": 1_437, "test": 360}, "train", "test",
    (0.3053,) * 3, (0.3759,) * 3, formats.read_digits, small=True, needs_root=False,
    description="scikit-learn digits (1,797 8x8 images)", aliases=("sklearn_digits",)))
register_dataset(DatasetInfo(
    "imagefolder", 0, {}, "train", "val", IMAGENET_MEAN, IMAGENET_STD, formats.read_image_folder_split,
    description="generic ImageFolder tree", aliases=("image_folder",),
    tree_classes=_image_folder_classes, layout="{root}/train/<class>/<image> and {root}/val/<class>/<image>"))


def get_dataset(name: str) -> DatasetInfo:
    """The registry entry for ``name`` (case-insensitive; aliases accepted)."""
    key = name.lower()
    if key not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(list_datasets())}")
    return DATASETS[key]


def list_datasets() -> list[str]:
    """Registry names (without aliases)."""
    return sorted({info.name for info in DATASETS.values()})


def downloadable() -> list[str]:
    """Registry names with a ``download`` function (what ``impulsevit download`` can fetch)."""
    return [name for name in list_datasets() if DATASETS[name].download is not None]


def detect_dataset(root: str | os.PathLike) -> DatasetInfo | None:
    """The registry entry whose marker files exist under ``root`` (a torchvision-style dataset folder), else None."""
    root = Path(root)
    for name in list_datasets():
        info = DATASETS[name]
        if any((root / m).exists() for m in info.markers):
            return info
    return None
