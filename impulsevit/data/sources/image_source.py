"""Indexable image sources: the common shape every on-disk dataset format is read into.

A source is a list of samples with integer labels; ``load(i)`` returns the image as ``(H, W, 3)`` uint8 RGB (grayscale
and palette images are converted to 3 channels, alpha is dropped). Two kinds exist:

- :class:`ArraySource` holds decoded pixels in memory (CIFAR pickles, STL-10 binaries, Fashion-MNIST idx, digits);
- :class:`FileSource` holds file paths (JPEG/PNG/... trees: ImageNet, Flowers, Pets, Food-101, ImageFolder).

Sources are picklable (FFCV's writer and DataLoader workers fork or pickle them) and carry a list of ``problems``
found while listing files (empty class folders, non-image files, unreadable entries); :func:`check_sample` finds the
ones that only show up on decoding (truncated or corrupt images). Neither kind caches decoded images.
"""

from __future__ import annotations

import hashlib
import io
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from impulsevit.errors import ConfigError

__all__ = [
    "IMAGE_EXTENSIONS",
    "ArraySource",
    "FileSource",
    "ImageSource",
    "Problem",
    "bad_input_report",
    "check_sample",
    "image_folder_source",
    "to_rgb_array",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


@dataclass(frozen=True)
class Problem:
    """One bad input: ``kind`` is ``corrupt``, ``not-an-image``, ``empty-class`` or ``unreadable``."""

    kind: str
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path} ({self.detail})"


def bad_input_report(problems: Sequence[Problem], where: str) -> list[str]:
    """The lines that name the bad inputs ``problems`` of the source of ``where`` (an output path, or a dataset and
    split), in the words every backend uses: ``WHERE: N bad input(s):``, then ``  KIND: PATH (DETAIL)`` per problem
    (e.g. ``  empty-class: /data/train/bird (class folder holds no image files)``: the class keeps its label and the
    model an output for it, trained on no image). Empty when there is none. Printed by the FFCV and LitData
    conversions (:func:`impulsevit.data.storage.convert.scan_good`, listing and decoding problems) and by the
    torchvision backend when it opens a split (listing problems; it reads each image only when a batch needs it)."""
    if not problems:
        return []
    return [f"{where}: {len(problems)} bad input(s):", *(f"  {p}" for p in problems)]


def to_rgb_array(image: Image.Image | np.ndarray) -> np.ndarray:
    """PIL image or ``(H, W)`` / ``(H, W, 1|3|4)`` array → contiguous ``(H, W, 3)`` uint8 RGB.

    16-bit grayscale images (PIL modes ``I;16*``, and ``I``, which is how PNG's 16-bit gray may open) are scaled to 8
    bits (``round(v / 257)``: 0 → 0, 65535 → 255), not clipped at 255 as PIL's ``convert`` does (which turns almost
    every pixel white). 16-bit RGB PNGs are reduced to 8 bits by PIL itself. Not supported: float images (mode ``F``,
    converted by PIL with clipping)."""
    if isinstance(image, Image.Image):
        if image.mode == "I" or image.mode.startswith("I;16"):
            wide = np.asarray(image).astype(np.float64)
            gray = np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8)
            return np.ascontiguousarray(np.repeat(gray[:, :, None], 3, axis=2))
        if image.mode != "RGB":
            image = image.convert("RGB")
        return np.asarray(image, dtype=np.uint8).copy()
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise TypeError(f"expected uint8 pixels, got {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise ValueError(f"expected an (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) image, got shape {arr.shape}")
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    elif arr.shape[2] == 4:
        arr = arr[:, :, :3]
    return np.ascontiguousarray(arr)


class ImageSource(ABC):
    """Base: ``classes`` (names, index = label), ``labels`` int64 ``(N,)``, ``problems`` found while listing."""

    classes: list[str]
    labels: np.ndarray
    problems: list[Problem]

    def __len__(self) -> int:
        return len(self.labels)

    @abstractmethod
    def load(self, index: int, max_side: int | None = None) -> np.ndarray:
        """Decoded ``(H, W, 3)`` uint8 RGB. ``max_side`` is a hint that lets JPEG decoding skip detail (DCT
        scaling); the result may still be larger than ``max_side`` and callers resize it themselves."""

    @abstractmethod
    def describe(self, index: int) -> str:
        """Where sample ``index`` comes from (a path, or ``file[row]``) — used in error messages."""

    @abstractmethod
    def subset(self, indices: Sequence[int] | np.ndarray) -> ImageSource:
        """A source of the same kind holding only ``indices`` (in that order)."""

    @abstractmethod
    def image_size(self, index: int) -> tuple[int, int]:
        """``(height, width)`` of sample ``index`` as stored in the source (file header only, no decode)."""

    def follow(self, epoch: int, position: int) -> None:  # noqa: B027 - a hint; most sources need none
        """A hint from the training loader: the sample at global ``position`` of ``epoch``'s order is read next
        (a streaming source prefetches ahead of it). The default does nothing."""

    def class_counts(self) -> dict[str, int]:
        counts = np.bincount(self.labels, minlength=len(self.classes)) if len(self.labels) else np.zeros(
            len(self.classes), dtype=np.int64)
        return {name: int(c) for name, c in zip(self.classes, counts)}


@dataclass
class ArraySource(ImageSource):
    """Decoded images in memory: ``images`` uint8 ``(N, H, W)`` (grayscale) or ``(N, H, W, 3)``.

    ``origin`` names the file(s) the arrays came from, for messages."""

    images: np.ndarray
    labels: np.ndarray
    classes: list[str]
    origin: str
    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        if self.images.dtype != np.uint8 or self.images.ndim not in (3, 4):
            raise ValueError(f"{self.origin}: expected uint8 (N, H, W[, 3]) images, got {self.images.dtype} "
                             f"{self.images.shape}")
        if len(self.images) != len(self.labels):
            raise ValueError(f"{self.origin}: {len(self.images)} images but {len(self.labels)} labels")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.classes)):
            raise ValueError(f"{self.origin}: labels span [{self.labels.min()}, {self.labels.max()}], expected "
                             f"[0, {len(self.classes) - 1}] for {len(self.classes)} classes")

    def load(self, index: int, max_side: int | None = None) -> np.ndarray:
        return to_rgb_array(self.images[index])

    def describe(self, index: int) -> str:
        return f"{self.origin}[{index}]"

    def image_size(self, index: int) -> tuple[int, int]:
        return int(self.images.shape[1]), int(self.images.shape[2])

    def subset(self, indices: Sequence[int] | np.ndarray) -> ArraySource:
        idx = np.asarray(indices, dtype=np.int64)
        return ArraySource(self.images[idx], self.labels[idx], self.classes, self.origin, list(self.problems))

    def checksum(self) -> str:
        h = hashlib.sha256()
        h.update(np.ascontiguousarray(self.images).data)
        h.update(self.labels.tobytes())
        return h.hexdigest()


