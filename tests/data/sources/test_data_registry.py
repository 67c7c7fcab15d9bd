"""Dataset registry: tiny fake datasets written in each real on-disk format are read back exactly; count checks fire
with a clear message; real Fashion-MNIST and sklearn digits match the registry's numbers and statistics.

``make_imagenet`` is reused by tests/data/sources/test_data_layouts.py (``make_cifar`` and ``save_jpeg`` are in
tests/_image_files.py).
"""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from _image_files import make_cifar, save_jpeg

from impulsevit.data.sources.formats import read_idx
from impulsevit.data.sources.image_source import image_folder_source
from impulsevit.data.sources.registry import DatasetMismatchError, detect_dataset, get_dataset, list_datasets


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def make_stl10(root: Path, n: int = 4) -> np.ndarray:
    base = root / "stl10_binary"
    base.mkdir(parents=True)
    imgs = _rng(1).integers(0, 256, (n, 96, 96, 3), dtype=np.uint8)
    imgs[0, 0, 5] = (255, 0, 0)  # row 0, column 5 red: catches a row/column mix-up
    for split in ("train", "test"):
        imgs.transpose(0, 3, 2, 1).tofile(base / f"{split}_X.bin")  # column-major per channel, as released
        (np.arange(n) % 10 + 1).astype(np.uint8).tofile(base / f"{split}_y.bin")
    (base / "class_names.txt").write_text("\n".join(f"s{i}" for i in range(10)) + "\n")
    return imgs


def make_flowers(root: Path) -> None:
    from scipy.io import savemat

    base = root / "flowers-102"
    n = 10
    for i in range(1, n + 1):
        save_jpeg(base / "jpg" / f"image_{i:05d}.jpg", seed=i)
    savemat(base / "imagelabels.mat", {"labels": np.array([[1, 2, 3, 4, 5, 102, 7, 8, 9, 10]])})
    savemat(base / "setid.mat", {"trnid": np.array([[1, 2, 3]]), "valid": np.array([[4, 5]]),
                                 "tstid": np.array([[6, 7, 8, 9, 10]])})


