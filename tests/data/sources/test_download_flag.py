"""``data.download: true`` (set by the CPU recipes) through the real CLI: a dataset that cannot be fetched (an
``imagefolder`` tree of the user's own images) is read, not downloaded, on every subcommand that builds the data; a
missing or empty folder is one line before any work; a download that fails (an unreachable loopback mirror) is one
line naming the dataset, the root and the cause, and removes what it created, only that."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import torchvision.datasets
import yaml
from _image_files import make_cifar
from faults import harness
from PIL import Image

from impulsevit.cli import main as cli_main

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

TINY_FIT = ("--data.init_args.dataset=imagefolder", "--data.init_args.backend=torchvision",
            "--data.init_args.batch_size=4", "--data.init_args.num_workers=0", "--data.init_args.train_subset=null",
            "--data.init_args.val_subset=null", "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
            "--trainer.limit_val_batches=1")


@pytest.fixture(scope="module")
def myimgs(tmp_path_factory) -> Path:
    """``myimgs/{train,val}/{a,b}/*.png``: a class-subfolder tree of small PNGs, as a user's own images."""
    root = tmp_path_factory.mktemp("myimgs")
    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("val", 2)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for j in range(n):
                Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(root / split / c / f"{j}.png")
    return root


def _cpu_image_recipes() -> list[str]:
    """Every shipped CPU recipe (``trainer.accelerator: cpu``) that reads images through ``ImageDataModule``."""
    from impulsevit.run.recipes import available_recipes

    out = []
    for name, path in sorted(available_recipes().items()):
        recipe = yaml.safe_load(path.read_text())
        if recipe.get("trainer", {}).get("accelerator") == "cpu" and \
                recipe["data"]["class_path"].endswith("ImageDataModule"):
            out.append(name)
    return out


def test_the_image_folder_check_covers_the_cpu_recipes():
    assert {"quickstart", "cpu_fmnist_vit", "cpu_fmnist_mixer", "cpu_digits_vit"} <= set(_cpu_image_recipes())


@pytest.mark.parametrize("recipe", _cpu_image_recipes())
def test_download_true_recipe_trains_on_an_image_folder(myimgs, tmp_path, recipe):
    """Any CPU recipe trains on a user's own RGB folder of odd-sized PNGs (its size, channels and download flag
    notwithstanding)."""
    before = harness.snapshot(myimgs)
    res = harness.run("fit", "--recipe", recipe, f"--data.init_args.root={myimgs}", *TINY_FIT,
                      f"--runs_dir={tmp_path / 'runs'}", "--name=own", cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert "downloading" not in res.out + res.err
    assert (tmp_path / "runs" / "own" / "checkpoints" / "last.ckpt").is_file()
    assert harness.snapshot(myimgs) == before


def test_download_true_recipe_previews_an_image_folder(myimgs, tmp_path):
    res = harness.run("data", "preview", "--recipe", "quickstart", "--data.init_args.dataset=imagefolder",
                      f"--data.init_args.root={myimgs}", "--data.init_args.backend=torchvision",
                      "--num", "4", "--split", "train",
                      "--out", str(tmp_path / "preview"), cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert "downloading" not in res.out + res.err
    assert any((tmp_path / "preview").iterdir())


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_download_true_recipe_on_a_missing_or_empty_folder_is_one_line(tmp_path, kind):
    root = tmp_path / "myimgs"
    if kind == "empty":
        root.mkdir()
    res = harness.run("fit", "--recipe", "quickstart", f"--data.init_args.root={root}", *TINY_FIT,
                      f"--runs_dir={tmp_path / 'runs'}", "--name=own", cwd=tmp_path)
    line = harness.assert_one_line_error(res, 2, str(root))
    assert "imagefolder" in line.lower() and "expected" in line, line
    assert "downloading" not in res.out + res.err
    assert root.exists() == (kind == "empty")
    assert not (tmp_path / "runs" / "own" / "checkpoints").exists()


@pytest.fixture
def unreachable_mirror(monkeypatch) -> str:
    """torchvision's FashionMNIST pointed at a loopback port nothing listens on; Debian's copy made absent."""
    import dataclasses

    from impulsevit.data.sources import registry

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "mirrors", [url])
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    info = registry.get_dataset("fashion_mnist")
    absent = dataclasses.replace(info, default_root="/nonexistent-system-copy")
    for key in [k for k, v in registry.DATASETS.items() if v is info]:
        monkeypatch.setitem(registry.DATASETS, key, absent)
    return url


@pytest.mark.parametrize("root_exists", [False, True])
def test_failed_download_is_one_line_and_takes_back_what_it_created(tmp_path, unreachable_mirror, capsys,
                                                                   root_exists):
    root = tmp_path / "nope" / "fm"
    if root_exists:
        root.mkdir(parents=True)
        (root / "mine.txt").write_text("the user's")
    before = harness.snapshot(tmp_path)
    status = cli_main(["fit", "--recipe", "quickstart", f"--data.init_args.root={root}",
                       "--data.init_args.backend=torchvision", f"--runs_dir={tmp_path / 'runs'}", "--name=r",
                       "--trainer.fast_dev_run=1"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    line = [ln for ln in captured.err.splitlines() if ln.strip()][-1]
    assert status == 1, captured.err[-3000:]
    for needle in ("fashion_mnist", str(root), unreachable_mirror, "refused"):
        assert needle in line, line
    after = {k: v for k, v in harness.snapshot(tmp_path).items() if not k.startswith("runs")}
    assert after == before  # nope/ (or, when it existed, nothing but mine.txt) is all that is left: as before


@pytest.mark.parametrize("root_exists", [False, True])
def test_failed_download_subcommand_takes_back_what_it_created(tmp_path, unreachable_mirror, capsys, root_exists):
    """``impulsevit download`` goes through the same take-back as ``download: true``: exit 1, one line naming the
    dataset and the root, and the folder it made (or only the new entries of one that existed) gone."""
    root = tmp_path / "nope" / "fm"
    if root_exists:
        root.mkdir(parents=True)
        (root / "mine.txt").write_text("the user's")
    before = harness.snapshot(tmp_path)
    status = cli_main(["download", "fashion_mnist", str(root)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 1 and len(err) == 1 and "Traceback" not in err[0], err
    assert "fashion_mnist" in err[0] and str(root) in err[0], err
    assert harness.snapshot(tmp_path) == before


def test_count_mismatch_names_the_cli_setting_that_accepts_a_modified_copy(tmp_path):
    """A CIFAR-10 folder of 12 images is not the published one: one line that gives the setting as the command line
    spells it, and that setting, as given, trains."""
    make_cifar(tmp_path / "cifar", 10)
    args = ("fit", "--recipe", "quickstart", "--data.init_args.dataset=cifar10",
            f"--data.init_args.root={tmp_path / 'cifar'}", *TINY_FIT[1:], f"--runs_dir={tmp_path / 'runs'}", "--name=c")
    line = harness.assert_one_line_error(harness.run(*args, cwd=tmp_path), 1, "expected 50000",
                                         "--data.init_args.verify=warn")
    assert "verify='warn'" not in line
    res = harness.run(*args, "--data.init_args.verify=warn", cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]


def test_submit_plans_no_download_before_converting_an_image_folder(myimgs, tmp_path):
    """``impulsevit submit``'s conversion job (FFCV) for a ``download: true`` recipe on an image folder: the two
    conversions, no ``impulsevit download imagefolder`` before them."""
    pytest.importorskip("ffcv")
    from impulsevit.cli.convert_job import conversion_commands
    from impulsevit.cluster.sbatch import FitJob

    job = FitJob(recipe="quickstart", run_name="own", runs_dir=tmp_path / "runs", workdir=tmp_path,
                 fit_overrides=("--data.init_args.dataset=imagefolder", f"--data.init_args.root={myimgs}",
                                "--data.init_args.backend=ffcv", f"--data.init_args.cache_dir={tmp_path / 'cache'}"),
                 launcher="impulsevit", data_workers=1)
    commands = conversion_commands(job)
    assert [c[0] for c in commands] == ["convert", "convert"], commands
