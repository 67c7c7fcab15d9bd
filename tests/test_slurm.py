"""Preemption and requeue: the SlurmRequeue callback in-process (real signals), then against a real SLURM on loopback.

In-process tests send real SIGUSR1/SIGTERM to this process mid-step and check where the checkpoint lands (the step
boundary after the signal), that training continues / stops as documented, and that the handlers are restored.
The cluster tests (``slurm`` marker) submit real jobs to a single-node SLURM (tests/slurm_cluster.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from impulsevit.callbacks.preemption import Preempted, SlurmRequeue
from impulsevit.cluster.events import read_events
from impulsevit.data.synthetic import SyntheticDataModule
from impulsevit.module import ImageClassifier

TINY = {"img_size": 16, "patch_size": 8, "depth": 1, "embed_dim": 32, "num_heads": 2}


class SignalAt(L.Callback):
    """Sends ``sig`` to this process at the start of training batch ``step`` (a real signal, delivered mid-step)."""

    def __init__(self, step: int, sig: int) -> None:
        self.step, self.sig, self.sent = step, sig, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.sig)


def _fit(root: Path, *callbacks, max_steps: int = 8, ckpt_path: str | None = None) -> L.Trainer:
    L.seed_everything(0, workers=True)
    model = ImageClassifier("vit_tiny_patch16_224", TINY, num_classes=4, log_attention=False,
                            init={"method": "torch", "seed": 0})
    data = SyntheticDataModule(num_classes=4, image_size=16, num_train=64, num_val=16, batch_size=8)
    trainer = L.Trainer(default_root_dir=root, max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=1, callbacks=[SlurmRequeue(), *callbacks])
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return trainer


@pytest.fixture
def no_slurm_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    monkeypatch.delenv("IMPULSEVIT_EVENTS_LOG", raising=False)
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    yield
    after = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    assert after == before, "signal handlers were not restored after fit"


def _ckpt_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def test_usr1_outside_slurm_checkpoints_at_step_boundary_and_continues(tmp_path, no_slurm_env, capsys):
    trainer = _fit(tmp_path, SignalAt(3, signal.SIGUSR1))
    assert trainer.global_step == 8  # not stopped: nothing to requeue outside SLURM
    ckpt = tmp_path / "checkpoints" / "preempted.ckpt"
    assert _ckpt_step(ckpt) == 4  # the signal arrived before step 3's forward; saved after that step
    err = capsys.readouterr().err
    assert "received SIGUSR1" in err and f"checkpoint saved to {ckpt} at global step 4" in err
    assert not list(ckpt.parent.glob("*.tmp-*"))


def test_no_scontrol_warns_at_start_and_still_checkpoints(tmp_path, no_slurm_env, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    trainer = _fit(tmp_path, SignalAt(2, signal.SIGUSR1))
    err = capsys.readouterr().err
    warn = err.index("`scontrol` is not on PATH")
    assert warn < err.index("received SIGUSR1"), "the warning must come at start, before any signal"
    assert "cannot requeue SLURM job 77" in err
    assert trainer.global_step == 8 and _ckpt_step(tmp_path / "checkpoints" / "preempted.ckpt") == 3
    events = [(e["event"], e.get("rc") or e.get("step") or e.get("reason")) for e in read_events(tmp_path)]
    assert events == [("warning", "no-scontrol"), ("signal", "3"), ("checkpoint", "3"), ("requeue", "no-scontrol")]


def test_sigterm_checkpoints_then_stops_and_resume_continues(tmp_path, no_slurm_env, capsys):
    with pytest.raises(SystemExit):
        _fit(tmp_path, SignalAt(5, signal.SIGTERM))
    ckpt = tmp_path / "checkpoints" / "preempted.ckpt"
    assert _ckpt_step(ckpt) == 6
    capsys.readouterr()
    trainer = _fit(tmp_path, ckpt_path=str(ckpt))
    assert trainer.global_step == 8
    assert f"resumed from {ckpt} at global step 6" in capsys.readouterr().err


def test_usr1_without_requeue_stops_cleanly(tmp_path, no_slurm_env):
    L.seed_everything(0)
    model = ImageClassifier("vit_tiny_patch16_224", TINY, num_classes=4, log_attention=False, init={"method": "torch"})
    data = SyntheticDataModule(num_classes=4, image_size=16, num_train=64, num_val=16, batch_size=8)
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=8, accelerator="cpu", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[SlurmRequeue(requeue=False), SignalAt(1, signal.SIGUSR1)])
    with pytest.raises(Preempted) as e:
        trainer.fit(model, data)
    assert e.value.code == 0 and trainer.global_step == 2
    assert _ckpt_step(tmp_path / "checkpoints" / "preempted.ckpt") == 2
