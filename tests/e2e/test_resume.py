"""Resuming: bit-exact after an epoch boundary and mid-epoch, and safe after SIGKILL during a checkpoint write.

Data order on resume (documented behaviour, checked here where it is observable):

- At an epoch boundary the resumed run is bit-exact: the datamodule's order is a function of (seed, epoch) and the
  global RNG streams (mixup, drop path) are per rank and per batch, and their states come back from the checkpoint
  (``RNGStateCheckpoint``).
- Mid-epoch, after ``k`` of an epoch's ``N`` steps: Lightning restores the step / scheduler / optimizer counters, so
  the run performs exactly the remaining ``N - k`` optimizer steps with the lr schedule where it stopped (no step is
  repeated or skipped), and the stateful training loader continues the interrupted epoch after the batches it had
  consumed, so the weights are bit-exact too (the real datamodule on both backends: ``tests/e2e/test_exact_resume.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from _cli_helpers import LR_TAG, TINY, run_cli, scalars, state_dict, subprocess_env, tiny

from impulsevit.errors import ConfigError
from impulsevit.training.checkpointing import (
    AtomicCheckpointIO,
    checkpoint_candidates,
    is_complete_checkpoint,
    latest_checkpoint,
)

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

STOP_AFTER_EPOCH_0 = '--trainer.callbacks=[{"class_path": "_cli_helpers.StopAfterEpoch", "init_args": {"epoch": 0}}]'


def _initializer(cli):
    return next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "Initializer")


def test_resume_at_epoch_boundary_is_bit_exact_and_does_not_reinitialize(tmp_path):
    # the tiny recipe has mixup/cutmix, drop path and an EMA: every stochastic part must continue exactly
    straight = run_cli(*tiny(tmp_path, "straight"))
    assert _initializer(straight).applied and _initializer(straight).skipped_reason is None

    first = run_cli(*tiny(tmp_path, "split", STOP_AFTER_EPOCH_0))
    assert first.trainer.global_step == 4 and first.trainer.current_epoch == 1
    stopped_at = state_dict(tmp_path / "split" / "checkpoints" / "last.ckpt")

    resumed = run_cli(*tiny(tmp_path, "split", "--resume=auto"))
    assert resumed.trainer.ckpt_path == str(tmp_path / "split" / "checkpoints" / "last.ckpt")
    init = _initializer(resumed)
    assert init.skipped_reason is not None and init.skipped_reason.startswith("resumed from")
    assert resumed.trainer.global_step == 8

    a = state_dict(tmp_path / "straight" / "checkpoints" / "last.ckpt")
    b = state_dict(tmp_path / "split" / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and any(k.startswith("ema.") for k in a)
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert different == []
    assert any(not torch.equal(stopped_at[k], b[k]) for k in b)  # the second epoch did train
    # the lr schedule continued where it stopped: same per-step lr as the uninterrupted run
    assert scalars(tmp_path / "split", LR_TAG) == scalars(tmp_path / "straight", LR_TAG)


def test_mid_epoch_resume_neither_repeats_nor_skips_steps_and_is_bit_exact(tmp_path):
    every2 = ["--checkpoint.every_n_train_steps=2", "--checkpoint.save_top_k=-1", "--checkpoint.monitor=null",
              "--checkpoint.filename=step{step}", "--checkpoint.auto_insert_metric_name=false"]
    run_cli(*tiny(tmp_path, "ref", *every2))
    ckpts = sorted(p.name for p in (tmp_path / "ref" / "checkpoints").glob("step*.ckpt"))
    assert ckpts == ["step2.ckpt", "step4.ckpt", "step6.ckpt", "step8.ckpt"]
    mid = tmp_path / "ref" / "checkpoints" / "step6.ckpt"  # epoch 1 (steps 4..7), after 2 of its 4 steps
    loops = torch.load(mid, map_location="cpu", weights_only=True)["loops"]["fit_loop"]
    assert loops["epoch_loop.batch_progress"]["current"]["processed"] == 2

    resumed = run_cli(*tiny(tmp_path, "mid", f"--resume={mid}"))
    assert resumed.trainer.global_step == 8
    logged = [s for s, _ in scalars(tmp_path / "mid", "train/loss")]
    assert logged == [6, 7]  # exactly the two remaining steps of the epoch, then the run ends
    ref_lr = dict(scalars(tmp_path / "ref", LR_TAG))
    assert [(s, v) for s, v in scalars(tmp_path / "mid", LR_TAG)] == [(6, ref_lr[6]), (7, ref_lr[7])]
    final = torch.load(tmp_path / "mid" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    adam_steps = {int(s["step"]) for s in final["optimizer_states"][0]["state"].values()}
    assert adam_steps == {8}
    ref_final = torch.load(tmp_path / "ref" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert final["global_step"] == ref_final["global_step"] == 8
    # the loader continued the interrupted epoch after its first 2 batches: the weights (and EMA) are the reference's
    assert final["SyntheticDataModule"]["train_loader"]["epoch"] == 2
    assert [k for k in final["state_dict"] if not torch.equal(final["state_dict"][k], ref_final["state_dict"][k])] \
        == []


def test_resume_auto_without_checkpoint_starts_fresh_and_explicit_path_must_exist(tmp_path):
    cli = run_cli(*tiny(tmp_path, "fresh", "--resume=auto", "--trainer.max_epochs=1"))
    assert cli.trainer.ckpt_path is None and _initializer(cli).applied and _initializer(cli).skipped_reason is None
    with pytest.raises(ConfigError, match="no such checkpoint"):
        run_cli(*tiny(tmp_path, "fresh", f"--resume={tmp_path / 'missing.ckpt'}"))
    with pytest.raises(ConfigError, match="no usable checkpoint"):
        run_cli(*tiny(tmp_path, "empty", "--resume=auto", subcommand="test"))


def test_resume_auto_prefers_a_newer_slurm_hpc_checkpoint(tmp_path):
    cli = run_cli(*tiny(tmp_path, "hpc", "--trainer.max_epochs=1"))
    run = tmp_path / "hpc"
    # what Lightning's SLURM handler does on the requeue signal: save hpc_ckpt_N.ckpt into default_root_dir
    hpc = Path(cli.trainer._checkpoint_connector.hpc_save_path(cli.trainer.default_root_dir))
    cli.trainer.save_checkpoint(hpc)
    assert hpc.parent == run and hpc.name == "hpc_ckpt_1.ckpt"
    assert latest_checkpoint(run) == hpc
    resumed = run_cli(*tiny(tmp_path, "hpc", "--resume=auto"))
    assert resumed.trainer.ckpt_path == str(hpc) and resumed.trainer.global_step == 8


def test_resume_auto_picks_the_highest_step_whatever_the_modification_times(tmp_path, monkeypatch):
    """A copied run (cp, rsync, a restore from backup) where an older ``preempted.ckpt`` is the newest file: ``--resume
    auto`` continues from the checkpoint with the highest stored step, not the newest one by mtime."""
    stop2 = '--trainer.callbacks=[{"class_path": "_cli_helpers.StopAfterStep", "init_args": {"step": 2}}]'
    run, ckdir = tmp_path / "copied", tmp_path / "copied" / "checkpoints"
    run_cli(*tiny(tmp_path, "copied", stop2))
    os.replace(ckdir / "last.ckpt", ckdir / "preempted.ckpt")  # a real step-2 checkpoint, as a preemption leaves it
    run_cli(*tiny(tmp_path, "copied", "--resume=auto", STOP_AFTER_EPOCH_0))
    steps = {p.name: torch.load(p, map_location="cpu", weights_only=True)["global_step"] for p in ckdir.glob("*.ckpt")}
    assert steps["preempted.ckpt"] == 2 and steps["last.ckpt"] == 4, steps
    now = time.time()
    for i, name in enumerate(sorted(steps, key=lambda n: (n == "preempted.ckpt", n == "last.ckpt"))):
        os.utime(ckdir / name, (now - 100 + i, now - 100 + i))  # epoch file oldest, then last.ckpt, preempted newest
    assert latest_checkpoint(run) == ckdir / "last.ckpt"
    assert checkpoint_candidates(run)[-1] == ckdir / "preempted.ckpt"
    # the checkpoint folder named twice (as `test` does: the run's relative path and the absolute one) is listed once
    monkeypatch.chdir(tmp_path)
    assert len(checkpoint_candidates("copied", extra_dirs=(ckdir,))) == len(steps)
    monkeypatch.undo()
    resumed = run_cli(*tiny(tmp_path, "copied", "--resume=auto"))
    assert resumed.trainer.ckpt_path == str(ckdir / "last.ckpt") and resumed.trainer.global_step == 8


class SignalInValidation(L.Callback):
    """Sends this process a real SIGTERM after the first batch of epoch ``epoch``'s validation (not the sanity
    check)."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch, self.sent = epoch, False

    def on_validation_batch_end(self, trainer: L.Trainer, *args: object, **kwargs: object) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_validation_runs_that_validation_at_resume(tmp_path):
    """A SIGTERM in the middle of epoch 0's validation: exit 143 with a checkpoint; the resumed run validates epoch 0
    again from its first batch (it used to skip it: no metric, top-k never saw the epoch), then ends as an
    uninterrupted run does, metrics included."""
    from impulsevit.cli import main

    run_cli(*tiny(tmp_path, "straight"))
    sig = '--trainer.callbacks=[{"class_path": "test_resume.SignalInValidation", "init_args": {"epoch": 0}}]'
    assert main(tiny(tmp_path, "cut", sig)) == 143
    assert scalars(tmp_path / "cut", "val/acc1") == []
    resumed = run_cli(*tiny(tmp_path, "cut", "--resume=auto"))
    assert resumed.trainer.ckpt_path == str(tmp_path / "cut" / "checkpoints" / "preempted.ckpt")
    want = scalars(tmp_path / "straight", "val/acc1")
    assert len(want) == 2 and scalars(tmp_path / "cut", "val/acc1") == want
    a, b = state_dict(tmp_path / "straight" / "checkpoints" / "last.ckpt"), \
        state_dict(tmp_path / "cut" / "checkpoints" / "last.ckpt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    ckpt = resumed.trainer.checkpoint_callback
    assert len(ckpt.best_k_models) == 1 and ckpt.best_model_score is not None
    assert float(ckpt.best_model_score) == max(v for _, v in want)


def _tags(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every TensorBoard scalar of a run directory, ``tag -> [(step, value)]`` over its event files in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(run_dir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns):
        ea = EventAccumulator(str(f), size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in ea.Scalars(tag))
    return out


@pytest.mark.parametrize(("case", "signal_step", "extra"), [
    ("end of epoch 1", 7, []),
    ("end of the last epoch", 11, []),
    ("val_check_interval point inside epoch 1", 5, ["--trainer.val_check_interval=2"]),
])
def test_sigterm_at_a_batch_before_validation_runs_that_validation_at_resume(tmp_path, case, signal_step, extra):
    """3 epochs of 4 steps. A real SIGTERM that the preemption callback acts on at a training batch after which the fit
    validates: the last batch of epoch 1 (0-based epochs; the 4th batch of the 2nd epoch, ending at global step 8),
    the last batch of the last epoch (step 12), or a ``val_check_interval`` point inside epoch 1 (step 6). The fit
    checkpoints at that batch and leaves (143) before validating; the resumed fit runs that validation first, then
    the epoch-end hooks, once (Lightning alone restored past both: the epoch had no val metrics, no attention record,
    no top-k candidate, and its ``on_train_epoch_end`` hooks never ran), and ends as the uninterrupted run does."""
    from impulsevit.callbacks.preemption import VALIDATION_PENDING

    every_epoch = ["--trainer.max_epochs=3", "--checkpoint.save_top_k=-1", *extra]

    def callbacks(name: str, *more: dict) -> str:
        log = {"class_path": "_cli_helpers.EpochEndLog", "init_args": {"path": str(tmp_path / f"{name}.hooks")}}
        return f"--trainer.callbacks={json.dumps([log, *more])}"

    run_cli(*tiny(tmp_path, "straight", *every_epoch, callbacks("straight")))
    sig = {"class_path": "_cli_helpers.SignalAtStep", "init_args": {"step": signal_step}}
    with pytest.raises(SystemExit) as stopped:
        run_cli(*tiny(tmp_path, "cut", *every_epoch, callbacks("cut", sig)))
    assert stopped.value.code == 143
    preempted = tmp_path / "cut" / "checkpoints" / "preempted.ckpt"
    saved = torch.load(preempted, map_location="cpu", weights_only=True)
    assert saved["global_step"] == signal_step + 1
    before = [s for s, _ in scalars(tmp_path / "cut", "val/acc1")]
    assert before and max(before) < signal_step  # the validation due after the stop step had not run
    resumed = run_cli(*tiny(tmp_path, "cut", *every_epoch, "--resume=auto", callbacks("cut")))
    assert resumed.trainer.ckpt_path == str(preempted) and resumed.trainer.global_step == 12

    run, ref = tmp_path / "cut", tmp_path / "straight"
    # validation: the same metrics at the same steps (once per validation), val_ema too
    want, got = _tags(ref), _tags(run)
    for tag in want:
        if tag.startswith(("val/", "val_ema/", "attention_evolution/")):
            assert got.get(tag) == want[tag], tag
    assert len(want["val/acc1"]) == (6 if extra else 3)
    # the attention records: one per point (init and every epoch), the same numbers
    records = {p.name: json.loads(p.read_text()) for p in (ref / "attention").glob("*.json")}
    assert sorted(records) == [f"step_{s:08d}.json" for s in (0, 4, 8, 12)]
    assert {p.name: json.loads(p.read_text()) for p in (run / "attention").glob("*.json")} == records
    # the epoch-end hooks ran exactly once per epoch across the two lives, in the uninterrupted order
    assert (tmp_path / "cut.hooks").read_text() == (tmp_path / "straight.hooks").read_text()
    # top-k saw every epoch (save_top_k=-1 keeps one checkpoint per validation), with the same scores
    assert sorted(p.name for p in (run / "checkpoints").glob("epoch=*.ckpt")) == \
        sorted(p.name for p in (ref / "checkpoints").glob("epoch=*.ckpt"))
    straight_ckpt = torch.load(ref / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    scores = {Path(k).name: float(v) for k, v in resumed.trainer.checkpoint_callback.best_k_models.items()}
    assert scores == {Path(k).name: float(v) for k, v in
                      straight_ckpt["callbacks"][resumed.trainer.checkpoint_callback.state_key]["best_k_models"].items()}
    # training: bit-identical weights (EMA included), the same per-step loss and lr
    a, b = state_dict(ref / "checkpoints" / "last.ckpt"), state_dict(run / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    assert got["train/loss"] == want["train/loss"] and got[LR_TAG] == want[LR_TAG]
    assert saved.get(VALIDATION_PENDING) == saved["epoch"]  # how: the stop checkpoint says the validation is to do


def test_usr1_when_slurm_kills_the_job_as_it_requeues_loses_no_logged_step(tmp_path):
    """SLURM kills a job's steps once it is requeued (SIGTERM, SIGKILL after ``KillWait``): the harshest case is a
    kill at the moment ``scontrol requeue`` runs. A real fit in a subprocess (``SLURM_JOB_ID`` set, a ``scontrol`` on
    PATH that SIGKILLs its caller) gets a real SIGUSR1 inside epoch 0 (acted on at step 1) or at its last batch
    (step 3, a validation follows); the step it is acted on, and every step before it, must be in the TensorBoard
    event files by then, and ``--resume auto`` must give the uninterrupted run's curve, validations and weights (the
    acted-on step's loss was lost when the requeue came before Lightning logged that step)."""
    (tmp_path / "bin").mkdir()
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "$@" >> "$SCONTROL_CALLS"\nkill -9 $PPID\n')
    scontrol.chmod(0o755)
    runs = tmp_path / "runs"

    def fit(name: str, *extra: str, **env: str) -> subprocess.CompletedProcess:  # one thread each, as one kind of run
        return subprocess.run([sys.executable, "-m", "impulsevit.cli", *tiny(runs, name, *extra)],
                              env={**subprocess_env(), **env}, capture_output=True, text=True, timeout=300)

    assert fit("straight").returncode == 0
    ref = runs / "straight"
    want, final = _tags(ref), state_dict(ref / "checkpoints" / "last.ckpt")
    for signal_step in (1, 3):
        name, calls = f"cut{signal_step}", tmp_path / f"calls{signal_step}"
        sig = [{"class_path": "_cli_helpers.SignalAtStep", "init_args": {"step": signal_step, "signum": 10}}]
        done = fit(name, f"--trainer.callbacks={json.dumps(sig)}", SLURM_JOB_ID="4242", SCONTROL_CALLS=str(calls),
                   PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
        assert calls.read_text() == "requeue 4242\n"
        run, preempted = runs / name, runs / name / "checkpoints" / "preempted.ckpt"
        assert torch.load(preempted, weights_only=True)["global_step"] == signal_step + 1
        assert [s for s, _ in scalars(run, "train/loss")] == list(range(signal_step + 1))  # on disk before the kill
        resumed = fit(name, "--resume=auto")
        assert resumed.returncode == 0 and f"resumed from {preempted}" in resumed.stderr, resumed.stderr[-3000:]
        got = _tags(run)
        for tag in ("train/loss", "val/acc1", LR_TAG):
            assert got[tag] == want[tag], (signal_step, tag)
        b = state_dict(run / "checkpoints" / "last.ckpt")
        assert [k for k in final if not torch.equal(final[k], b[k])] == [], signal_step


def test_resume_auto_with_fsdp2_distributed_checkpoint_folder(tmp_path):
    args = tiny(tmp_path, "fsdp", "--trainer.strategy=fsdp2", "--model.ema_decay=null")
    run_cli(*args, STOP_AFTER_EPOCH_0)
    folder = tmp_path / "fsdp" / "checkpoints" / "last.ckpt"
    assert folder.is_dir() and latest_checkpoint(tmp_path / "fsdp") == folder
    resumed = run_cli(*args, "--resume=auto")
    assert resumed.trainer.ckpt_path == str(folder) and resumed.trainer.global_step == 8
    assert _initializer(resumed).skipped_reason is not None


# ------------------------------------------------------------------------------------------------ crash safety
def test_discovery_skips_temp_truncated_and_unfinished_checkpoints(tmp_path):
    run = tmp_path / "run"
    ckdir = run / "checkpoints"
    good = {"global_step": 3, "state_dict": {"w": torch.ones(1000)}}
    io = AtomicCheckpointIO()
    io.save_checkpoint(good, ckdir / "last.ckpt")
    assert latest_checkpoint(run) == ckdir / "last.ckpt"
    # newer but broken candidates: a leftover temp file, a truncated file, an empty file, a non-checkpoint
    blob = (ckdir / "last.ckpt").read_bytes()
    time.sleep(0.01)
    (ckdir / f"last.ckpt.tmp-{os.getpid()}").write_bytes(blob[: len(blob) // 2])
    (ckdir / "epoch=1-step=6.ckpt").write_bytes(blob[: len(blob) - 100])
    (ckdir / "empty.ckpt").write_bytes(b"")
    torch.save({"not": "a checkpoint"}, ckdir / "other.ckpt")
    assert ckdir / f"last.ckpt.tmp-{os.getpid()}" not in checkpoint_candidates(run)
    assert not is_complete_checkpoint(ckdir / "epoch=1-step=6.ckpt")
    assert latest_checkpoint(run) == ckdir / "last.ckpt"
    # a distributed-checkpoint folder counts only once its meta.pt (written last) is newer than every shard
    dcp = ckdir / "dist.ckpt"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"x")
    (dcp / "__0_0.distcp").write_bytes(b"x")
    assert not is_complete_checkpoint(dcp)
    time.sleep(0.01)
    torch.save({"global_step": 9}, dcp / "meta.pt")
    assert latest_checkpoint(run) == dcp
    time.sleep(0.01)
    (dcp / "__0_0.distcp").write_bytes(b"y")  # a newer shard: an overwrite that did not finish
    assert latest_checkpoint(run) == ckdir / "last.ckpt"


def test_atomic_write_leaves_old_file_when_the_write_fails(tmp_path):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full (simulated by a failing pickle)")

    with pytest.raises(RuntimeError, match="disk full"):
        io.save_checkpoint({"global_step": 2, "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


@pytest.mark.slow
def test_sigkill_during_checkpoint_write_then_resume_auto(tmp_path):
    """A real fit in a subprocess is SIGKILLed while it writes a checkpoint (a temp file exists); ``--resume auto``
    then continues from the last complete checkpoint and never picks up the partial file."""
    # ~8 M parameters (wide MLP on 2x2 patches + cls): each checkpoint (weights + 2 Adam moments) is ~100 MB,
    # so a write takes long enough to be caught in the act
    big = {"img_size": 8, "patch_size": 4, "embed_dim": 64, "depth": 1, "num_heads": 2, "mlp_ratio": 1000}
    data = {"class_path": "impulsevit.data.SyntheticDataModule",
            "init_args": {"num_classes": 4, "image_size": 8, "num_train": 24, "num_val": 8, "batch_size": 4}}

    def fit_args(runs: Path) -> list[str]:
        return [
            "fit", "--recipe", str(TINY), f"--runs_dir={runs}", "--name=killed",
            f"--model.backbone_kwargs={json.dumps(big)}", f"--data={json.dumps(data)}", "--model.init.method=timm",
            "--model.ema_decay=null", "--checkpoint.every_n_train_steps=1", "--checkpoint.save_top_k=0",
            "--trainer.max_epochs=1",
        ]

    def kill_during_a_write(runs: Path) -> tuple[Path | None, int, str]:
        """Start the fit, SIGKILL it while a second checkpoint write is in progress; (the temp file seen, exit code,
        stderr)."""
        ckdir = runs / "killed" / "checkpoints"
        proc = subprocess.Popen([sys.executable, "-m", "impulsevit.cli", *fit_args(runs)], env=subprocess_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        caught = None
        deadline = time.monotonic() + 240
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                tmps = list(ckdir.glob("last.ckpt.tmp-*")) if ckdir.is_dir() else []
                if tmps and (ckdir / "last.ckpt").is_file():  # a second write is in progress, a first one is complete
                    os.kill(proc.pid, signal.SIGKILL)
                    caught = tmps[0]
                    break
                time.sleep(0.002)
        finally:
            if proc.poll() is None and caught is None:
                proc.kill()
            proc.wait()
        return caught, proc.returncode, proc.stderr.read().decode(errors="replace")

    # the write can finish (and rename its temp file) between seeing it and the kill: then that try did not catch a
    # write in progress, and a fresh run tries again (3 tries; a CI run lost that race once)
    for attempt in range(3):
        runs = tmp_path / f"try{attempt}"
        caught, code, stderr = kill_during_a_write(runs)
        assert caught is not None, f"never saw a checkpoint write in progress; fit stderr:\n{stderr[-3000:]}"
        assert code == -signal.SIGKILL
        if caught.exists():  # the partial write is left behind, under its temp name only
            break
    else:
        pytest.fail("in 3 tries the checkpoint write always finished before the kill arrived")
    ckdir = runs / "killed" / "checkpoints"
    complete = torch.load(ckdir / "last.ckpt", map_location="cpu", weights_only=True)
    step_before = complete["global_step"]
    assert step_before >= 1
    assert latest_checkpoint(runs / "killed") == ckdir / "last.ckpt"

    resumed = run_cli(*fit_args(runs), "--resume=auto")
    assert resumed.trainer.ckpt_path == str(ckdir / "last.ckpt")
    assert _initializer(resumed).skipped_reason is not None
    assert resumed.trainer.global_step == 6  # 24 samples / batch 4: the epoch was completed
    logged = [s for s, _ in scalars(runs / "killed", "train/loss")]
    assert logged[-(6 - step_before):] == list(range(step_before, 6))


@pytest.mark.slow
def test_ddp_two_processes_resume_auto_is_bit_exact_with_per_rank_randomness(tmp_path):
    """``impulsevit fit`` with ``strategy: ddp`` on 2 CPU processes (gloo), as a user runs it (a subprocess: Lightning
    re-launches the command for rank 1): stop after epoch 0, ``--resume auto``, compare with an uninterrupted run.

    The tiny recipe has mixup / CutMix and drop path: the ranks draw different λ and drop-path masks (seeded
    ``seed + rank``), every rank's RNG state is in the checkpoint and each rank gets its own back on resume, and the
    resumed draws are the uninterrupted run's, rank by rank."""
    env = subprocess_env()
    with socket.socket() as s:  # a port of our own for the gloo rendezvous (other DDP tests may run concurrently)
        s.bind(("127.0.0.1", 0))
        env["MASTER_PORT"] = str(s.getsockname()[1])
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]

    def fit(name: str, probe: str, *extra: str) -> str:
        callbacks = [{"class_path": "_cli_helpers.DrawProbe", "init_args": {"out": str(tmp_path / probe)}}]
        if STOP_AFTER_EPOCH_0 in extra:
            callbacks.append({"class_path": "_cli_helpers.StopAfterEpoch", "init_args": {"epoch": 0}})
            extra = tuple(e for e in extra if e != STOP_AFTER_EPOCH_0)
        cmd = [sys.executable, "-m", "impulsevit.cli", *tiny(tmp_path, name, *ddp, *extra),
               f"--trainer.callbacks={json.dumps(callbacks)}"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    fit("straight", "p_straight")
    fit("split", "p_first", STOP_AFTER_EPOCH_0)
    saved = torch.load(tmp_path / "split" / "checkpoints" / "last.ckpt", map_location="cpu",
                       weights_only=True)["callbacks"]["RNGStateCheckpoint"]["ranks"]
    log = fit("split", "p_resumed", "--resume=auto")
    assert "resuming from" in log and "is not re-applied" in log
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == 4  # 64 samples / 2 ranks / batch 16 = 2 steps per epoch
    assert [k for k in a["state_dict"] if not torch.equal(a["state_dict"][k], b["state_dict"][k])] == []
    assert yaml.safe_load((tmp_path / "split" / "config.yaml").read_text())["trainer"]["strategy"] == "ddp"

    def probe(name: str) -> list[dict]:
        return [torch.load(tmp_path / name / f"rank{r}.pt", weights_only=False) for r in (0, 1)]

    straight, resumed = probe("p_straight"), probe("p_resumed")
    # per-rank streams: the two replicas draw different mixup λ and different drop-path masks at the same steps
    assert sorted(straight[0]["lam"]) == sorted(straight[1]["lam"]) == [0, 1, 2, 3]
    assert all(straight[0]["lam"][s] != straight[1]["lam"][s] for s in range(4))
    assert straight[0]["masks"] and straight[0]["masks"] != straight[1]["masks"]
    # resume: each rank gets its own saved RNG state back, and draws what the uninterrupted run drew at those steps
    assert len(saved) == 2 and not torch.equal(saved[0]["torch"], saved[1]["torch"])
    for r in (0, 1):
        assert resumed[r]["start_step"] == 2
        assert torch.equal(resumed[r]["rng_at_start"], saved[r]["torch"])
        assert resumed[r]["lam"] == {s: straight[r]["lam"][s] for s in (2, 3)}
        assert resumed[r]["masks"] == {s: straight[r]["masks"][s] for s in (2, 3)}
