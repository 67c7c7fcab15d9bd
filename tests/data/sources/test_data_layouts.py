"""Real layouts the readers accept beyond the basic ones, and the data keys of the paper recipes.

- ImageNet-1K validation labelled by the ILSVRC-2012 devkit (``meta.mat`` + ``ILSVRC2012_validation_ground_truth.txt``),
  as extracted from ``ILSVRC2012_devkit_t12.tar.gz``; the ``meta.mat`` here is written by scipy in the devkit's struct
  layout (ILSVRC2012_ID, WNID, words, gloss, num_children, ...), non-leaf synsets included.
- The recipes of the paper's 224 px small-data rows normalise with ImageNet statistics and resize bicubically (the
  paper's commands are timm's defaults there), whatever statistics the registry holds for the dataset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from _image_files import save_jpeg
from scipy.io import savemat
from test_data_registry import make_imagenet

from impulsevit.data.sources.registry import IMAGENET_MEAN, IMAGENET_STD, get_dataset

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def make_devkit(root: Path, truth: list[int]) -> None:
    """ILSVRC2012_devkit_t12/data/{meta.mat, ILSVRC2012_validation_ground_truth.txt} for the 3 wnids of
    ``make_imagenet`` (ids 1..3 in the devkit's order, which is not the sorted-wnid order) plus a non-leaf synset."""
    data = root / "ILSVRC2012_devkit_t12" / "data"
    data.mkdir(parents=True)
    rows = [(1, "n01484850", "great white shark", "", 0), (2, "n01440764", "tench", "", 0),
            (3, "n01443537", "goldfish", "", 0), (1001, "n00001740", "entity", "", 3)]
    dtype = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("gloss", "O"), ("num_children", "O")]
    synsets = np.array([tuple(r) for r in rows], dtype=dtype).reshape(-1, 1)
    savemat(data / "meta.mat", {"synsets": synsets})
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(f"{t}\n" for t in truth))


def test_imagenet_flat_val_labelled_by_the_devkit(tmp_path):
    make_imagenet(tmp_path)
    val = tmp_path / "val"
    for d in val.iterdir():  # make val flat: the tar as downloaded holds ILSVRC2012_val_%08d.JPEG
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    truth = [2, 1, 3, 1]  # tench, shark, goldfish, shark
    for i in range(len(truth)):
        save_jpeg(val / f"ILSVRC2012_val_{i + 1:08d}.JPEG", h=8, w=8, seed=i)
    info = get_dataset("imagenet")
    with pytest.raises(FileNotFoundError, match="ILSVRC2012_devkit_t12/data/meta.mat"):
        info.load(tmp_path, "val", verify="off")
    make_devkit(tmp_path, truth)
    source = info.load(tmp_path, "val", verify="off")
    # classes are the sorted train wnids: n01440764 (tench) 0, n01443537 (goldfish) 1, n01484850 (shark) 2
    assert source.labels.tolist() == [0, 2, 1, 2]
    assert [Path(p).name for p in source.paths] == [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 5)]
    (tmp_path / "ILSVRC2012_devkit_t12" / "data" / "ILSVRC2012_validation_ground_truth.txt").write_text("2\n1001\n")
    with pytest.raises(ValueError, match=r"ground_truth.txt:2: '1001' is not the ILSVRC2012_ID of a train class"):
        info.load(tmp_path, "val", verify="off")



def test_flat_val_images_the_label_file_names_but_are_missing_become_problems(tmp_path):
    """Both flat-val label files (Kaggle's csv, the devkit's ground truth): a listed image that is not on disk is left
    out as an ``unreadable`` problem saying which file listed it; the others keep their labels."""
    make_imagenet(tmp_path, flat_val=True)  # csv: val_1 -> n01484850 (2), val_2 -> n01440764 (0)
    (tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG").unlink()
    info = get_dataset("imagenet")
    source = info.load(tmp_path, "val", verify="off")
    assert [Path(p).name for p in source.paths] == ["ILSVRC2012_val_00000002.JPEG"] and source.labels.tolist() == [0]
    assert [(p.kind, Path(p.path).name, p.detail) for p in source.problems] == [
        ("unreadable", "ILSVRC2012_val_00000001.JPEG", "listed in LOC_val_solution.csv but missing")]

    (tmp_path / "LOC_val_solution.csv").unlink()
    for i in (1, 3, 4):
        save_jpeg(tmp_path / "val" / f"ILSVRC2012_val_{i:08d}.JPEG", h=8, w=8, seed=i)
    (tmp_path / "val" / "ILSVRC2012_val_00000002.JPEG").unlink()
    make_devkit(tmp_path, [2, 1, 3, 1])  # tench, shark, goldfish, shark
    source = info.load(tmp_path, "val", verify="off")
    assert [Path(p).name for p in source.paths] == [f"ILSVRC2012_val_{i:08d}.JPEG" for i in (1, 3, 4)]
    assert source.labels.tolist() == [0, 1, 2]
    assert [(p.kind, Path(p.path).name, p.detail) for p in source.problems] == [
        ("unreadable", "ILSVRC2012_val_00000002.JPEG",
         "labelled in ILSVRC2012_validation_ground_truth.txt but missing")]


SMALL_DATA_224 = ["vit_tiny_cifar10", "vit_tiny_cifar100", "vit_tiny_stl10", "vit_tiny_flowers102", "vit_tiny_pets",
                  "vit_tiny_food101", "swin_tiny_cifar10", "mixer_cifar10"]


@pytest.mark.parametrize("name", SMALL_DATA_224)
def test_small_data_recipes_use_imagenet_statistics_and_bicubic(name):
    args = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())["data"]["init_args"]
    assert args["image_size"] == 224 and args["interpolation"] == "bicubic"
    assert tuple(args["mean"]) == IMAGENET_MEAN and tuple(args["std"]) == IMAGENET_STD


def test_convmixer_recipes_state_where_their_settings_come_from():
    for path in sorted(RECIPES.glob("convmixer_*.yaml")):
        header = path.read_text().split("\nseed_everything")[0]
        assert "this project's choice" in header and "convmixer.sh" in header, path.name


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "stl10", "fashion_mnist"])
def test_torchvision_classes_refuse_files_the_hand_readers_read(tmp_path, name):
    """Why formats.py keeps its own readers (its docstring): on files in the real release format that are not the
    release's bytes (here the tests' tiny ones, in torchvision's own folders), torchvision's classes refuse to load
    (MD5 check; Fashion-MNIST: gzipped files), while the registry's readers read them. If this ever fails, torchvision
    can read these layouts and the hand reader should go."""
    import torchvision.datasets as tvd
    from test_data_registry import load_quiet, make_cifar, make_fashion_idx, make_stl10

    if name.startswith("cifar"):
        make_cifar(tmp_path, int(name[5:]))
        cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
        open_tv = lambda: cls(tmp_path, train=False)  # noqa: E731
    elif name == "stl10":
        make_stl10(tmp_path)
        open_tv = lambda: tvd.STL10(tmp_path, split="test")  # noqa: E731
    else:
        make_fashion_idx(tmp_path, gz=True)
        open_tv = lambda: tvd.FashionMNIST(tmp_path, train=False)  # noqa: E731
    with pytest.raises(RuntimeError, match="not found"):
        open_tv()
    assert len(load_quiet(name, tmp_path, get_dataset(name).val_split)) > 0
