"""``ImageDataModule``'s typed blocks ``augment`` / ``storage`` (impulsevit/data/loading/config.py): range checks naming
the
key, mappings / dataclasses / None accepted, plain dicts in the hyperparameters, the recipes' keys, and the CLI path
(dotted overrides reach the datamodule, a misspelled nested key is named with its fix, a bad value is one line)."""

from __future__ import annotations

import dataclasses
import inspect
import io
from pathlib import Path

import pytest
import torch
import yaml

from impulsevit.data.loading.config import AugmentConfig, StorageConfig
from impulsevit.data.loading.datamodule import ImageDataModule
from impulsevit.errors import ConfigError

RECIPES = sorted((Path(__file__).resolve().parents[3] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize(("block", "kwargs", "message"), [
    (AugmentConfig, {"re_prob": 1.5}, r"data.augment.re_prob must be in \[0, 1\], got 1.5"),
    (AugmentConfig, {"re_prob": -0.1}, r"data.augment.re_prob must be in \[0, 1\]"),
    (AugmentConfig, {"hflip": 2.0}, r"data.augment.hflip must be in \[0, 1\], got 2.0"),
    (AugmentConfig, {"scale": (0.0, 1.0)}, r"data.augment.scale must satisfy 0 < lo <= hi <= 1"),
    (AugmentConfig, {"scale": (0.5, 1.5)}, r"data.augment.scale must satisfy 0 < lo <= hi <= 1"),
    (AugmentConfig, {"scale": (0.9, 0.1)}, r"data.augment.scale must be a pair \[lo, hi\] with lo <= hi"),
    (AugmentConfig, {"ratio": (1.0,)}, r"data.augment.ratio must be a pair"),
    (AugmentConfig, {"ratio": (-1.0, 1.0)}, r"data.augment.ratio must be positive"),
    (AugmentConfig, {"color_jitter": -0.4}, r"data.augment.color_jitter must be >= 0 or null"),
    (AugmentConfig, {"re_mode": "noise"}, r"data.augment.re_mode must be 'pixel', 'rand' or 'const'"),
    (AugmentConfig, {"re_count": 0}, r"data.augment.re_count must be >= 1, got 0"),
    (AugmentConfig, {"repeated_aug": 0}, r"data.augment.repeated_aug must be >= 1, got 0"),
    (StorageConfig, {"preset": "res257"}, r"data.storage.preset: unknown preset 'res257'; known: \["),
    (StorageConfig, {"train_beton": "a.beton"}, r"both data.storage.train_beton and data.storage.val_beton"),
    (StorageConfig, {"val_beton": "a.beton"}, r"both data.storage.train_beton and data.storage.val_beton"),
    (StorageConfig, {"beton_check": "some"}, r"data.storage.beton_check must be 'sampled', 'full' or 'off'"),
    (StorageConfig, {"convert_limit": -1}, r"data.storage.convert_limit must be >= 0, got -1"),
    (StorageConfig, {"read_timeout": 0}, r"data.storage.read_timeout must be > 0 seconds, got 0"),
    (StorageConfig, {"block_size": 0}, r"data.storage.block_size must be >= 1 samples, got 0"),
    (StorageConfig, {"loader": "forks"}, r"data.storage.loader must be one of threads, processes, got 'forks'"),
])
def test_out_of_range_values_name_the_key_in_one_line(block, kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        block(**kwargs)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)  # callers catching ValueError keep working


def test_defaults_are_the_previous_flat_defaults_and_pairs_become_float_tuples():
    import impulsevit.data

    assert impulsevit.data.AugmentConfig is AugmentConfig and impulsevit.data.StorageConfig is StorageConfig
    aug = AugmentConfig(scale=[1, 1], ratio=[0.5, 2])
    assert aug.scale == (1.0, 1.0) and aug.ratio == (0.5, 2.0) and all(isinstance(v, float) for v in aug.scale)
    assert dataclasses.asdict(AugmentConfig()) == {
        "scale": (0.08, 1.0), "ratio": (3 / 4, 4 / 3), "hflip": 0.5, "auto_augment": None, "color_jitter": None,
        "force_color_jitter": False, "re_prob": 0.0, "re_mode": "pixel", "re_count": 1, "repeated_aug": 1}
    assert dataclasses.asdict(StorageConfig()) == {
        "preset": None, "in_memory": None, "train_beton": None, "val_beton": None, "beton_check": "sampled",
        "convert_limit": 200_000, "cache_size": "200GB", "read_timeout": 30.0, "block_size": 65536,
        "loader": "threads"}


def test_datamodule_takes_a_mapping_a_dataclass_or_none():
    from_dict = ImageDataModule("digits", backend="torchvision", image_size=8, num_workers=0,
                                augment={"re_prob": 0.25, "hflip": 0.0}, storage={"preset": "raw256"})
    assert from_dict.augment == AugmentConfig(re_prob=0.25, hflip=0.0)
    assert from_dict.storage.preset == "raw256" and from_dict.preset.name == "raw256"
    given = AugmentConfig(repeated_aug=3)
    assert ImageDataModule("digits", backend="torchvision", augment=given).augment is given
    default = ImageDataModule("digits", backend="torchvision")
    assert default.augment == AugmentConfig() and default.storage == StorageConfig()
    assert default.preset.name == "raw"  # digits is a small-image dataset
    with pytest.raises(TypeError, match=r"unknown key\(s\) \['re_prb'\] in data.augment; valid keys: \[.*'re_prob'"):
        ImageDataModule("digits", backend="torchvision", augment={"re_prb": 0.1})
    with pytest.raises(ValueError, match="data.storage.train_beton/val_beton need backend='ffcv'"):
        ImageDataModule("digits", backend="torchvision", storage={"train_beton": "a", "val_beton": "b"})


def test_hyperparameters_hold_the_blocks_as_plain_dicts():
    dm = ImageDataModule("digits", backend="torchvision", augment=AugmentConfig(re_prob=0.5))
    hp = dict(dm.hparams)
    assert hp["augment"] == dataclasses.asdict(AugmentConfig(re_prob=0.5)) and type(hp["augment"]) is dict
    assert hp["storage"] == dataclasses.asdict(StorageConfig())
    buf = io.BytesIO()
    torch.save(hp, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True) == hp  # as in a checkpoint's datamodule_hyper_parameters
    again = ImageDataModule(**hp)  # what LightningDataModule.load_from_checkpoint does
    assert again.augment == dm.augment and again.storage == dm.storage


def _image_recipes() -> list[Path]:
    return [r for r in RECIPES if yaml.safe_load(r.read_text())["data"]["class_path"].endswith("ImageDataModule")]


@pytest.mark.parametrize("recipe", _image_recipes(), ids=lambda r: r.stem)
def test_recipe_data_keys_are_where_the_datamodule_takes_them(recipe):
    """No recipe keeps a key at a place the datamodule no longer reads (e.g. ``re_prob`` at the top level)."""
    args = yaml.safe_load(recipe.read_text())["data"]["init_args"]
    params = set(inspect.signature(ImageDataModule.__init__).parameters) - {"self"}
    assert set(args) <= params, f"{recipe.name}: not ImageDataModule arguments: {sorted(set(args) - params)}"
    for key, block in (("augment", AugmentConfig), ("storage", StorageConfig)):
        fields = {f.name for f in dataclasses.fields(block)}
        given = args.get(key) or {}
        assert set(given) <= fields, f"{recipe.name}: {key} has unknown keys {sorted(set(given) - fields)}"
        block(**given)  # in range


def test_dotted_override_reaches_the_block_and_a_misspelled_one_is_named(capsys):
    from impulsevit.cli.fit_datamodule import build_datamodule

    base = ["--recipe", "deit_tiny_in1k", "--data.init_args.dataset=digits", "--data.init_args.root=null",
            "--data.init_args.backend=torchvision"]
    dm = build_datamodule([*base, "--data.init_args.augment.re_prob=0.5", "--data.init_args.storage.preset=res256"])
    recipe_augment = yaml.safe_load((RECIPES[0].parent / "deit_tiny_in1k.yaml").read_text())["data"]["init_args"][
        "augment"]
    assert dm.augment == AugmentConfig(**{**recipe_augment, "re_prob": 0.5})  # the override, the recipe's others
    assert dm.storage == StorageConfig(preset="res256")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        build_datamodule([*base, "--data.init_args.augment.re_prb=0.1"])
    assert "unknown key 'data.init_args.augment.re_prb'; did you mean 'data.init_args.augment.re_prob'?" in \
        capsys.readouterr().err


def test_fit_prints_a_bad_block_value_as_one_line(tmp_path, capsys):
    from impulsevit.cli import main

    status = main(["fit", "--recipe", "quickstart", "--data.init_args.backend=torchvision",
                   "--data.init_args.augment.re_prob=1.5", f"--runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert status == 2
    assert [ln for ln in err.splitlines() if "error" in ln] == [
        "impulsevit fit: error: data.augment.re_prob must be in [0, 1], got 1.5"], err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("arg", "line"), [
    ("--data.init_args.order=block", "data.order='block' reads a shard set's chunks a block at a time: it needs "
                                     "backend='litdata', got backend='torchvision' (use data.order=global)"),
    ("--data.init_args.order=shuffled", "key 'data.init_args.order': value 'shuffled' is not valid (expected "
                                        "'auto'/'global'/'block' | None)"),
])
def test_fit_prints_a_bad_data_order_as_one_line(arg, line, tmp_path, capsys):
    from impulsevit.cli import main

    try:  # a value outside the Literal is the parser's one line (argparse exits 2), a contradiction is ours
        status = main(["fit", "--recipe", "quickstart", "--data.init_args.backend=torchvision", arg,
                       f"--runs_dir={tmp_path / 'runs'}"])
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert status == 2 and len(errors) == 1 and line in errors[0], err
    assert not (tmp_path / "runs").exists()
