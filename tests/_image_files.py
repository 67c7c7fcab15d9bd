"""Image files on disk for the data, conversion and fault tests: ``save_jpeg`` writes one JPEG, ``make_tree`` an
ImageFolder tree with the bad files a converter must skip (no FFCV needed, so tests of any folder can import it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def save_jpeg(path: Path, h: int = 40, w: int = 48, seed: int = 0, color: tuple[int, int, int] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if color is None:
        arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    else:
        arr = np.empty((h, w, 3), dtype=np.uint8)
        arr[:] = color
    Image.fromarray(arr).save(path, quality=95)


def make_tree(root: Path, per_class: int = 3, size: tuple[int, int] = (40, 48)) -> None:
    for split in ("train", "val"):
        for c, name in enumerate(["cat", "dog"]):
            for j in range(per_class):
                save_jpeg(root / split / name / f"{j}.jpg", h=size[0], w=size[1], seed=c * 100 + j,
                          color=(200 * c, 50, 90) if split == "val" else None)
    (root / "train" / "empty").mkdir()  # empty class folder
    (root / "val" / "empty").mkdir()
    good = (root / "train" / "cat" / "0.jpg").read_bytes()
    (root / "train" / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "train" / "dog" / "readme.txt").write_text("not an image")
    (root / "train" / "dog" / "fake.jpg").write_text("text pretending to be a jpeg")
    (root / "train" / "dog" / "dangling.jpg").symlink_to(root / "missing.jpg")
