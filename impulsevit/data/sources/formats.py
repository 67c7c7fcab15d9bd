"""Readers for the real on-disk formats of the registry's datasets. Each returns an :class:`ImageSource` for one split.

Every reader names the file it expected when something is missing or malformed. Formats (as distributed upstream):

- CIFAR-10 ``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``; CIFAR-100 ``cifar-100-python/{train,
  test,meta}``: pickled dicts (bytes keys) with ``data`` uint8 ``(N, 3072)`` CHW row-major and ``labels`` /
  ``fine_labels``.
- STL-10 ``stl10_binary/{train,test}_{X,y}.bin``: uint8 ``(N, 3, 96, 96)`` column-major images, labels 1..10;
  ``class_names.txt``.
- Fashion-MNIST idx files ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` (in ``root/FashionMNIST/raw``,
  ``root/raw`` or ``root``).
- Oxford Flowers-102 ``jpg/image_%05d.jpg``, ``imagelabels.mat`` (``labels`` 1..102), ``setid.mat``
  (``trnid``/``valid``/``tstid``, 1-based image ids).
- Oxford-IIIT Pets ``images/<Name_123>.jpg``, ``annotations/{trainval,test}.txt`` lines
  ``Name_123 class_id species breed_id`` (class ids 1..37).
- Food-101 ``images/<class>/<id>.jpg``, ``meta/{train,test}.json`` (``{class: ["class/id", ...]}``),
  ``meta/classes.txt``.
- ImageNet-1K train ``train/<wnid>/*.JPEG``; val either ``val/<wnid>/*.JPEG`` or flat ``val/*.JPEG`` with Kaggle's
  ``LOC_val_solution.csv`` or the ILSVRC-2012 devkit's ground truth (``ILSVRC2012_devkit_t12/data/meta.mat`` +
  ``ILSVRC2012_validation_ground_truth.txt``, extracted next to ``val/`` or at the root); also found under
  ``ILSVRC/Data/CLS-LOC``.
- ImageNet-21K, the full releases ``winter21_whole`` (19,167 classes) and ``fall11_whole`` (21,841 classes),
  extracted to ``<root>/<wnid>/*.JPEG`` (or ``<root>/winter21_whole/<wnid>/...``, ``<root>/fall11_whole/...``). Class
  sizes vary (1 to ~3,000 images); there is no official split: of a class with ``n`` images, the first
  ``min(val_per_class, n // 2)`` files (sorted by name) are validation, the rest training, so every class with an
  image is in the training split.
- scikit-learn digits (in the wheel): 8×8 grayscale scaled 0..16 → 0..255; seeded 80/20 split.

Why these are not ``torchvision.datasets`` readers (checked on torchvision 0.29; :mod:`.download` does use its
classes to fetch the archives): each torchvision class reads one layout and some verify the files, where these
readers accept what the registry's markers accept and leave checksums to ``verify``:

- ``CIFAR10`` / ``CIFAR100`` / ``STL10`` check every file against the release's MD5 when constructed (no switch to
  skip it), so they refuse subsets or rebuilt files in the real format; they also need their own folder name
  (``cifar-10-batches-py`` ...), not files directly in ``root``, and CIFAR-100 needs ``meta``.
- ``FashionMNIST`` reads only uncompressed files in ``<root>/FashionMNIST/raw``; Debian's copy is gzipped in one flat
  folder.
- ``Flowers102`` / ``OxfordIIITPet`` / ``Food101`` hold their file lists and labels only in private attributes
  (``_image_files`` / ``_images``, ``_labels``); ``Flowers102`` also checks the ``.mat`` MD5s and has no ``trainval``
  split, and ``OxfordIIITPet`` renames the classes (``"American Bulldog"`` for ``american_bulldog``).
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from impulsevit.data.sources.image_source import ArraySource, FileSource, ImageSource, Problem, image_folder_source
from impulsevit.safe_load import UntrustedFileError, load_restricted_pickle

__all__ = [
    "read_cifar",
    "read_digits",
    "read_fashion_mnist",
    "read_flowers102",
    "read_food101",
    "read_idx",
    "read_image_folder_split",
    "read_imagenet",
    "read_imagenet21k",
    "read_pets",
    "read_stl10",
]

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot"]  # torchvision.datasets.FashionMNIST.classes, without importing torch here
FASHION_MNIST_SYSTEM_DIR = "/usr/share/datasets/fashion-mnist"
IMAGENET_DEVKIT = "ILSVRC2012_devkit_t12"


def _need(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"missing {path} ({what})")
    return path


CIFAR_PICKLE_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    *((f"numpy.{core}.multiarray", n) for core in ("core", "_core") for n in ("_reconstruct", "scalar")),
    *((f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core")),
    ("_codecs", "encode"),  # bytes in a protocol-2 pickle written by python 3
})
"""What a CIFAR python batch may name when unpickled: numpy arrays, scalars and dtypes (numpy 1 and 2 spellings).
Anything else (a pickle that would call a function) is refused, naming the file (:mod:`impulsevit.safe_load`)."""


def _unpickle(path: Path) -> dict:
    with open(_need(path, "CIFAR python pickle"), "rb") as fh:
        try:
            obj = load_restricted_pickle(fh, CIFAR_PICKLE_GLOBALS, source=path, what="CIFAR python batch",
                                         holds="a CIFAR python batch holds only numpy arrays and plain values",
                                         encoding="bytes")
        except UntrustedFileError:
            raise
        except Exception as exc:  # pickle raises many types on garbage
            raise ValueError(f"{path}: not a CIFAR python pickle ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def read_cifar(root: str | os.PathLike, split: str, num_classes: int) -> ArraySource:
    """CIFAR-10 (``num_classes=10``) or CIFAR-100 (``100``, fine labels) from the python pickle release."""
    root = Path(root)
    if num_classes == 10:
        base = root / "cifar-10-batches-py" if (root / "cifar-10-batches-py").is_dir() else root
        files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        label_key, meta_file, names_key = "labels", "batches.meta", "label_names"
    else:
        base = root / "cifar-100-python" if (root / "cifar-100-python").is_dir() else root
        files = ["train"] if split == "train" else ["test"]
        label_key, meta_file, names_key = "fine_labels", "meta", "fine_label_names"
    images, labels = [], []
    for name in files:
        batch = _unpickle(base / name)
        if "data" not in batch or label_key not in batch:
            raise ValueError(f"{base / name}: expected keys 'data' and '{label_key}', found {sorted(batch)}")
        data = np.asarray(batch["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3072:
            raise ValueError(f"{base / name}: 'data' must be (N, 3072) uint8, got {data.shape}")
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(np.asarray(batch[label_key], dtype=np.int64))
    classes = CIFAR10_CLASSES if num_classes == 10 else [f"class_{i}" for i in range(100)]
    if (base / meta_file).exists():
        meta = _unpickle(base / meta_file)
        if names_key in meta:
            classes = [n.decode() if isinstance(n, bytes) else str(n) for n in meta[names_key]]
    return ArraySource(np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels), classes, str(base))


def read_stl10(root: str | os.PathLike, split: str) -> ArraySource:
    """STL-10 binary release, labelled splits ``train`` (5,000) and ``test`` (8,000); labels stored 1..10."""
    root = Path(root)
    base = root / "stl10_binary" if (root / "stl10_binary").is_dir() else root
    xpath, ypath = _need(base / f"{split}_X.bin", "STL-10 images"), _need(base / f"{split}_y.bin", "STL-10 labels")
    raw = np.fromfile(xpath, dtype=np.uint8)
    if raw.size % (3 * 96 * 96):
        raise ValueError(f"{xpath}: size {raw.size} bytes is not a multiple of 3*96*96")
    images = raw.reshape(-1, 3, 96, 96).transpose(0, 3, 2, 1)  # column-major per channel → (N, H, W, C)
    labels = np.fromfile(ypath, dtype=np.uint8).astype(np.int64) - 1
    classes = [f"class_{i}" for i in range(10)]
    if (base / "class_names.txt").exists():
        classes = [line.strip() for line in (base / "class_names.txt").read_text().splitlines() if line.strip()]
    return ArraySource(np.ascontiguousarray(images), labels, classes, str(xpath))


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An idx file (``.gz`` or not): magic ``0x0803`` uint8 images ``(N, H, W)`` or ``0x0801`` labels ``(N,)``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    magic = int.from_bytes(data[:4], "big")
    if magic >> 8 != 0x08 or (magic & 0xFF) not in (1, 3):
        raise ValueError(f"{path}: not a uint8 idx file (magic {magic:#x}, expected 0x801 or 0x803)")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes) but holds {arr.size} bytes")
    return arr.reshape(dims)


def _idx_file(root: Path, stem: str) -> Path:
    for d in (root / "FashionMNIST" / "raw", root / "raw", root):
        for name in (stem, stem + ".gz"):
            if (d / name).is_file():
                return d / name
    raise FileNotFoundError(f"missing {stem}[.gz] under {root}/FashionMNIST/raw, {root}/raw or {root} "
                            f"(Debian's dataset-fashion-mnist installs them in {FASHION_MNIST_SYSTEM_DIR})")


def read_fashion_mnist(root: str | os.PathLike | None, split: str) -> ArraySource:
    """Fashion-MNIST idx files; ``root=None`` reads Debian's copy in ``/usr/share/datasets/fashion-mnist``."""
    base = Path(root) if root is not None else Path(FASHION_MNIST_SYSTEM_DIR)
    prefix = "train" if split == "train" else "t10k"
    img_path = _idx_file(base, f"{prefix}-images-idx3-ubyte")
    images = read_idx(img_path)
    labels = read_idx(_idx_file(base, f"{prefix}-labels-idx1-ubyte"))
    return ArraySource(images, labels, FASHION_MNIST_CLASSES, str(img_path))


