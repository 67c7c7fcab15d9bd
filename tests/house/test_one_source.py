"""One source per value (issue 26): the data's ``image_size`` is the model's input size (linked, never declared twice),
``model.init.method`` is checked once before any class is built, and the training loader's position is restored by
Lightning's fit loop from the checkpoint (``loops.fit_loop.state_dict.combined_loader``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from _cli_helpers import tiny

from impulsevit.cli import main

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("impulsevit fit: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------------------------------- init.method
def test_unknown_init_method_is_the_error_even_when_the_data_root_does_not_exist(tmp_path: Path, capsys) -> None:
    """The datamodule's constructor refuses a missing root; the method is checked before it, in one line."""
    data = {"class_path": "impulsevit.data.ImageDataModule",
            "init_args": {"dataset": "imagefolder", "root": str(tmp_path / "no_such_root"), "image_size": 32,
                          "batch_size": 4, "cache_dir": str(tmp_path / "cache")}}
    assert main(tiny(tmp_path / "runs", "bad", "--model.init.method=impluse", f"--data={json.dumps(data)}")) == 2
    line = _error_line(capsys)
    known = line.partition("available: ")[2].partition(";")[0].split(", ")
    assert "model.init.method" in line and "'impluse'" in line and {"impulse", "mimetic", "torch"} <= set(known), line
    assert "no_such_root" not in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_init_method_is_resolved_once(tmp_path: Path, monkeypatch) -> None:
    """``impulsevit fit`` resolves ``model.init.method`` exactly twice in one process: the CLI's check before any class
    is built and ``ImageClassifier``'s (the Python API's) — never again in preflight, the meta-device dry run, the
    Initializer callback or the init dispatch."""
    import impulsevit.init as ii
    import impulsevit.init.plugins as plugins

    calls: list[str] = []
    real = plugins.resolve_method

    def counting(method, options=None):  # noqa: ANN001, ANN202
        calls.append(method)
        return real(method, options)

    monkeypatch.setattr(plugins, "resolve_method", counting)
    monkeypatch.setattr(ii, "resolve_method", counting)
    assert main(tiny(tmp_path, "once", "--trainer.max_steps=1", "--trainer.limit_val_batches=0")) == 0
    assert calls == ["impulse", "impulse"]


# ------------------------------------------------------------------------------------------------------ image_size
def test_a_recipe_without_img_size_trains_at_the_data_size(tmp_path: Path) -> None:
    """tiny_synthetic's backbone_kwargs carry no img_size: the ViT is built for the data's image_size (24 here, not
    timm's 224 default), which is stored once in the checkpoint's hyperparameters."""
    import torch
    from _cli_helpers import run_cli

    cli = run_cli(*tiny(tmp_path, "linked", "--data.init_args.image_size=24", "--trainer.max_steps=2",
                        "--trainer.limit_val_batches=0"))
    assert cli.trainer.global_step == 2
    assert tuple(cli.model.backbone.patch_embed.img_size) == (24, 24) and cli.model.hparams.img_size == 24
    ckpt = torch.load(tmp_path / "linked" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["hyper_parameters"]["img_size"] == 24 and "img_size" not in ckpt["hyper_parameters"]["backbone_kwargs"]
    assert ckpt["state_dict"]["backbone.pos_embed"].shape[1] == 1 + (24 // 4) ** 2


def test_a_conflicting_backbone_img_size_is_one_line_naming_both_keys(tmp_path: Path, capsys) -> None:
    assert main(tiny(tmp_path, "conflict", "--model.backbone_kwargs.img_size=64")) == 2
    line = _error_line(capsys)
    assert "model.backbone_kwargs.img_size: 64" in line and "data.image_size: 32" in line, line
    assert not (tmp_path / "conflict").exists()
    # the same value is accepted (recipes written before the link)
    assert main(tiny(tmp_path, "same", "--model.backbone_kwargs.img_size=32", "--trainer.max_steps=1",
                     "--trainer.limit_val_batches=0")) == 0


def test_resuming_at_another_image_size_names_the_data_key(tmp_path: Path, capsys) -> None:
    """The size a user changes is ``data.image_size``; the resume error names that key, not timm's kwarg."""
    assert main(tiny(tmp_path, "run", "--trainer.max_steps=1", "--trainer.limit_val_batches=0")) == 0
    capsys.readouterr()
    assert main(tiny(tmp_path, "run", "--data.init_args.image_size=16", "--trainer.max_steps=2",
                     "--trainer.limit_val_batches=0", "--resume=auto")) == 2
    line = _error_line(capsys)
    assert "data.image_size (model.img_size): 32 in the checkpoint, 16 now" in line, line
    assert "backbone_kwargs" not in line, line


def test_a_checkpoint_from_before_the_link_resumes_and_loads(tmp_path: Path) -> None:
    """Checkpoints written before the link have the size in backbone_kwargs and no img_size: they pass the resume
    check (same function) and load with ``load_from_checkpoint``."""
    import torch
    from _cli_helpers import run_cli

    from impulsevit.training.module import ImageClassifier

    run_cli(*tiny(tmp_path, "old", "--trainer.max_steps=2", "--trainer.limit_val_batches=0"))
    path = tmp_path / "old" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    hp = ckpt["hyper_parameters"]
    hp["backbone_kwargs"] = {"img_size": hp.pop("img_size"), **hp["backbone_kwargs"]}  # the old layout
    torch.save(ckpt, path)
    assert ImageClassifier.load_from_checkpoint(path).backbone.patch_embed.img_size == (32, 32)
    resumed = run_cli(*tiny(tmp_path, "old", "--trainer.max_steps=3", "--trainer.limit_val_batches=0",
                            "--resume=auto"))
    assert resumed.trainer.global_step == 3


def test_a_plain_trainer_model_built_for_another_size_is_refused_at_setup(tmp_path: Path) -> None:
    """Without the CLI's link (``img_size`` not given), the backbone's built size is checked against the data."""
    import lightning as L

    from impulsevit.data import SyntheticDataModule
    from impulsevit.training.module import ImageClassifier

    model = ImageClassifier("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 4, "embed_dim": 32, "depth": 1,
                                                     "num_heads": 2}, num_classes=4, log_attention=False)
    data = SyntheticDataModule(num_classes=4, image_size=24, num_train=16, num_val=8, batch_size=8)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, accelerator="cpu",
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match=r"built for img_size 32 but the data has image_size 24; set model.img_size"):
        trainer.fit(model, data)


