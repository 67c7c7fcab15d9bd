"""Silent mismatches refused before any work: a ``.beton`` whose manifest names another dataset, class list, preset,
statistics or subset than the run, and a training split with fewer samples per process than one batch (which used to
"finish" with no step and no checkpoint, and left a run directory that refused the fixed retry).

Real parts throughout: ``.beton`` files written by the real ``impulsevit convert`` from a tiny ImageFolder tree
(``tests/_image_files.py``'s ``make_tree``), the real ``impulsevit fit`` as a child process (the fault harness), the
real Lightning DDP launcher's world size."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from _image_files import make_tree as _make_tree
from _image_files import save_jpeg

from impulsevit.data.loading.base import check_train_batches
from impulsevit.data.loading.synthetic import SyntheticDataModule
from impulsevit.errors import ConfigError

from .harness import TINY, assert_one_line_error, run, snapshot

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

SHORT = ("--trainer.max_epochs=1", "--trainer.num_sanity_val_steps=0")


def _fit(tmp: Path, *extra: str, name: str = "r") -> tuple:
    return ("fit", "--recipe", str(TINY), f"--runs_dir={tmp / 'runs'}", f"--name={name}", *SHORT, *extra)


def _data(**init_args: object) -> str:
    args = {"dataset": "imagefolder", "image_size": 32, "num_workers": 1, **init_args}
    return "--data=" + json.dumps({"class_path": "impulsevit.data.ImageDataModule", "init_args": args})


def _trained(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "last.ckpt").is_file()


def make_tree(root: Path, per_class: int = 3) -> None:
    """tests/_image_files.py's tree (train/val, classes cat, dog, an empty one, and bad files among the training
    images), 32 px."""
    _make_tree(root, per_class=per_class, size=(32, 32))


def clean_tree(root: Path, per_class: int = 3) -> None:
    """``root/{train,val}/{cat,dog}/<i>.jpg``, 32 px, every file a readable image."""
    for split in ("train", "val"):
        for c, name in enumerate(("cat", "dog")):
            for j in range(per_class):
                save_jpeg(root / split / name / f"{j}.jpg", h=32, w=32, seed=c * 100 + j)


# ---------------------------------------------------------------------------------------------- a training split
# smaller than one batch


def test_the_check_counts_batches_as_the_loaders_do():
    """Pure: zero full batches per process (drop_last) is refused, naming the count, batch x processes and the fix;
    one batch is enough; repeated augmentation does not add samples to an epoch."""
    check_train_batches(6, 6)
    check_train_batches(5, 3, 2)  # 3 per process (padded) -> one batch each
    with pytest.raises(ConfigError, match=r"has 6 sample\(s\), fewer than one batch of data.batch_size 8 x 1 "
                                          r"process.*at most 6"):
        check_train_batches(6, 8)
    with pytest.raises(ConfigError, match=r"has 24 sample\(s\) \(12 per process\).*16 x 2 processes.*at most 12"):
        check_train_batches(24, 16, 2)
    with pytest.raises(ConfigError, match=r"repeated_aug=3.*at most 6"):
        check_train_batches(12, 8, 2, repeats=3)


def test_synthetic_loader_refuses_zero_steps_outside_the_cli():
    """The loader-side check (a plain ``Trainer`` user, or a count only known after conversion): one clear error
    from the training loader instead of Lightning's "Trainer.fit stopped: No training batches"."""
    dm = SyntheticDataModule(num_classes=2, image_size=8, num_train=8, num_val=8, batch_size=16)
    dm.setup("fit")
    with pytest.raises(ConfigError, match=r"synthetic training split \(data.num_train\) has 8 sample.*raise "
                                          r"data.num_train"):
        dm.train_dataloader()
    dm.val_dataloader()  # a validation split smaller than a batch is fine (its last batch is kept)