def read_digits(root: str | os.PathLike | None, split: str, seed: int = 0) -> ArraySource:
    """scikit-learn's 1,797 8×8 digits, scaled to uint8; a seeded permutation puts 360 images in ``test``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.clip(np.round(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    order = np.random.default_rng(seed).permutation(len(images))
    idx = np.sort(order[360:] if split == "train" else order[:360])
    return ArraySource(images[idx], d.target[idx], [str(i) for i in range(10)], "sklearn.datasets.load_digits")


def read_flowers102(root: str | os.PathLike, split: str) -> FileSource:
    """Oxford Flowers-102: ``split`` in train / val / test / trainval (setid.mat ids are 1-based image numbers)."""
    from scipy.io import loadmat

    root = Path(root)
    base = root / "flowers-102" if (root / "flowers-102").is_dir() else root
    labels_all = loadmat(_need(base / "imagelabels.mat", "Flowers-102 labels"))["labels"].reshape(-1).astype(np.int64)
    setid = loadmat(_need(base / "setid.mat", "Flowers-102 splits"))
    keys = {"train": ["trnid"], "val": ["valid"], "test": ["tstid"], "trainval": ["trnid", "valid"]}[split]
    ids = np.sort(np.concatenate([setid[k].reshape(-1).astype(np.int64) for k in keys]))
    if len(ids) and (ids.min() < 1 or ids.max() > len(labels_all)):
        raise ValueError(f"{base / 'setid.mat'}: image ids span [{ids.min()}, {ids.max()}] but imagelabels.mat "
                         f"has {len(labels_all)} labels")
    paths = [str(base / "jpg" / f"image_{i:05d}.jpg") for i in ids]
    problems = [Problem("unreadable", p, "listed in setid.mat but missing") for p in paths if not os.path.isfile(p)]
    keep = [i for i, p in enumerate(paths) if os.path.isfile(p)]
    return FileSource([paths[i] for i in keep], labels_all[ids - 1][keep] - 1, [f"flower_{i}" for i in range(1, 103)],
                      problems)


def read_pets(root: str | os.PathLike, split: str) -> FileSource:
    """Oxford-IIIT Pets: ``split`` trainval or test from ``annotations/<split>.txt`` (class ids 1..37)."""
    root = Path(root)
    base = root / "oxford-iiit-pet" if (root / "oxford-iiit-pet").is_dir() else root
    ann = _need(base / "annotations" / f"{split}.txt", "Oxford-IIIT Pets split list")
    names, labels = [], []
    for lineno, line in enumerate(ann.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
            raise ValueError(f"{ann}:{lineno}: expected 'Name_123 class_id species breed_id', got {line!r}")
        names.append(parts[0])
        labels.append(int(parts[1]) - 1)
    classes: dict[int, str] = {}
    for name, label in zip(names, labels):
        classes.setdefault(label, name.rsplit("_", 1)[0])
    class_list = [classes.get(i, f"breed_{i + 1}") for i in range(max(37, max(labels, default=-1) + 1))]
    paths = [str(base / "images" / f"{n}.jpg") for n in names]
    problems = [Problem("unreadable", p, f"listed in {ann.name} but missing") for p in paths if not os.path.isfile(p)]
    keep = [i for i, p in enumerate(paths) if os.path.isfile(p)]
    return FileSource([paths[i] for i in keep], np.asarray(labels, dtype=np.int64)[keep], class_list, problems)


def read_food101(root: str | os.PathLike, split: str) -> FileSource:
    """Food-101: ``split`` train or test from ``meta/<split>.json``; classes from ``meta/classes.txt``."""
    root = Path(root)
    base = root / "food-101" if (root / "food-101").is_dir() else root
    classes = [c.strip() for c in _need(base / "meta" / "classes.txt", "Food-101 classes").read_text().splitlines()
               if c.strip()]
    index = {c: i for i, c in enumerate(classes)}
    listing_path = _need(base / "meta" / f"{split}.json", "Food-101 split list")
    listing = json.loads(listing_path.read_text())
    paths, labels = [], []
    for cls in sorted(listing):
        if cls not in index:
            raise ValueError(f"{listing_path}: class {cls!r} is not in meta/classes.txt")
        for rel in listing[cls]:
            paths.append(str(base / "images" / f"{rel}.jpg"))
            labels.append(index[cls])
    problems = [Problem("unreadable", p, f"listed in {listing_path.name} but missing") for p in paths
                if not os.path.isfile(p)]
    keep = [i for i, p in enumerate(paths) if os.path.isfile(p)]
    return FileSource([paths[i] for i in keep], np.asarray(labels, dtype=np.int64)[keep], classes, problems)


def _imagenet_base(root: Path) -> Path:
    for cand in (root, root / "ILSVRC" / "Data" / "CLS-LOC", root / "imagenet"):
        if (cand / "train").is_dir():
            return cand
    raise FileNotFoundError(f"ImageNet-1K: no train/ folder in {root}, {root}/ILSVRC/Data/CLS-LOC or {root}/imagenet "
                            f"(expected train/<wnid>/*.JPEG)")


def read_imagenet(root: str | os.PathLike, split: str) -> FileSource:
    """ImageNet-1K (ILSVRC-2012): class order = sorted train wnids; val as class folders or flat + LOC csv."""
    root = Path(root)
    base = _imagenet_base(root)
    classes = sorted(d.name for d in (base / "train").iterdir() if d.is_dir() and not d.name.startswith("."))
    if split == "train":
        return image_folder_source(base / "train", classes)
    val = base / "val"
    if not val.is_dir():
        raise FileNotFoundError(f"ImageNet-1K: missing {val}")
    if any(d.is_dir() for d in val.iterdir()):
        return image_folder_source(val, classes)
    csv = next((p for p in (val / "LOC_val_solution.csv", base / "LOC_val_solution.csv",
                            root / "LOC_val_solution.csv") if p.is_file()), None)
    if csv is None:
        devkit = next((d for d in (base / IMAGENET_DEVKIT, root / IMAGENET_DEVKIT, val / IMAGENET_DEVKIT)
                       if (d / "data" / "meta.mat").is_file()), None)
        if devkit is not None:
            return _imagenet_val_from_devkit(val, devkit, classes)
        raise FileNotFoundError(f"ImageNet-1K: {val} is flat (no class folders) and neither LOC_val_solution.csv nor "
                                f"{IMAGENET_DEVKIT}/data/meta.mat (the ILSVRC-2012 devkit) was found next to it; sort "
                                f"the val images into val/<wnid>/, or provide the csv or the extracted devkit")
    index = {c: i for i, c in enumerate(classes)}

    def listed() -> Iterator[tuple[Path, int]]:
        for lineno, line in enumerate(csv.read_text().splitlines()[1:], 2):
            if not line.strip():
                continue
            image_id, _, pred = line.partition(",")
            wnid = pred.split()[0] if pred.split() else ""
            if wnid not in index:
                raise ValueError(f"{csv}:{lineno}: wnid {wnid!r} is not a train class")
            yield val / f"{image_id}.JPEG", index[wnid]

    paths, labels, problems = _listed_files(listed(), f"listed in {csv.name}")
    order = np.argsort(paths)
    return FileSource([paths[i] for i in order], np.asarray(labels, dtype=np.int64)[order], classes, problems)


def _listed_files(listed: Iterable[tuple[Path, int]], how: str) -> tuple[list[str], list[int], list[Problem]]:
    """``(paths, labels, problems)`` of the ``(file, label)`` pairs a label file names, in its order: a file that
    exists is kept with its label, a missing one becomes an ``unreadable`` :class:`Problem` "``<how>`` but missing"
    (``how``: e.g. ``listed in LOC_val_solution.csv``). Errors raised while iterating ``listed`` propagate."""
    paths: list[str] = []
    labels: list[int] = []
    problems: list[Problem] = []
    for path, label in listed:
        if not path.is_file():
            problems.append(Problem("unreadable", str(path), f"{how} but missing"))
            continue
        paths.append(str(path))
        labels.append(label)
    return paths, labels, problems


def _imagenet_val_from_devkit(val: Path, devkit: Path, classes: list[str]) -> FileSource:
    """Flat ``val/ILSVRC2012_val_%08d.JPEG`` labelled by the devkit: line ``i`` of
    ``data/ILSVRC2012_validation_ground_truth.txt`` is the ILSVRC2012_ID (1..1000) of image ``i``, and ``data/meta.mat``
    (``synsets``: ILSVRC2012_ID, WNID, words, gloss, num_children, ...) maps the leaf ids to wnids."""
    from scipy.io import loadmat

    meta_path = devkit / "data" / "meta.mat"
    truth = _need(devkit / "data" / "ILSVRC2012_validation_ground_truth.txt", "ILSVRC-2012 devkit validation labels")
    try:
        synsets = loadmat(meta_path, squeeze_me=True)["synsets"]
        id_to_wnid = {int(s[0]): str(s[1]) for s in synsets if int(s[4]) == 0}
    except Exception as exc:  # noqa: BLE001 - loadmat raises many types on foreign files
        raise ValueError(f"{meta_path}: not the ILSVRC-2012 devkit's meta.mat ({type(exc).__name__}: {exc})") from exc
    index = {c: i for i, c in enumerate(classes)}

    def listed() -> Iterator[tuple[Path, int]]:
        for lineno, line in enumerate(truth.read_text().split(), 1):
            wnid = id_to_wnid.get(int(line)) if line.isdigit() else None
            if wnid is None or wnid not in index:
                raise ValueError(f"{truth}:{lineno}: {line!r} is not the ILSVRC2012_ID of a train class in "
                                 f"{meta_path}")
            yield val / f"ILSVRC2012_val_{lineno:08d}.JPEG", index[wnid]

    paths, labels, problems = _listed_files(listed(), f"labelled in {truth.name}")
    return FileSource(paths, np.asarray(labels, dtype=np.int64), classes, problems)


IMAGENET21K_RELEASES = ("winter21_whole", "fall11_whole")


def imagenet21k_base(root: str | os.PathLike) -> Path:
    """The folder holding the ``<wnid>/`` class folders: ``root/winter21_whole``, ``root/fall11_whole`` or ``root``."""
    root = Path(root)
    return next((root / r for r in IMAGENET21K_RELEASES if (root / r).is_dir()), root)


@functools.lru_cache(maxsize=2)
def _imagenet21k_listing(base: str, mtime_ns: int) -> FileSource:
    return image_folder_source(base)


def _imagenet21k_tree(root: str | os.PathLike) -> FileSource:
    """The whole tree, listed once per process and folder state (train, val and the count check all need it;
    13 M files). Per-class tar files that were not extracted are an error."""
    base = imagenet21k_base(root)
    if not base.is_dir():
        raise FileNotFoundError(f"ImageNet-21K: {base} is not a directory (expected {base}/<wnid>/*.JPEG)")
    tars = sorted(base.glob("n*.tar"))
    if tars:
        raise ValueError(f"ImageNet-21K: {base} holds per-class tar files (e.g. {tars[0].name}); extract them first: "
                         f"for f in n*.tar; do mkdir -p ${{f%.tar}} && tar -xf $f -C ${{f%.tar}}; done")
    return _imagenet21k_listing(str(base), base.stat().st_mtime_ns)


def imagenet21k_tree_size(root: str | os.PathLike) -> tuple[int, int]:
    """(classes, images) of the whole extracted tree under ``root`` (both splits together)."""
    tree = _imagenet21k_tree(root)
    return len(tree.classes), len(tree)


def read_imagenet21k(root: str | os.PathLike, split: str, val_per_class: int = 50) -> FileSource:
    """ImageNet-21K ``winter21_whole`` / ``fall11_whole`` extracted to class folders (see the module docstring):
    validation = the first ``min(val_per_class, n // 2)`` files of each class of ``n`` images, training = the rest."""
    if split not in ("train", "val"):
        raise ValueError(f"ImageNet-21K has splits 'train' and 'val', not {split!r}")
    source = _imagenet21k_tree(root)
    labels = source.labels
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]]) if len(labels) else np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.r_[starts, len(labels)])
    in_val = np.zeros(len(labels), dtype=bool)
    for start, n in zip(starts, sizes):
        in_val[start:start + min(val_per_class, int(n) // 2)] = True
    return source.subset(np.flatnonzero(in_val if split == "val" else ~in_val))


def read_image_folder_split(root: str | os.PathLike, split: str) -> ImageSource:
    """A generic tree ``root/<split>/<class>/<image>`` (``val`` falls back to ``test``), or ``root/<class>/<image>``
    for a single ``train`` split. Class order comes from the train folder when there is one, so labels agree."""
    root = Path(root)
    train_dir = root / "train"
    classes = None
    if train_dir.is_dir():
        classes = sorted(d.name for d in train_dir.iterdir() if d.is_dir() and not d.name.startswith("."))
    if (root / split).is_dir():
        return image_folder_source(root / split, classes)
    if split == "val" and (root / "test").is_dir():
        return image_folder_source(root / "test", classes)
    if split == "train" and not train_dir.is_dir() and not (root / "val").is_dir():
        return image_folder_source(root)
    raise FileNotFoundError(f"ImageFolder: no {root / split} folder (expected {root}/{split}/<class>/<image>)")
