"""The ``impulsevit`` command line: argv handling, recipes, bad input, run directories, every recipe under fast_dev_run.

Runs use the real LightningCLI in-process on tiny models and synthetic data (``recipes/tiny_synthetic.yaml``).
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from _cli_helpers import REPO, TINY, run_cli, scalars, state_dict, tiny

from impulsevit.cli import main, prepare_argv
from impulsevit.run.recipes import RecipeNotFoundError, available_recipes, describe, resolve_recipe

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))

# backbone name prefix -> backbone_kwargs of a tiny member of the same family (img 32 unless given). A recipe whose
# backbone has no entry fails test_every_recipe_fast_dev_run: add one here rather than skipping the recipe.
SHRINK: dict[tuple[str, ...], dict] = {
    ("vit_", "deit_", "deit3_"): {"img_size": 32, "patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 2},
    ("swin_",): {"img_size": 32, "patch_size": 2, "window_size": 4, "embed_dim": 16, "depths": [2, 2],
                 "num_heads": [2, 2]},
    ("eva02_",): {"img_size": 32, "patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 2},
    ("mixer_any",): {"img_size": 32, "patch_size": 8, "embed_dim": 64, "num_blocks": 2},
    ("mixer_",): {"img_size": 64},  # timm's mixer entry points fix patch / width / depth: Mixer-S/16 on 4x4 tokens
    ("convmixer",): {"dim": 32, "depth": 2, "kernel_size": 3, "patch_size": 4},
}


# ----------------------------------------------------------------------------------------------- argv and recipes
def test_prepare_argv_moves_subcommand_resolves_recipe_and_names_the_run():
    argv = prepare_argv(["--recipe", "tiny_synthetic", "--trainer.max_epochs", "3", "fit"])
    assert argv[0] == "fit"
    assert argv[1] == "--name=tiny_synthetic"
    assert argv[argv.index("--recipe") + 1] == str(TINY.resolve())
    assert argv[-2:] == ["--trainer.max_epochs", "3"]
    # an explicit --name wins and is not duplicated; `=` form and .yaml suffix are accepted
    argv = prepare_argv(["fit", "--recipe=tiny_synthetic.yaml", "--name", "mine"])
    assert [a for a in argv if a.startswith("--name")] == ["--name"] and argv[argv.index("--name") + 1] == "mine"
    # an option value equal to a subcommand name is not taken for the subcommand
    assert prepare_argv(["--name", "fit", "test"])[:1] == ["test"]


def test_a_recipe_s_init_options_stay_with_its_method(tmp_path, capsys):
    """``fit --recipe R --model.init.method=torch`` on a recipe whose ``model.init.options`` are impulse's (the
    Mixer recipes; every study of them) starts torch from no options, says so once, and trains; options given on
    the command line are kept."""
    recipe = tmp_path / "tiny_with_options.yaml"
    recipe.write_text(TINY.read_text().replace("init: {method: impulse, seed: 0}",
                                               "init: {method: impulse, seed: 0, options: {gain_pos: 18.0}}"))
    assert "gain_pos" in recipe.read_text()
    cli = run_cli("fit", "--recipe", str(recipe), f"--runs_dir={tmp_path}", "--name=torch", "--trainer.max_steps=1",
                  "--model.init.method=torch")
    assert cli.trainer.global_step == 1 and dict(cli.model.init_cfg.options) == {}
    err = capsys.readouterr().err
    assert "the recipe's model.init.options {'gain_pos': 18.0} are for 'impulse'; --model.init.method=torch starts " \
           "from none" in err
    argv = prepare_argv(["fit", "--recipe", str(recipe), "--model.init.method", "impulse"])
    assert "--model.init.options={}" not in argv  # the recipe's own method keeps its options
    argv = prepare_argv(["fit", "--recipe", str(recipe), "--model.init.method=timm",
                         '--model.init.options={"mode": ""}'])
    assert "--model.init.options={}" not in argv  # options given for the new method are the user's


def test_recipe_names_resolve_and_unknown_names_name_the_closest_ones(capsys):
    assert resolve_recipe("quickstart") == (REPO / "recipes" / "quickstart.yaml").resolve()
    assert resolve_recipe(str(TINY)) == TINY
    with pytest.raises(RecipeNotFoundError, match="quickstat") as err:
        resolve_recipe("quickstat")
    assert "Did you mean 'quickstart'" in str(err.value)
    assert "\n" not in str(err.value) and "`impulsevit recipes`" in str(err.value)  # one line, not the listing
    assert str(len(available_recipes())) in str(err.value)
    assert main(["fit", "--recipe", "no_such_recipe"]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'no_such_recipe'" in err and "`impulsevit recipes`" in err
    assert len(err.strip().splitlines()) == 1


def test_recipes_subcommand_lists_every_recipe_with_its_description(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    for path in RECIPES:
        assert path.stem in out
        assert describe(path), f"{path.name} has no '# description' first line"
        assert describe(path) in out


def test_unknown_subcommand_and_missing_external_module(capsys):
    assert main(["fitt"]) == 2
    assert "did you mean 'fit'" in capsys.readouterr().err
    assert main([]) == 2 and "usage: impulsevit" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("recipe", "override", "wrong", "right"),
    [
        ("tiny", "--model.optimzer.lr=0.1", "model.optimzer.lr", "model.optimizer.lr"),
        ("tiny", "--trainer.max_epoch=3", "trainer.max_epoch", "trainer.max_epochs"),
        ("tiny", "--model.init.metod=impulse", "model.init.metod", "model.init.method"),
        ("tiny", "--data.init_args.num_clases=3", "data.init_args.num_clases", "data.init_args.num_classes"),
        ("tiny", "--checkpoint.monitr=x", "checkpoint.monitr", "checkpoint.monitor"),
        ("quickstart", "--data.init_args.augment.re_prb=0.1", "data.init_args.augment.re_prb",
         "data.init_args.augment.re_prob"),
        # keys that moved into the ImageDataModule blocks name their new place
        ("quickstart", "--data.init_args.re_prob=0.1", "data.init_args.re_prob", "data.init_args.augment.re_prob"),
        ("quickstart", "--data.init_args.train_beton=x", "data.init_args.train_beton",
         "data.init_args.storage.train_beton"),
    ],
)
def test_misspelled_key_names_the_key_and_the_closest_valid_one(tmp_path, capsys, recipe, override, wrong, right):
    argv = tiny(tmp_path, "bad", override) if recipe == "tiny" else \
        ["fit", "--recipe", recipe, f"--runs_dir={tmp_path}", "--name=bad", override]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(*argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown key '{wrong}'; did you mean '{right}'?" in err
    assert not (tmp_path / "bad").exists()


def test_misspelled_key_inside_a_recipe_file(tmp_path, capsys):
    recipe = yaml.safe_load(TINY.read_text())
    recipe["model"]["scheduler"] = {"warmup_epoch": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit):
        run_cli("fit", "--recipe", str(bad), f"--runs_dir={tmp_path}")
    assert "unknown key 'model.scheduler.warmup_epoch'; did you mean 'model.scheduler.warmup_epochs'?" in \
        capsys.readouterr().err


def test_print_config_shows_the_resolved_recipe(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--recipe", "tiny_synthetic", "fit", "--trainer.max_epochs=5", "--print_config"])
    assert exit_info.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["name"] == "tiny_synthetic" and cfg["runs_dir"] == "runs" and cfg["resume"] is None
    assert cfg["trainer"]["max_epochs"] == 5
    assert cfg["model"]["init"] == {"method": "impulse", "seed": 0, "options": {}}
    assert cfg["checkpoint"]["monitor"] == "val/acc1" and cfg["checkpoint"]["save_last"] is True
    assert cfg["data"]["class_path"] == "impulsevit.data.SyntheticDataModule"


# ------------------------------------------------------------------------------------------- bad input, fail early
def test_image_size_not_divisible_by_patch_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"image size 30 .* not divisible by the patch size 4") as err:
        run_cli(*tiny(tmp_path, "odd", "--data.init_args.image_size=30"))
    assert "vit_tiny_patch16_224" in str(err.value)
    assert not list(tmp_path.glob("odd/checkpoints/*.ckpt"))
    assert scalars(tmp_path / "odd", "train/loss") == []


def test_a_mixer_is_built_for_the_data_s_image_size(tmp_path):
    """``mixer_any`` (built for 28 px unless told) on 32 px data trains: the data's ``image_size`` reaches timm as
    ``img_size``, as for a ViT. A Mixer built for another size than the data's (a plain ``ImageClassifier`` without
    ``img_size``) is one line naming both sizes and the key, before training, not timm's assert in the first step."""
    import timm

    from impulsevit.training.backbone import check_image_size

    kwargs = json.dumps({"patch_size": 8, "embed_dim": 32, "num_blocks": 2})  # 4x4 tokens <= token hidden 16
    cli = run_cli(*tiny(tmp_path, "mixer", "--model.backbone=mixer_any", f"--model.backbone_kwargs={kwargs}",
                        "--model.mixup=null", "--trainer.max_steps=1"))
    assert cli.trainer.global_step == 1
    assert tuple(cli.model.backbone.stem.img_size) == (32, 32)
    with pytest.raises(ValueError, match=r"^backbone 'mixer_any' was built for img_size 28 but the data has "
                                         r"image_size 32; set model.img_size: 32$"):
        check_image_size(timm.create_model("mixer_any", **json.loads(kwargs)), "mixer_any", 32)