def test_synthetic_split_smaller_than_a_batch_then_the_fixed_retry_trains(tmp_path):
    res = run(*_fit(tmp_path, "--data.init_args.num_train=8"), cwd=tmp_path)
    assert_one_line_error(res, 2, "data.num_train", "8 sample(s)", "data.batch_size 16 x 1 process",
                          "at most 8")
    assert not (tmp_path / "runs").exists()  # nothing written, so nothing blocks the retry
    res = run(*_fit(tmp_path, "--data.init_args.num_train=8", "--data.init_args.batch_size=4"), cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert _trained(tmp_path / "runs" / "r")


def test_ddp_share_smaller_than_a_batch_is_refused_before_launch(tmp_path):
    """24 samples over 2 processes is 12 per process, below a batch of 16: refused in the launching process, before
    any rank starts or any file is written."""
    res = run(*_fit(tmp_path, "--data.init_args.num_train=24", "--trainer.devices=2", "--trainer.strategy=ddp"),
              cwd=tmp_path)
    assert_one_line_error(res, 2, "24 sample(s) (12 per process)", "16 x 2 processes", "at most 12")
    assert not (tmp_path / "runs").exists()


def test_torchvision_split_smaller_than_a_batch_then_the_fixed_retry_trains(tmp_path):
    clean_tree(tmp_path / "src")  # 6 training images
    tree = snapshot(tmp_path / "src")
    data = {"root": str(tmp_path / "src"), "backend": "torchvision", "num_workers": 0}
    res = run(*_fit(tmp_path, _data(batch_size=8, **data)), cwd=tmp_path)
    assert_one_line_error(res, 2, "training split 'train' of dataset 'imagefolder' has 6 sample(s)",
                          "data.batch_size 8 x 1 process", "set data.batch_size to at most 6")
    assert not (tmp_path / "runs").exists()
    assert snapshot(tmp_path / "src") == tree
    res = run(*_fit(tmp_path, _data(batch_size=4, **data)), cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert _trained(tmp_path / "runs" / "r")


@pytest.mark.ffcv
@pytest.mark.slow
def test_ffcv_cached_split_smaller_than_a_batch_then_the_fixed_retry_trains(tmp_path):
    """The ffcv backend converting into ``cache_dir`` itself: a subset below the batch is refused before the
    conversion (no cache, no run). Without it the tree lists 8 images, but 2 are unreadable and the conversion skips
    them: the training loader refuses the 6 left (after the conversion, so the cache stays; the run directory the
    start had made is taken back). The retry with a batch that fits trains on the cached files, though its
    validation split (6 images) is smaller than the batch (a partial validation batch is kept)."""
    pytest.importorskip("ffcv")
    make_tree(tmp_path / "src")
    data = {"root": str(tmp_path / "src"), "cache_dir": str(tmp_path / "cache")}
    res = run(*_fit(tmp_path, _data(batch_size=8, train_subset=4, **data)), cwd=tmp_path)
    assert_one_line_error(res, 2, "(data.train_subset=4) has 4 sample(s)", "data.batch_size 8 x 1 process",
                          "at most 4", "raise data.train_subset")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()
    res = run(*_fit(tmp_path, _data(batch_size=8, **data)), cwd=tmp_path)
    assert_one_line_error(res, 2, "training split 'train' of dataset 'imagefolder' has 6 sample(s)",
                          "data.batch_size 8 x 1 process", "at most 6")
    assert not (tmp_path / "runs").exists() and len(list((tmp_path / "cache").glob("*.beton"))) == 2
    res = run(*_fit(tmp_path, _data(batch_size=4, **data)), cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert _trained(tmp_path / "runs" / "r")


# ---------------------------------------------------------------------------------------------- .beton of another
# dataset / class list / preset / statistics


@pytest.fixture(scope="module")
def betons(tmp_path_factory) -> dict[str, Path]:
    """``train`` / ``val``: the two splits of a tiny ImageFolder tree (classes cat, dog, empty) converted by the real
    ``impulsevit convert``; ``other``: the train split of another tree (classes ant, bee)."""
    pytest.importorskip("ffcv")
    tmp = tmp_path_factory.mktemp("betons")
    make_tree(tmp / "src")
    for name in ("ant", "bee"):
        shutil.copytree(tmp / "src" / "train" / "cat", tmp / "other" / name, ignore=shutil.ignore_patterns("trunc*"))
    for src, dst in ((tmp / "src", tmp / "out"), (tmp / "other", tmp / "other.beton")):
        res = run("convert", str(src), str(dst), "--workers", "1", "--no-progress", cwd=tmp)
        assert res.rc == 0, res.err[-3000:]
    return {"train": tmp / "out" / "train.beton", "val": tmp / "out" / "val.beton", "other": tmp / "other.beton"}


def _storage(train: Path, val: Path) -> tuple[str, str]:
    return (f"--data.init_args.storage.train_beton={train}", f"--data.init_args.storage.val_beton={val}")


@pytest.mark.ffcv
def test_beton_of_another_dataset_is_refused_before_work(betons, tmp_path):
    """imagefolder files given to a cifar10 run (which would normalise with CIFAR's statistics and expect its 10
    classes): one line naming both files, the recorded dataset and the run's; no run directory."""
    res = run(*_fit(tmp_path, _data(dataset="cifar10", batch_size=2), *_storage(betons["train"], betons["val"])),
              cwd=tmp_path)
    line = assert_one_line_error(res, 2, f"data.storage.train_beton {betons['train']}",
                                 f"data.storage.val_beton {betons['val']}",
                                 "converted from dataset 'imagefolder' but the run's data.dataset is 'cifar10'")
    assert "set data.dataset" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.ffcv
def test_train_and_val_betons_with_other_class_lists_are_refused(betons, tmp_path):
    res = run(*_fit(tmp_path, _data(batch_size=2), *_storage(betons["other"], betons["val"])), cwd=tmp_path)
    assert_one_line_error(res, 2, str(betons["other"]), str(betons["val"]), "hold different class lists",
                          "another class in validation than in training")
    assert not (tmp_path / "runs").exists()


@pytest.mark.ffcv
def test_preset_subset_and_statistics_mismatches_name_the_field(betons, tmp_path):
    """In-process (the datamodule's constructor is where ``fit`` meets them): another explicit preset, a
    ``train_subset`` a given file does not have, statistics recorded at conversion that differ from the run's; an
    explicit ``data.mean`` / ``data.std`` is deliberate and accepted."""
    from impulsevit.data.loading.datamodule import ImageDataModule

    storage = {"train_beton": str(betons["train"]), "val_beton": str(betons["val"])}
    with pytest.raises(ConfigError, match=r"stored with preset 'short256' but the run's data.storage.preset is "
                                          r"'raw'"):
        ImageDataModule("imagefolder", image_size=32, storage={**storage, "preset": "raw"})
    with pytest.raises(ConfigError, match=r"train_beton .*holds 6 images \(converted with subset None\) but the "
                                          r"run's data.train_subset is 4"):
        ImageDataModule("imagefolder", image_size=32, train_subset=4, storage=storage)
    ImageDataModule("imagefolder", image_size=32, train_subset=6, storage=storage)  # the whole file: no subset
    # a registry whose statistics changed since the conversion (as recorded in an older manifest)
    folder = tmp_path / "old"
    folder.mkdir()
    for split in ("train", "val"):
        shutil.copy(betons[split], folder / f"{split}.beton")
        manifest = json.loads(betons[split].with_name(f"{split}.manifest.json").read_text())
        manifest["normalization"] = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
        (folder / f"{split}.manifest.json").write_text(json.dumps(manifest))
    old = {"train_beton": str(folder / "train.beton"), "val_beton": str(folder / "val.beton")}
    with pytest.raises(ConfigError, match=r"converted with mean \[0.5, 0.5, 0.5\] / std \[0.25, 0.25, 0.25\] but "
                                          r"the run normalises with mean \[0.485"):
        ImageDataModule("imagefolder", image_size=32, storage=old)
    ImageDataModule("imagefolder", image_size=32, storage=old, mean=(0.5,) * 3, std=(0.25,) * 3)


@pytest.mark.ffcv
def test_beton_without_a_manifest_is_used_with_one_warning(betons, tmp_path):
    """A .beton converted elsewhere (no manifest): what cannot be checked is said once; the class count comes from
    its labels, and a split too small for the batch is still refused (its header's count)."""
    from impulsevit.data.loading.datamodule import ImageDataModule

    for split in ("train", "val"):
        shutil.copy(betons[split], tmp_path / f"{split}.beton")
    storage = {"train_beton": str(tmp_path / "train.beton"), "val_beton": str(tmp_path / "val.beton")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm = ImageDataModule("imagefolder", image_size=32, batch_size=8, storage=storage)
    notes = [str(w.message) for w in caught if "no manifest" in str(w.message)]
    assert len(notes) == 1, [str(w.message) for w in caught]
    assert str(tmp_path / "train.beton") in notes[0] and str(tmp_path / "val.beton") in notes[0]
    assert "cannot be checked" in notes[0]
    assert dm.num_classes == 2  # labels 0..1 (the empty class folder holds no sample)
    assert dm.train_samples() == 6
    with pytest.raises(ConfigError, match=r"has 6 sample\(s\), fewer than one batch of data.batch_size 8"):
        dm.check_fits_batch(1)