def make_pets(root: Path) -> None:
    base = root / "oxford-iiit-pet"
    rows = {"trainval": ["Abyssinian_1 1 1 1", "Abyssinian_2 1 1 1", "american_bulldog_3 2 2 1"],
            "test": ["yorkshire_terrier_9 37 2 25", "Abyssinian_5 1 1 1"]}
    for split, lines in rows.items():
        (base / "annotations").mkdir(parents=True, exist_ok=True)
        (base / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
        for line in lines:
            save_jpeg(base / "images" / f"{line.split()[0]}.jpg")


def make_food101(root: Path) -> None:
    base = root / "food-101"
    classes = ["apple_pie", "baby_back_ribs", "waffles"]
    (base / "meta").mkdir(parents=True)
    (base / "meta" / "classes.txt").write_text("\n".join(classes) + "\n")
    train = {"apple_pie": ["apple_pie/101", "apple_pie/102"], "waffles": ["waffles/7"]}
    test = {"baby_back_ribs": ["baby_back_ribs/55"]}
    for name, listing in (("train", train), ("test", test)):
        (base / "meta" / f"{name}.json").write_text(json.dumps(listing))
        for items in listing.values():
            for rel in items:
                save_jpeg(base / "images" / f"{rel}.jpg")


def make_imagenet(root: Path, flat_val: bool = False) -> None:
    wnids = ["n01440764", "n01443537", "n01484850"]
    for k, w in enumerate(wnids):
        for j in range(2):
            save_jpeg(root / "train" / w / f"{w}_{j}.JPEG", seed=k * 10 + j)
    if flat_val:
        lines = ["ImageId,PredictionString"]
        for j, w in enumerate(["n01484850", "n01440764"]):
            image_id = f"ILSVRC2012_val_{j + 1:08d}"
            save_jpeg(root / "val" / f"{image_id}.JPEG")
            lines.append(f"{image_id},{w} 1 2 3 4")
        (root / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
    else:
        for w in wnids:
            save_jpeg(root / "val" / w / "ILSVRC2012_val_x.JPEG")


def make_fashion_idx(root: Path, n: int = 5, gz: bool = True) -> np.ndarray:
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    imgs = _rng(3).integers(0, 256, (n, 28, 28), dtype=np.uint8)
    for prefix in ("train", "t10k"):
        img_bytes = (0x803).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (n, 28, 28)) + imgs.tobytes()
        lab_bytes = (0x801).to_bytes(4, "big") + n.to_bytes(4, "big") + bytes(range(n))
        for stem, data in ((f"{prefix}-images-idx3-ubyte", img_bytes), (f"{prefix}-labels-idx1-ubyte", lab_bytes)):
            if gz:
                with gzip.open(raw / (stem + ".gz"), "wb") as fh:
                    fh.write(data)
            else:
                (raw / stem).write_bytes(data)
    return imgs


def load_quiet(name: str, root, split: str):  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_dataset(name).load(root, split, verify="warn")


# ----------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("num_classes", [10, 100])
def test_cifar_pickles_read_back_exactly(tmp_path, num_classes):
    written = make_cifar(tmp_path, num_classes)
    name = f"cifar{num_classes}"
    assert detect_dataset(tmp_path).name == name
    for split in ("train", "test"):
        src = load_quiet(name, tmp_path, split)
        imgs, labels = written[split]
        assert len(src) == len(imgs)
        np.testing.assert_array_equal(src.labels, labels)
        for i in (0, len(imgs) - 1):
            np.testing.assert_array_equal(src.load(i), imgs[i])
    assert src.classes[1] == ("c1" if num_classes == 10 else "f1")


def test_stl10_column_major_binary(tmp_path):
    imgs = make_stl10(tmp_path)
    src = load_quiet("stl10", tmp_path, "train")
    assert src.load(0)[0, 5].tolist() == [255, 0, 0]
    np.testing.assert_array_equal(src.load(3), imgs[3])
    np.testing.assert_array_equal(src.labels, [0, 1, 2, 3])
    assert src.classes[0] == "s0"


def test_flowers_mat_splits(tmp_path):
    make_flowers(tmp_path)
    train = load_quiet("flowers102", tmp_path, "train")
    assert [Path(p).name for p in train.paths] == ["image_00001.jpg", "image_00002.jpg", "image_00003.jpg"]
    np.testing.assert_array_equal(train.labels, [0, 1, 2])
    test = load_quiet("flowers102", tmp_path, "test")
    assert test.labels[0] == 101 and len(test) == 5
    assert len(load_quiet("flowers102", tmp_path, "trainval")) == 5
    assert test.load(0).shape == (40, 48, 3)


def test_pets_annotation_lists(tmp_path):
    make_pets(tmp_path)
    tv = load_quiet("pets", tmp_path, "trainval")
    np.testing.assert_array_equal(tv.labels, [0, 0, 1])
    assert tv.classes[0] == "Abyssinian" and tv.classes[1] == "american_bulldog" and len(tv.classes) == 37
    test = load_quiet("pets", tmp_path, "test")
    np.testing.assert_array_equal(test.labels, [36, 0])


def test_pets_malformed_line_names_file_and_line(tmp_path):
    make_pets(tmp_path)
    (tmp_path / "oxford-iiit-pet" / "annotations" / "test.txt").write_text("Abyssinian_5 1 1 1\nbroken line\n")
    with pytest.raises(ValueError, match=r"test\.txt:2: expected 'Name_123 class_id species breed_id'"):
        get_dataset("pets").load(tmp_path, "test", verify="off")


def test_food101_json_meta(tmp_path):
    make_food101(tmp_path)
    train = load_quiet("food101", tmp_path, "train")
    np.testing.assert_array_equal(train.labels, [0, 0, 2])
    assert Path(train.paths[2]).parts[-2:] == ("waffles", "7.jpg")
    assert load_quiet("food101", tmp_path, "test").labels.tolist() == [1]


@pytest.mark.parametrize("flat_val", [False, True])
def test_imagenet_train_and_both_val_layouts(tmp_path, flat_val):
    make_imagenet(tmp_path, flat_val=flat_val)
    train = load_quiet("imagenet", tmp_path, "train")
    assert train.classes == ["n01440764", "n01443537", "n01484850"]
    np.testing.assert_array_equal(train.labels, [0, 0, 1, 1, 2, 2])
    val = load_quiet("imagenet", tmp_path, "val")
    assert val.labels.tolist() == ([2, 0] if flat_val else [0, 1, 2])


@pytest.mark.parametrize("release", ["winter21_whole", "fall11_whole"])
def test_imagenet21k_reads_uneven_classes_and_checks_release_totals(tmp_path, release):
    """Real IN-21K trees have classes of 1 to ~3,000 images: validation takes min(50, n // 2) of each class (the
    first by name), training the rest; the count check compares the whole tree with the published release totals."""
    import dataclasses

    base = tmp_path / release
    counts = {"n00004475": 1, "n00005787": 3, "n00006024": 120}
    for w, n in counts.items():
        for j in range(n):
            save_jpeg(base / w / f"{w}_{j:04d}.JPEG", h=8, w=8, seed=j)
    info = get_dataset("imagenet21k")
    assert detect_dataset(tmp_path) is info
    val, train = (info.load(tmp_path, s, verify="off") for s in ("val", "train"))
    assert val.class_counts() == {"n00004475": 0, "n00005787": 1, "n00006024": 50}
    assert train.class_counts() == {"n00004475": 1, "n00005787": 2, "n00006024": 70}
    assert [Path(p).name for p in val.paths[:2]] == ["n00005787_0000.JPEG", "n00006024_0000.JPEG"]
    assert not set(val.paths) & set(train.paths) and len(val) + len(train) == sum(counts.values())
    with pytest.raises(DatasetMismatchError, match=r"3 classes and 124 images \(both splits\).*winter21_whole: "
                                                   r"19,167 classes, 13,153,500 images; fall11_whole: 21,841"):
        info.load(tmp_path, "train")
    same_totals = dataclasses.replace(info, releases={release: (3, 124)})
    assert len(same_totals.load(tmp_path, "val")) == 51  # verify='error' passes: no per-class minimum anywhere
    (base / "n00004475.tar").write_bytes(b"")
    with pytest.raises(ValueError, match="extract them first"):
        info.load(tmp_path, "train", verify="off")


@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_idx_files(tmp_path, gz):
    imgs = make_fashion_idx(tmp_path, gz=gz)
    src = load_quiet("fashion_mnist", tmp_path, "train")
    out = src.load(2)
    assert out.shape == (28, 28, 3)
    for c in range(3):  # grayscale replicated to 3 channels
        np.testing.assert_array_equal(out[:, :, c], imgs[2])
    np.testing.assert_array_equal(src.labels, np.arange(5))


def test_idx_truncated_file_is_reported(tmp_path):
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes((0x803).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (3, 28, 28)) + b"\0" * 10)
    with pytest.raises(ValueError, match="header says"):
        read_idx(path)