def test_init_method_that_does_not_fit_the_backbone_fails_before_training(tmp_path):
    # 16 px patches on 32 px images leave 2x2 = 4 patch tokens, fewer than the head dim 32 impulse needs
    kwargs = json.dumps({"img_size": 32, "patch_size": 16, "embed_dim": 64, "depth": 2, "num_heads": 2})
    with pytest.raises(ValueError, match=r"init method 'impulse' does not fit backbone 'vit_tiny_patch16_224'"):
        run_cli(*tiny(tmp_path, "misfit", f"--model.backbone_kwargs={kwargs}"))
    assert scalars(tmp_path / "misfit", "train/loss") == []


# -------------------------------------------------------------------------------------------------- run directory
def test_run_directory_layout_config_checkpoints_events(tmp_path):
    cli = run_cli(*tiny(tmp_path, "layout", "--trainer.max_epochs=1"))
    run = tmp_path / "layout"
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith("events.")) == \
        ["attention", "checkpoints", "config.yaml", "hparams.yaml", "run.json"]
    assert sorted(p.name for p in (run / "attention").iterdir()) == ["step_00000000.json", "step_00000004.json"]
    assert not list(run.glob("version_*")) and not list(run.glob("lightning_logs"))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["name"] == "layout" and cfg["trainer"]["max_epochs"] == 1
    assert cfg["data"]["init_args"]["num_classes"] == 4
    last = run / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == cli.trainer.global_step == 4  # 64 samples / batch 16
    assert set(state_dict(last)) >= {"backbone.head.weight", "backbone.pos_embed"}
    losses = scalars(run, "train/loss")
    assert [s for s, _ in losses] == [0, 1, 2, 3] and all(torch.isfinite(torch.tensor(v)) for _, v in losses)
    assert len(scalars(run, "val/acc1")) == 1
    # the module saw the linked number of classes
    assert cli.model.num_classes == 4 and ckpt["hyper_parameters"]["num_classes"] == 4

    # a second start in the same directory (requeue / resume) rewrites config.yaml instead of aborting (#17115)
    run_cli(*tiny(tmp_path, "layout", "--trainer.max_epochs=2", "--resume=auto"))
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["max_epochs"] == 2
    assert not list(run.glob("*.tmp-*")) and not list(run.glob("checkpoints/*.tmp-*"))
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 8


