"""What a run prints: the model summary's FLOPs line is the backbone's forward FLOPs for one image (not Lightning's
"0 Total Flops"), and a fit resumed mid-epoch shows the epoch and its total in the progress bar (not "Training:
2/?"). Through the real CLI on the tiny recipe."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import timm
import torch
from _cli_helpers import TINY, run_cli
from lightning.fabric.utilities.throughput import measure_flops

from impulsevit.callbacks.console import FlopsModelSummary, ResumeProgressBar

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


class BarProbe(L.Callback):
    """Records the progress bar's total and description at the first training batch of a fit."""

    seen: list[tuple[object, str]] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if not BarProbe.seen:
            bar = trainer.progress_bar_callback.train_progress_bar
            BarProbe.seen.append((bar.total, bar.desc))


STOP = '--trainer.callbacks=[{"class_path": "_cli_helpers.StopAfterStep", "init_args": {"step": 2}}]'


def _fit(tmp_path, *extra: str):
    return run_cli("fit", "--recipe", str(TINY), f"--runs_dir={tmp_path}", "--name=c",
                   "--trainer.enable_progress_bar=true", "--trainer.enable_model_summary=true", *extra)


def test_summary_flops_and_resumed_progress_bar(tmp_path, caplog, monkeypatch):
    # the bar, as on a terminal (pytest's captured stdout is not one: the run would print lines, test_job_logs.py)
    monkeypatch.setattr("impulsevit.callbacks.standard.stdout_is_terminal", lambda: True)
    with caplog.at_level(logging.INFO):
        first = _fit(tmp_path, STOP)
    kinds = [type(c) for c in first.trainer.callbacks]
    assert FlopsModelSummary in kinds and ResumeProgressBar in kinds
    flops_lines = [ln for r in caplog.records for ln in r.getMessage().splitlines() if ln.endswith("Total Flops")]
    with torch.device("meta"):
        model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=64, depth=2,
                                  num_heads=2, num_classes=4, drop_path_rate=0.1)
        x = torch.empty(1, 3, 32, 32)
    expected = measure_flops(model, lambda: model(x))
    assert expected > 0 and len(flops_lines) == 1, flops_lines
    shown = flops_lines[0].split()[0:2]  # e.g. ['15.3', 'M']
    assert f"{expected / 1e6:.1f}" == shown[0] and shown[1] == "M", (flops_lines, expected)

    BarProbe.seen.clear()
    resumed = _fit(tmp_path, "--resume", "auto", "--trainer.callbacks+=test_console.BarProbe")  # step 2 of 4, epoch 0
    assert isinstance(resumed.trainer.progress_bar_callback, ResumeProgressBar)
    total, desc = BarProbe.seen[0]  # the resumed epoch's bar: Lightning's own shows "Training: 3/?"
    assert total == 4 and desc.startswith("Epoch 0"), BarProbe.seen
    assert resumed.trainer.global_step == 8