# ---------------------------------------------------------------------------------------------------- loader state
def test_the_datamodule_restores_the_training_loader_position_not_lightning(tmp_path: Path) -> None:
    """A mid-epoch checkpoint holds the training loader's position twice: the datamodule's ``state_dict``
    (``<DataModule>.train_loader``) and Lightning's fit loop, which saves every stateful training loader
    (``loops.fit_loop.state_dict.combined_loader``). The datamodule's copy is the one that restores: without
    Lightning's copy the resume is bit-exact, and with the datamodule's copy moved to the start of the epoch it is not.
    Lightning 2.6 restores its copy only when the train loader is built after the loops' state is loaded; ours is built
    earlier, by ``trainer.estimated_stepping_batches`` in ``configure_optimizers`` (the lr plan), so Lightning's copy is
    never applied (Lightning-AI/pytorch-lightning#20550). When this test fails on the second assertion, Lightning
    restores stateful loaders itself: then delete the datamodule's copy (``BaseImageDataModule.state_dict``)."""
    import torch
    from _cli_helpers import run_cli

    every2 = ["--checkpoint.every_n_train_steps=2", "--checkpoint.save_top_k=-1", "--checkpoint.monitor=null",
              "--checkpoint.filename=step{step}", "--checkpoint.auto_insert_metric_name=false"]
    run_cli(*tiny(tmp_path, "ref", *every2))
    ref = torch.load(tmp_path / "ref" / "checkpoints" / "step8.ckpt", map_location="cpu", weights_only=True)
    mid = torch.load(tmp_path / "ref" / "checkpoints" / "step6.ckpt", map_location="cpu", weights_only=False)
    saved = mid["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert saved == [mid["SyntheticDataModule"]["train_loader"]] and saved[0]["batches"] == 2

    def resume(name: str, edit) -> dict:  # noqa: ANN001
        ckpt = copy.deepcopy(mid)
        edit(ckpt)
        path = tmp_path / f"{name}.ckpt"
        torch.save(ckpt, path)
        assert run_cli(*tiny(tmp_path, name, f"--resume={path}")).trainer.global_step == 8
        return torch.load(tmp_path / name / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)

    def differing(a: dict, b: dict) -> list[str]:
        return [k for k in a["state_dict"] if not torch.equal(a["state_dict"][k], b["state_dict"][k])]

    datamodule_only = resume("datamodule", lambda c: c["loops"]["fit_loop"]["state_dict"].pop("combined_loader"))
    assert differing(datamodule_only, ref) == []
    lightning_only = resume("lightning", lambda c: c["SyntheticDataModule"]["train_loader"].update(batches=0))
    assert differing(lightning_only, ref) != []