def test_count_mismatch_raises_with_root_split_and_numbers(tmp_path):
    make_cifar(tmp_path, 10)
    with pytest.raises(DatasetMismatchError) as exc:
        get_dataset("cifar10").load(tmp_path, "train")
    msg = str(exc.value)
    assert "cifar10 split 'train'" in msg and str(tmp_path) in msg and "12 images, expected 50000" in msg
    with pytest.warns(UserWarning, match="12 images, expected 50000"):
        get_dataset("cifar10").load(tmp_path, "train", verify="warn")


def test_missing_files_and_unknown_names_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        get_dataset("cifar10").load(tmp_path, "train")
    with pytest.raises(KeyError, match="unknown dataset 'cifar11'"):
        get_dataset("cifar11")
    with pytest.raises(ValueError, match="needs a root folder"):
        get_dataset("imagenet").load(None, "train")
    with pytest.raises(ValueError, match="has splits"):
        get_dataset("cifar10").load(tmp_path, "val")
    assert {"cifar10", "cifar100", "stl10", "flowers102", "pets", "food101", "imagenet", "imagenet21k",
            "fashion_mnist", "digits", "imagefolder"} <= set(list_datasets())


def test_image_folder_lists_problems(tmp_path):
    save_jpeg(tmp_path / "a" / "1.jpg")
    (tmp_path / "a" / "notes.txt").write_text("hello")
    (tmp_path / "b").mkdir()
    (tmp_path / "c" / "sub").mkdir(parents=True)
    save_jpeg(tmp_path / "c" / "sub" / "2.png")
    (tmp_path / "c" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    src = image_folder_source(tmp_path)
    assert src.classes == ["a", "b", "c"]
    assert [Path(p).name for p in src.paths] == ["1.jpg", "2.png"]
    kinds = sorted((p.kind, Path(p.path).name) for p in src.problems)
    assert kinds == [("empty-class", "b"), ("not-an-image", "notes.txt"), ("unreadable", "gone.jpg")]


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_real_fashion_mnist_matches_registry():
    info = get_dataset("fashion_mnist")
    src = info.load(None, "test")  # verify="error": real counts must match
    assert len(src) == 10_000 and src.class_counts()["Bag"] == 1000
    x = src.images.astype(np.float64) / 255
    assert abs(x.mean() - info.mean[0]) < 0.01 and abs(x.std() - info.std[0]) < 0.01


def test_real_digits_matches_registry():
    info = get_dataset("digits")
    train, test = info.load(None, "train"), info.load(None, "test")
    assert len(train) + len(test) == 1797 and not set(map(tuple, train.images.reshape(len(train), -1)[:50])) & set(
        map(tuple, test.images.reshape(len(test), -1)))
    x = np.concatenate([train.images, test.images]).astype(np.float64) / 255
    assert abs(x.mean() - info.mean[0]) < 1e-3 and abs(x.std() - info.std[0]) < 1e-3
