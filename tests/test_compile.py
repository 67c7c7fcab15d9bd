"""``model.compile: true`` trains the quickstart recipe on CPU with torch.compile (inductor, which needs a C compiler):
the backbone is compiled in place, its compiled forward equals the eager one, and the checkpoint keeps plain timm
parameter names (no ``_orig_mod.``)."""

from __future__ import annotations

import shutil

import pytest
import torch
from _cli_helpers import REPO, run_cli, state_dict


@pytest.mark.slow  # inductor compiles forward + backward: minutes on 2 shared cores (13 min at load 10)
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler")
def test_compiled_backbone_trains_the_quickstart_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("IMPULSEVIT_CACHE", str(tmp_path / "cache"))
    cli = run_cli("fit", "--recipe", str(REPO / "recipes" / "quickstart.yaml"), f"--runs_dir={tmp_path}", "--name=c",
                  "--model.compile=true", "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
                  "--trainer.num_sanity_val_steps=0", "--model.backbone_kwargs.depth=1",
                  "--trainer.enable_progress_bar=false", "--model.log_attention=false",
                  "--data.init_args.train_subset=384", "--data.init_args.val_subset=128")
    model = cli.model
    assert cli.trainer.global_step == 2
    assert getattr(model.backbone, "_compiled_call_impl", None) is not None  # nn.Module.compile: compiled in place
    x = torch.randn(4, 3, 28, 28)
    model.train()  # the mode and grad setting the graph was compiled for (eval / no_grad would compile again)
    torch.testing.assert_close(model.backbone(x).detach(), model.backbone.forward(x).detach(), rtol=1e-4, atol=1e-4)
    sd = state_dict(tmp_path / "c" / "checkpoints" / "last.ckpt")
    assert "backbone.pos_embed" in sd and not any("_orig_mod" in k for k in sd)
    assert all(torch.isfinite(v).all() for v in sd.values() if v.is_floating_point())
