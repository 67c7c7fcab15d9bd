"""Extension points from outside the package, for real: a user's module in a temp directory registers a dataset
(``impulsevit.data.register_dataset``: reader, class names, split sizes, statistics, download) and an init method for
a family of its own (``impulsevit.init.register`` with its own ``matches``); ``impulsevit fit`` trains on both in a
fresh process (``--plugins``), ``impulsevit download`` and ``impulsevit init list`` show them (an installed
distribution's ``impulsevit.plugins`` entry point and ``IMPULSEVIT_PLUGINS``). A plugin module that does not import
is one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _cli_helpers import REPO, TINY, subprocess_env

from impulsevit.cli import main

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

PLUGIN = textwrap.dedent('''
    """A user's extension: three classes of random 32 px images, and an init method for ViTs of its own family."""
    import dataclasses

    import numpy as np
    import torch

    from impulsevit.data import DatasetInfo, register_dataset
    from impulsevit.data.sources.image_source import ArraySource
    from impulsevit.init import InitResult, register

    SIZES = {"train": 24, "val": 12}


    def read_blobs(root, split):
        rng = np.random.default_rng(0 if split == "train" else 1)
        n = SIZES[split]
        images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        return ArraySource(images, np.arange(n) % 3, ["red", "green", "blue"], f"blobs/{split}")


    def fetch_blobs(root):
        (root / "blobs.txt").write_text("fetched")


    register_dataset(DatasetInfo(
        name="blobs", num_classes=3, split_sizes=SIZES, train_split="train", val_split="val", mean=(0.5,) * 3,
        std=(0.25,) * 3, reader=read_blobs, markers=("blobs.txt",), small=True, needs_root=False,
        description="three classes of noise", download=fetch_blobs))


    def is_small_vit(model):
        return type(model).__name__ == "VisionTransformer" and len(model.blocks) <= 4


    @dataclasses.dataclass(frozen=True)
    class FlatPosOptions:
        scale: float = 0.02


    @register("flat_pos", family="small_vit", matches=is_small_vit, options=FlatPosOptions)
    def flat_pos(model, generator, options):
        model.pos_embed.copy_(torch.randn(model.pos_embed.shape, generator=generator) * options.scale)
        return InitResult(options={"scale": options.scale}, notes=["pos_embed from the plugin"])
''')


def _write(root: Path, module: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(PLUGIN)
    return root


def _cli(*args: str, pythonpath: list[Path]) -> subprocess.CompletedProcess:
    env = subprocess_env()
    env["PYTHONPATH"] = ":".join([*map(str, pythonpath), env["PYTHONPATH"]])
    return subprocess.run([sys.executable, "-m", "impulsevit.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_fit_trains_on_a_plugin_dataset_with_a_plugin_init_family(tmp_path):
    src = _write(tmp_path / "src", "user_ext_fit")
    data = {"class_path": "impulsevit.data.ImageDataModule",
            "init_args": {"dataset": "blobs", "backend": "torchvision", "image_size": 32, "batch_size": 8,
                          "num_workers": 0, "cache_dir": str(tmp_path / "cache")}}
    out = _cli("fit", "--plugins", "user_ext_fit", "--recipe", str(TINY), f"--runs_dir={tmp_path}", "--name=ext",
               "--trainer.max_epochs=1", f"--data={json.dumps(data)}", "--model.init.method=flat_pos",
               '--model.init.options={"scale": 0.5}', pythonpath=[src])
    assert out.returncode == 0, out.stderr[-3000:]
    ckpt = torch.load(tmp_path / "ext" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["datamodule_hyper_parameters"]["dataset"] == "blobs"
    assert ckpt["global_step"] == 3  # 24 images in batches of 8, one epoch
    head = next(v for k, v in ckpt["state_dict"].items() if k.endswith("head.weight"))
    assert head.shape[0] == 3  # the registration's class count reached the model
    state = next(v for k, v in ckpt["callbacks"].items() if k.startswith("Initializer"))
    report = state["report"]
    assert state["applied"] and report["method"] == "flat_pos" and report["family"] == "small_vit"
    assert report["options"] == {"scale": 0.5} and report["notes"] == ["pos_embed from the plugin"]


def _dist_info(site: Path, module: str) -> None:
    """An installed distribution ``userext 0.1`` whose ``impulsevit.plugins`` entry point names ``module``."""
    info = site / "userext-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: userext\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[impulsevit.plugins]\nblobs = {module}\n")


def test_download_and_init_list_show_an_installed_plugin(tmp_path):
    """The entry point of an installed distribution (``--plugins`` and ``IMPULSEVIT_PLUGINS`` are the fit test's)."""
    src = _write(tmp_path / "src", "user_ext_list")
    _dist_info(src, "user_ext_list")
    driver = (f"from impulsevit.cli import main; import sys; "
              f"a = main(['download', 'blobs', {str(tmp_path / 'blobs')!r}]); print('== list', flush=True); "
              "b = main(['init', 'list']); sys.exit(a or b)")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{src}:{env['PYTHONPATH']}"
    out = subprocess.run([sys.executable, "-c", driver], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    downloaded, listing = out.stdout.split("== list\n")
    assert (tmp_path / "blobs" / "blobs.txt").read_text() == "fetched"
    assert "blobs is in" in downloaded and "(train 24, val 12 images)" in downloaded
    row = next(line for line in listing.splitlines() if line.startswith("flat_pos "))
    assert row.split()[1:4] == ["registered", "small_vit", "registered"] and row.endswith("by user_ext_list")


def test_a_plugin_module_that_does_not_import_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("IMPULSEVIT_PLUGINS", "")
    assert main(["recipes", "--plugins", "no_such_plugin_xyz"]) == 2
    assert os.environ["IMPULSEVIT_PLUGINS"] == ""  # a plugin that failed is not handed on to later processes
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert ("impulsevit: error: plugin module 'no_such_plugin_xyz' (from IMPULSEVIT_PLUGINS / --plugins) cannot be "
            "imported: ModuleNotFoundError") in err


def test_register_dataset_refuses_a_taken_name():
    from impulsevit.data import DatasetInfo, get_dataset, register_dataset

    cifar = get_dataset("cifar10")
    clash = DatasetInfo(name="mine", num_classes=2, split_sizes={}, train_split="train", val_split="val",
                        mean=(0.5,) * 3, std=(0.5,) * 3, reader=cifar.reader, aliases=("cifar-10",))
    with pytest.raises(ValueError, match="name 'cifar-10' of dataset 'mine' is already registered"):
        register_dataset(clash)
    assert get_dataset("cifar-10") is cifar and "mine" not in __import__("impulsevit.data").data.list_datasets()