# -------------------------------------------------------------------------------------------- every recipe smokes
def _shrunk_backbone_kwargs(recipe: dict) -> dict:
    backbone = recipe["model"]["backbone"]
    for prefixes, kwargs in SHRINK.items():
        if backbone.startswith(prefixes):
            return {**(recipe["model"].get("backbone_kwargs") or {}), **kwargs}
    pytest.fail(f"no tiny backbone_kwargs for backbone {backbone!r}: add its family to SHRINK in {__file__}")


@pytest.mark.parametrize("recipe_path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_fast_dev_run(tmp_path, recipe_path):
    recipe = yaml.safe_load(recipe_path.read_text())
    kwargs = _shrunk_backbone_kwargs(recipe)
    data = {"class_path": "impulsevit.data.SyntheticDataModule",
            "init_args": {"num_classes": 10, "image_size": kwargs.get("img_size", 32), "num_train": 32, "num_val": 16,
                          "batch_size": 8, "num_workers": 0}}
    cli = run_cli(
        "fit", "--recipe", recipe_path.stem, f"--runs_dir={tmp_path}",
        f"--model.backbone_kwargs={json.dumps(kwargs)}", f"--data={json.dumps(data)}",
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto",
        "--trainer.precision=32-true", "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false",
    )
    assert cli.trainer.global_step == 1
    assert cli.trainer.callback_metrics["train/loss"].isfinite()
    init = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "Initializer")
    assert init.applied and init.method == (recipe["model"].get("init") or {}).get("method", "impulse")


