"""A steady-state training step reads nothing back from the device: the DeiT-B recipe (ViT-Ti backbone, small images,
its FFCV data path with RandAugment / random erasing / mixup / repeated augmentation) is trained on CPU through the
real CLI while a ``TorchDispatchMode`` counts the ops that synchronise the host with a CUDA device:

- scalar reads (``.item()``, ``bool()``, ``int()``, ``torch.equal`` ...: ``aten._local_scalar_dense`` / ``is_nonzero``
  / ``equal``);
- ops whose output shape depends on the data (``nonzero``, boolean indexing, ``masked_select``, ``unique``,
  ``repeat_interleave`` without ``output_size``) and CUDA kernels that read their input on the host (``bincount``);
- host tensors lifted per call (``torch.tensor(list, device=...)`` is ``lift_fresh`` + a host → device copy);
- linalg error checks (``_linalg_check_errors``).

CPU cannot show device → host copies themselves (``.cpu()``): those are caught by the scalar-read rule only when
followed by a read. The optimizer's own step is excluded (torch's non-fused Adam reads its step count; the fused CUDA
kernel used on GPUs does not); the closure it calls (forward, backward, hooks) is counted.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import lightning as L
import pytest
import torch
from _cli_helpers import REPO, run_cli
from _sync_counter import SyncCounter, aten

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


class CountSteps(L.Callback):
    """Counts per training batch, from the fetch through every hook of the step (callbacks, logging), in a
    ``TorchDispatchMode``; the optimizer's update (not its closure) is excluded."""

    def __init__(self) -> None:
        self.per_step: list[Counter[str]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loop = trainer.fit_loop.epoch_loop
        counter = SyncCounter()
        self.counter = counter

        def counted(fn):  # noqa: ANN001, ANN202
            def run(*args: Any, **kwargs: Any) -> Any:
                with counter:
                    return fn(*args, **kwargs)
            return run

        advance, advance_end = loop.advance, loop.on_advance_end

        def step_advance(*args: Any, **kwargs: Any) -> Any:
            counter.ops = Counter()
            self.per_step.append(counter.ops)
            return counted(advance)(*args, **kwargs)

        loop.advance, loop.on_advance_end = step_advance, counted(advance_end)
        for opt in trainer.optimizers:
            update = opt.step

            def step(closure=None, _update=update, **kw):  # noqa: ANN001, ANN202
                def in_closure() -> Any:
                    counter.paused = False
                    try:
                        return closure()
                    finally:
                        counter.paused = True
                counter.paused = True
                try:
                    return _update(closure=in_closure if closure is not None else None, **kw)
                finally:
                    counter.paused = False

            opt.step = step


class CountResampleSyncs(L.Callback):
    """Counts, per call, the syncing ops of the datamodule's ``train_pixels`` (the device resample of
    ``data.resample_on=device``) on its own: the step-level rule allows one sync, this part must have none."""

    def __init__(self) -> None:
        self.per_call: list[Counter[str]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm = trainer.datamodule
        resample = dm.train_pixels

        def counted(images: torch.Tensor) -> torch.Tensor:
            counter = SyncCounter()
            with counter:
                out = resample(images)
            self.per_call.append(counter.ops)
            return out

        dm.train_pixels = counted


DEIT_B_ON_CPU = [
    "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto",
    "--trainer.precision=32-true", "--trainer.max_steps=8", "--trainer.log_every_n_steps=5",
    "--trainer.limit_val_batches=0",
    "--trainer.enable_progress_bar=true", "--trainer.enable_model_summary=false",
    "--model.backbone=vit_tiny_patch16_224",
    "--model.backbone_kwargs={img_size: 32, patch_size: 8, drop_path_rate: 0.1, weight_init: skip}",
    "--model.log_attention=false",
    "--data.init_args.dataset=digits", "--data.init_args.root=null", "--data.init_args.image_size=32",
    "--data.init_args.batch_size=16", "--data.init_args.num_workers=1",
]


@pytest.mark.ffcv
@pytest.mark.slow  # ~25 s alone (FFCV conversion of digits, 8 ViT-Ti steps), ~60 s on a loaded machine
@pytest.mark.parametrize("resample_on", ["workers", "device"])  # device: the crop resample runs in the counted step
def test_deit_b_recipe_steady_state_step_has_at_most_one_host_sync(tmp_path, monkeypatch, caplog, resample_on):
    monkeypatch.setenv("IMPULSEVIT_CACHE", str(tmp_path / "cache"))
    # the augmentation strategy an accelerator gets (on the CPU each op runs on the images that drew it, indexed on
    # the host: a synchronisation on CUDA, free on the CPU); its pixels equal the CPU strategy's
    # (data/augment/test_augment.py)
    from impulsevit.data.augment import strategy
    from impulsevit.data.loading import datamodule

    for module in (strategy, datamodule):
        monkeypatch.setattr(module, "selects_on_host", lambda device: False)
    caplog.set_level(logging.INFO)
    cli = run_cli("fit", "--recipe", str(REPO / "recipes" / "deit_base_in1k.yaml"), f"--runs_dir={tmp_path}",
                  "--name=deit_b", *DEIT_B_ON_CPU, f"--data.init_args.resample_on={resample_on}",
                  # the guard as a GPU run configures it ("auto" picks next_step on CUDA), and the counter
                  "--trainer.callbacks+=impulsevit.callbacks.NonFiniteLossGuard",
                  "--trainer.callbacks.check=next_step",
                  "--trainer.callbacks+=test_sync_free.CountSteps",
                  "--trainer.callbacks+=test_sync_free.CountResampleSyncs")
    assert "augmentation on cpu: every op on the whole batch, kept per image (sync-free)" in caplog.text
    counter = next(c for c in cli.trainer.callbacks if type(c).__name__ == "CountSteps")
    assert len(counter.per_step) == 8
    resample = next(c for c in cli.trainer.callbacks if type(c).__name__ == "CountResampleSyncs").per_call
    assert len(resample) == 8 and all(sum(c.values()) == 0 for c in resample), resample
    # after the first steps' one-off setup (device constants, FFCV buffers, Lightning's result slots); step 5 logs
    steady = [counter.per_step[i] for i in (2, 3, 5, 6, 7)]
    assert all(sum(c.values()) <= 1 for c in steady), steady
    log_step = counter.per_step[4]
    assert log_step[str(aten._local_scalar_dense.default)] > 0, log_step  # the counter sees the log step's reads


class SyncDebugSteadySteps(L.Callback):
    """Turns on ``torch.cuda.set_sync_debug_mode("error")`` for the steady-state batches (not the first two, not log
    steps): any host synchronisation PyTorch performs there raises."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loop = trainer.fit_loop.epoch_loop
        advance, self.checked = loop.advance, 0

        def checked_advance(*args: Any, **kwargs: Any) -> Any:
            steady = loop.batch_progress.total.ready >= 2 and not trainer._logger_connector.should_update_logs
            torch.cuda.set_sync_debug_mode("error" if steady else "default")
            try:
                return advance(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                self.checked += steady

        loop.advance = checked_advance


@pytest.mark.gpu
@pytest.mark.ffcv
@pytest.mark.parametrize("resample_on", ["workers", "device"])
def test_deit_b_recipe_steady_state_step_does_not_synchronize_on_cuda(tmp_path, monkeypatch, resample_on):
    monkeypatch.setenv("IMPULSEVIT_CACHE", str(tmp_path / "cache"))
    args = [a for a in DEIT_B_ON_CPU if not a.startswith(("--trainer.accelerator", "--trainer.precision"))]
    cli = run_cli("fit", "--recipe", str(REPO / "recipes" / "deit_base_in1k.yaml"), f"--runs_dir={tmp_path}",
                  "--name=deit_b_cuda", *args, "--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed",
                  f"--data.init_args.resample_on={resample_on}",
                  "--trainer.callbacks+=test_sync_free.SyncDebugSteadySteps")
    check = next(c for c in cli.trainer.callbacks if type(c).__name__ == "SyncDebugSteadySteps")
    assert check.checked >= 4
