"""``impulsevit export``: checkpoints (single file and FSDP2 folder) → plain timm state dicts that timm loads."""

from __future__ import annotations

import pytest
import timm
import torch
from _cli_helpers import run_cli, tiny

from impulsevit.cli import main
from impulsevit.module import ImageClassifier

KWARGS = {"img_size": 32, "patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 2}  # tiny_synthetic's backbone


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch of the tiny recipe (which has an EMA with decay 0.9): the run directory."""
    runs = tmp_path_factory.mktemp("runs")
    run_cli(*tiny(runs, "exp", "--trainer.max_epochs=1"))
    return runs / "exp"


def _timm_model(path, num_classes=4):
    return timm.create_model("vit_tiny_patch16_224", checkpoint_path=str(path), num_classes=num_classes,
                             **KWARGS).eval()


def test_export_writes_a_state_dict_timm_loads_with_the_same_outputs(trained, tmp_path, capsys):
    ckpt = trained / "checkpoints" / "last.ckpt"
    out = tmp_path / "vit.pth"
    assert main(["export", str(ckpt), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "timm.create_model('vit_tiny_patch16_224', num_classes=4" in printed and "patch_size=4" in printed
    plain = torch.load(out, map_location="cpu", weights_only=True)
    assert "pos_embed" in plain and not any(k.startswith(("backbone.", "ema.")) for k in plain)

    model = _timm_model(out)
    module = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu").eval()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(x), module(x))
    # a timm model of a different shape refuses the file (strict load): the export is not silently partial
    with pytest.raises(RuntimeError):
        _timm_model(out, num_classes=7)


def test_export_ema_weights(trained, tmp_path):
    ckpt = trained / "checkpoints" / "last.ckpt"
    raw, ema = tmp_path / "raw.pth", tmp_path / "ema.pth"
    assert main(["export", str(ckpt), str(raw)]) == 0
    assert main(["export", str(ckpt), str(ema), "--ema"]) == 0
    sd = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    exported = torch.load(ema, map_location="cpu", weights_only=True)
    assert all(torch.equal(exported[k], sd[f"ema.module.{k}"]) for k in exported)
    assert any(not torch.equal(exported[k], sd[f"backbone.{k}"]) for k in exported)  # EMA lags the raw weights
    _timm_model(ema)


def test_export_errors_name_the_problem(trained, tmp_path, capsys):
    no_ema = tmp_path / "run"
    run_cli(*tiny(tmp_path, "run", "--model.ema_decay=null", "--trainer.max_epochs=1"))
    assert main(["export", str(no_ema / "checkpoints" / "last.ckpt"), str(tmp_path / "x.pth"), "--ema"]) == 2
    assert "no EMA weights" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.ckpt"), str(tmp_path / "x.pth")]) == 2
    assert "does not exist" in capsys.readouterr().err
    torch.save({"weights": torch.ones(2)}, tmp_path / "plain.pt")
    assert main(["export", str(tmp_path / "plain.pt"), str(tmp_path / "x.pth")]) == 2
    assert "not a Lightning checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "x.pth").exists()


def test_export_from_an_fsdp2_distributed_checkpoint_folder(tmp_path):
    cli = run_cli(*tiny(tmp_path, "fsdp", "--trainer.strategy=fsdp2", "--model.ema_decay=null",
                        "--trainer.max_epochs=1"))
    folder = tmp_path / "fsdp" / "checkpoints" / "last.ckpt"
    assert folder.is_dir() and (folder / "meta.pt").is_file()
    out = tmp_path / "fsdp.pth"
    assert main(["export", str(folder), str(out)]) == 0
    model = _timm_model(out)
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in cli.model.backbone.state_dict().items()}
    exported = torch.load(out, map_location="cpu", weights_only=True)
    assert exported.keys() == full.keys()
    assert all(torch.equal(exported[k], full[k].cpu()) for k in full)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert model(x).shape == (2, 4)