def test_callbacks_named_in_the_config_are_not_doubled_by_the_defaults(tmp_path):
    """An sbatch script (or recipe) naming SlurmRequeue / RNGStateCheckpoint gets one of each: the configured one."""
    from impulsevit.callbacks.preemption import SlurmRequeue
    from impulsevit.callbacks.rng_state import RNGStateCheckpoint

    cli = run_cli(*tiny(tmp_path, "dedupe", "--trainer.max_epochs=1",
                        "--trainer.callbacks+=impulsevit.callbacks.preemption.SlurmRequeue",
                        "--trainer.callbacks.init_args.requeue=false"))
    requeue = [cb for cb in cli.trainer.callbacks if isinstance(cb, SlurmRequeue)]
    assert len(requeue) == 1 and requeue[0].requeue is False  # the configured instance, not the default
    assert sum(isinstance(cb, RNGStateCheckpoint) for cb in cli.trainer.callbacks) == 1
    plain = run_cli(*tiny(tmp_path, "plain", "--trainer.max_epochs=1"))
    assert sum(isinstance(cb, SlurmRequeue) for cb in plain.trainer.callbacks) == 1  # the default is still there


# ------------------------------------------------------------------------------ `null` on the command line is None
def _optional_keys(cls: type, prefix: str) -> tuple[list[str], list[str]]:
    """``(leaves, blocks)``: the dotted keys typed ``X | None`` that ``cls`` accepts, its dataclass blocks' fields
    included (``data.init_args.augment.auto_augment``); ``blocks`` are the optional dataclass-typed ones themselves."""
    import dataclasses
    import typing

    from impulsevit.cli.parser import _class_keys, _unwrap_optional

    leaves, blocks = [], []
    hints = typing.get_type_hints(cls if dataclasses.is_dataclass(cls) else cls.__init__)
    for name in _class_keys(cls):
        hint = hints.get(name)
        inner = _unwrap_optional(hint)
        optional = inner is not hint
        if dataclasses.is_dataclass(inner):
            sub_leaves, sub_blocks = _optional_keys(inner, f"{prefix}{name}.")
            leaves, blocks = leaves + sub_leaves, blocks + sub_blocks + ([prefix + name] if optional else [])
        elif optional:
            leaves.append(prefix + name)
    return leaves, blocks


def _recipe_per_data_class() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in RECIPES:
        found.setdefault(yaml.safe_load(path.read_text())["data"]["class_path"], path.stem)
    return found


def _at(cfg: dict, key: str) -> object:
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


@pytest.mark.parametrize("class_path", sorted(_recipe_per_data_class()))
def test_null_on_the_command_line_is_none_for_every_optional_key(capsys, class_path):
    """Every ``X | None`` key of the recipes' data classes (their ``augment`` / ``storage`` blocks included) and of the
    model, given as ``--key=null`` or ``--key null``, parses to None (jsonargparse passed a nested one on as the text
    ``'None'``, or failed on ``float | None``)."""
    from impulsevit.cli.fit_datamodule import build_datamodule
    from impulsevit.training.module import ImageClassifier

    recipe = _recipe_per_data_class()[class_path]
    data_cls = __import__("importlib").import_module(class_path.rpartition(".")[0])
    data_leaves, data_blocks = _optional_keys(getattr(data_cls, class_path.rpartition(".")[2]), "data.init_args.")
    model_leaves, model_blocks = _optional_keys(ImageClassifier, "model.")
    model_leaves.remove("model.num_classes")  # linked from data.num_classes, not a command-line key
    model_leaves.remove("model.img_size")  # linked from data.image_size, not a command-line key
    assert model_leaves and model_blocks
    if class_path == "impulsevit.data.ImageDataModule":
        assert {"data.init_args.augment.auto_augment", "data.init_args.mean", "data.init_args.root",
                "data.init_args.storage.train_beton"} <= set(data_leaves)
    for keys in (data_leaves + model_leaves, data_blocks + model_blocks):
        args = [tok for i, k in enumerate(keys) for tok in ([f"--{k}=null"] if i % 2 else [f"--{k}", "null"])]
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--recipe", recipe, *args, "--print_config"])
        assert exit_info.value.code == 0, capsys.readouterr().err
        cfg = yaml.safe_load(capsys.readouterr().out)
        assert {k: _at(cfg, k) for k in keys} == dict.fromkeys(keys), [k for k in keys if _at(cfg, k) is not None]
    if class_path == "impulsevit.data.ImageDataModule":  # and the datamodule gets it: RandAugment off on ffcv too
        dm = build_datamodule(["--recipe", "deit_tiny_in1k", "--data.init_args.dataset=digits",
                               "--data.init_args.root=null", "--data.init_args.augment.auto_augment=null",
                               "--data.init_args.augment.color_jitter", "null"])
        assert dm.augment.auto_augment is None and dm.augment.color_jitter is None and dm.augment.re_prob == 0.25
