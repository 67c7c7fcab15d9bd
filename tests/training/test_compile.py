"""``model.compile: true`` trains the quickstart recipe on CPU with torch.compile (inductor, which needs a C compiler):
the backbone is compiled in place, its compiled forward equals the eager one, and the checkpoint keeps plain timm
parameter names (no ``_orig_mod.``); the DeiT-B and ViT-Ti recipes' training step compiles without graph breaks and
without recompiles beyond the train/eval pair."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from _cli_helpers import REPO, run_cli, state_dict

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


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
    # the mode, grad setting and batch size (quickstart's 128) the graph was compiled for: eval / no_grad, or another
    # batch size (a dynamic-shape recompile, about a third of this test's time), would compile again
    x = torch.randn(128, 3, 28, 28)
    model.train()
    torch.testing.assert_close(model.backbone(x).detach(), model.backbone.forward(x).detach(), rtol=1e-4, atol=1e-4)
    sd = state_dict(tmp_path / "c" / "checkpoints" / "last.ckpt")
    assert "backbone.pos_embed" in sd and not any("_orig_mod" in k for k in sd)
    assert all(torch.isfinite(v).all() for v in sd.values() if v.is_floating_point())


class _DynamoWatch(logging.Handler):
    """Counts, from ``torch.compile``'s own bookkeeping, what happened since :meth:`start`: graph breaks
    (``torch._dynamo.utils.counters``), graphs compiled (``unique_graphs``) and the reason of every recompile (dynamo's
    ``recompiles`` log artifact, ``TORCH_LOGS=recompiles``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.recompiles: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Recompiling function"):
            self.recompiles.append(message)

    def start(self) -> None:
        import torch._dynamo

        torch._dynamo.reset()  # a fresh compile cache: what a new process (a resumed job) starts with
        torch._dynamo.utils.counters.clear()
        self.recompiles.clear()

    def counts(self) -> tuple[int, int, int]:
        """(graph breaks, graphs compiled, recompiles)."""
        from torch._dynamo.utils import counters

        return (sum(counters["graph_break"].values()), int(counters["stats"]["unique_graphs"]),
                len(self.recompiles))


@pytest.fixture
def dynamo_watch():
    watch = _DynamoWatch()
    logger = logging.getLogger("torch._dynamo")
    torch._logging.set_logs(recompiles=True, graph_breaks=True)
    logger.addHandler(watch)
    try:
        yield watch
    finally:
        logger.removeHandler(watch)
        torch._logging.set_logs()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["deit_base_in1k", "vit_tiny_cifar10"])
def test_recipe_step_compiles_without_graph_breaks_or_recompiles(tmp_path, monkeypatch, dynamo_watch, recipe):
    """The DeiT-B and ViT-Ti recipes' model path at ViT-Ti width (drop path 0.1 from the recipe, EMA on, mixup/cutmix
    and label smoothing from the recipe) under ``model.compile``: no graph break, and exactly two graphs per process —
    training, and validation (eval mode, no grad) — whose one recompile is the grad-mode switch, across an epoch
    boundary; and again exactly that after a resume in a fresh compile cache (what a new process starts with). Dynamo
    decides graph breaks and guards before any backend runs, so the cheap ``aot_eager`` backend (AOTAutograd traces
    forward and backward, as inductor's front end does) stands in for inductor here; the inductor run is the test
    above, and ``benchmarks/compile_step.py`` times inductor against eager."""
    monkeypatch.setenv("IMPULSEVIT_CACHE", str(tmp_path / "cache"))
    args = ["--recipe", str(REPO / "recipes" / f"{recipe}.yaml"), f"--runs_dir={tmp_path}", "--name=c",
            "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto",
            "--trainer.precision=32-true", "--trainer.max_epochs=2", "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false", "--model.backbone=vit_tiny_patch16_224",
            "--model.backbone_kwargs.img_size=32", "--model.backbone_kwargs.patch_size=4",
            "--model.backbone_kwargs.depth=2", "--model.ema_decay=0.99", "--model.log_attention=false",
            '--model.compile={"backend": "aot_eager"}', "--data=impulsevit.data.SyntheticDataModule",
            "--data.init_args.num_classes=10", "--data.init_args.image_size=32", "--data.init_args.num_train=32",
            "--data.init_args.num_val=16", "--data.init_args.batch_size=8"]
    stop = '--trainer.callbacks=[{"class_path": "_cli_helpers.StopAfterEpoch", "init_args": {"epoch": 0}}]'
    dynamo_watch.start()
    first = run_cli("fit", *args, stop)
    assert first.trainer.current_epoch == 1 and first.model.hparams.mixup is not None
    assert first.model.hparams.backbone_kwargs["drop_path_rate"] == 0.1 and first.model.ema is not None
    assert dynamo_watch.counts() == (0, 2, 1), dynamo_watch.recompiles  # train + eval (sanity check, validation)
    assert "grad_mode" in dynamo_watch.recompiles[0]
    dynamo_watch.start()
    resumed = run_cli("fit", *args, "--resume", "auto")
    assert resumed.trainer.current_epoch == 2 and resumed.trainer.global_step == 8
    # the rest of the run (an epoch boundary, validation twice, the EMA updates) adds no graph and no recompile
    assert dynamo_watch.counts() == (0, 2, 1), dynamo_watch.recompiles
    assert "grad_mode" in dynamo_watch.recompiles[0]
