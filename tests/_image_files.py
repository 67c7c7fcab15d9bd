"""Image files on disk for the data, conversion and fault tests: ``save_jpeg`` writes one JPEG, ``make_tree`` an
ImageFolder tree with the bad files a converter must skip, ``make_cifar`` CIFAR's pickled batches,
``cifar10_release_tarball`` the CIFAR-10 download a loopback server serves (no FFCV needed, so tests of any folder can
import it)."""

from __future__ import annotations

import io
import pickle
import tarfile
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


def make_cifar(root: Path, num_classes: int, n_train: int = 12, n_test: int = 6) -> dict[str, np.ndarray]:
    """Pickled batches as the python release has them; returns the HWC images written per split."""
    if num_classes == 10:
        base = root / "cifar-10-batches-py"
        files = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
        label_key, meta_name, meta = "labels", "batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]}
    else:
        base = root / "cifar-100-python"
        files = {"train": ["train"], "test": ["test"]}
        label_key, meta_name, meta = "fine_labels", "meta", {b"fine_label_names": [f"f{i}".encode() for i in
                                                                                      range(100)]}
    base.mkdir(parents=True)
    written = {}
    for split, n in (("train", n_train), ("test", n_test)):
        imgs = np.random.default_rng(len(split)).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        labels = np.arange(n) % num_classes
        written[split] = (imgs, labels)
        per = np.array_split(np.arange(n), len(files[split]))
        for name, idx in zip(files[split], per):
            data = imgs[idx].transpose(0, 3, 1, 2).reshape(len(idx), 3072)
            with open(base / name, "wb") as fh:
                pickle.dump({b"data": data, label_key.encode(): labels[idx].tolist(), b"batch_label": b"x"}, fh)
    with open(base / meta_name, "wb") as fh:
        pickle.dump(meta, fh)
    return written


def cifar10_release_tarball(n_train: int = 40, n_test: int = 10
                            ) -> tuple[bytes, dict[str, bytes], np.ndarray, np.ndarray]:
    """``cifar-10-python.tar.gz`` in the release's format, small: 5 train batches of ``n_train / 5`` images and a test
    batch of ``n_test``, pickled as the release's python-2 pickles load (str keys), so torchvision's ``CIFAR10``
    reads and checks them; returns (tarball, {member name: bytes} for the MD5s a test sets on that class, the test
    images ``(n_test, 32, 32, 3)`` uint8, their labels ``(n_test,)``)."""
    rng = np.random.default_rng(0)
    members: dict[str, bytes] = {}
    per = n_train // 5
    for i in range(5):
        imgs = rng.integers(0, 256, (per, 32, 32, 3), dtype=np.uint8)
        members[f"data_batch_{i + 1}"] = pickle.dumps({"batch_label": f"training batch {i + 1} of 5",
                                                       "data": imgs.transpose(0, 3, 1, 2).reshape(per, 3072),
                                                       "labels": [(i * per + j) % 10 for j in range(per)]}, protocol=2)
    imgs, labels = rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8), np.arange(n_test) % 10
    members["test_batch"] = pickle.dumps({"batch_label": "testing batch 1 of 1", "labels": labels.tolist(),
                                          "data": imgs.transpose(0, 3, 1, 2).reshape(n_test, 3072)}, protocol=2)
    members["batches.meta"] = pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}, protocol=2)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), members, imgs, labels