@dataclass
class FileSource(ImageSource):
    """Image files: ``paths[i]`` has label ``labels[i]``."""

    paths: list[str]
    labels: np.ndarray
    classes: list[str]
    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        if len(self.paths) != len(self.labels):
            raise ValueError(f"{len(self.paths)} paths but {len(self.labels)} labels")

    def load(self, index: int, max_side: int | None = None) -> np.ndarray:
        with Image.open(self.paths[index]) as im:
            if max_side is not None and im.format == "JPEG":
                scale = max_side / max(im.size)
                if scale < 1:
                    im.draft("RGB", (max(1, int(np.ceil(im.width * scale))), max(1, int(np.ceil(im.height * scale)))))
            return to_rgb_array(im)

    def describe(self, index: int) -> str:
        return self.paths[index]

    def image_size(self, index: int) -> tuple[int, int]:
        with Image.open(self.paths[index]) as im:
            return int(im.height), int(im.width)

    def subset(self, indices: Sequence[int] | np.ndarray) -> FileSource:
        idx = np.asarray(indices, dtype=np.int64)
        return FileSource([self.paths[i] for i in idx], self.labels[idx], self.classes, list(self.problems))


def check_sample(source: ImageSource, index: int) -> tuple[Problem | None, bytes, tuple[int, int]]:
    """Decode sample ``index`` fully enough to find truncation/corruption. Returns ``(problem or None, digest,
    (width, height))``: ``digest`` is a 16-byte BLAKE2 hash of the file bytes (of the pixels for in-memory sources);
    the size is ``(0, 0)`` when the image could not be read."""
    if isinstance(source, ArraySource):
        img = np.ascontiguousarray(source.images[index])
        return None, hashlib.blake2b(img.data, digest_size=16).digest(), (int(img.shape[1]), int(img.shape[0]))
    path = source.describe(index)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return Problem("unreadable", path, f"{type(exc).__name__}: {exc.strerror or exc}"), b"", (0, 0)
    digest = hashlib.blake2b(data, digest_size=16).digest()
    try:
        with Image.open(io.BytesIO(data)) as im:
            size = (int(im.width), int(im.height))
            if im.format == "JPEG":  # DCT-scaled decode: reads every byte (finds truncation) at 1/8 of the cost
                im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
            im.load()
    except UnidentifiedImageError:
        return Problem("not-an-image", path, "not a format PIL can identify"), digest, (0, 0)
    except (OSError, SyntaxError, ValueError) as exc:
        return Problem("corrupt", path, f"{type(exc).__name__}: {exc}"), digest, (0, 0)
    return None, digest, size


def image_folder_source(root: str | os.PathLike, classes: Sequence[str] | None = None) -> FileSource:
    """An ImageFolder tree ``root/<class>/<image>`` (classes sorted by name unless given). Non-image files, empty
    class folders and entries that cannot be stat-ed are recorded in ``problems`` and left out; hidden files (names
    starting with ``.``) are ignored. Nested sub-folders inside a class folder are searched recursively.

    Raises:
        ConfigError: ``classes`` is given (another split's, e.g. train's for val) and ``root`` has class folders that
            are not in it: their images would have no label (names them).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"ImageFolder root {root} is not a directory")
    present = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if classes is None:
        classes = present
    else:
        unknown = [c for c in present if c not in set(classes)]
        if unknown:
            shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
            raise ConfigError(f"{root} has {len(unknown)} class folder(s) that the training split does not have: "
                              f"{shown}; every split needs the same classes (add them to train, or remove them)")
    if not classes:
        raise ValueError(f"ImageFolder root {root} has no class sub-folders (expected {root}/<class>/<image>)")
    paths: list[str] = []
    labels: list[int] = []
    problems: list[Problem] = []
    for label, name in enumerate(classes):
        class_dir = root / name
        found = 0
        for dirpath, dirnames, filenames in os.walk(class_dir):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fname in sorted(filenames):
                if fname.startswith("."):
                    continue
                path = os.path.join(dirpath, fname)
                if not fname.lower().endswith(IMAGE_EXTENSIONS):
                    problems.append(Problem("not-an-image", path, "file extension is not an image type"))
                    continue
                if not os.path.isfile(path):
                    problems.append(Problem("unreadable", path, "broken link or not a regular file"))
                    continue
                paths.append(path)
                labels.append(label)
                found += 1
        if found == 0:
            problems.append(Problem("empty-class", str(class_dir), "class folder holds no image files"))
    return FileSource(paths, np.asarray(labels, dtype=np.int64), list(classes), problems)
