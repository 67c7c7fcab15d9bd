"""Preemption and requeue: the SlurmRequeue callback in-process (real signals), then against a real SLURM on loopback.

In-process tests send real SIGUSR1/SIGTERM to this process mid-step and check where the checkpoint lands (the step
boundary after the signal), that training continues / stops as documented, and that the handlers are restored.
The cluster tests (``slurm`` marker) submit real jobs to a single-node SLURM (tests/slurm_cluster.py).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from slurm_cluster import slurm_cluster  # noqa: F401  (the module-scoped pytest fixture)

from impulsevit.callbacks.preemption import Preempted, SlurmRequeue
from impulsevit.cluster.events import job_state, read_events
from impulsevit.data.loading.synthetic import SyntheticDataModule
from impulsevit.training.module import ImageClassifier

# in-process runs happen on a machine with SLURM installed but outside a job: Lightning's hint about srun is noise
pytestmark = [pytest.mark.filterwarnings("ignore:The `srun` command is available"), pytest.mark.slow]

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


# ------------------------------------------------------------------------------------------ against a real SLURM
# The fixture's cluster and helpers live in tests/slurm_cluster.py; jobs import slurm_cluster.StepPacer (PYTHONPATH).

TESTS_DIR = Path(__file__).resolve().parents[1]  # tests/: slurm_cluster.py
RECIPE = """# tiny synthetic DDP run for the SLURM tests (2 CPU tasks, gloo)
seed_everything: 0
trainer:
  max_epochs: 3
  log_every_n_steps: 1
  enable_progress_bar: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  limit_val_batches: 1
  callbacks:
    - class_path: slurm_cluster.StepPacer
      init_args: {sleep_s: 0.3}
checkpoint: {monitor: null, save_top_k: 1, save_last: true}  # last.ckpt = the end of every epoch
model:
  backbone: vit_tiny_patch16_224
  backbone_kwargs: {img_size: 16, patch_size: 8, depth: 1, embed_dim: 32, num_heads: 2}
  init: {method: torch, seed: 0}
  log_attention: false
data:
  class_path: impulsevit.data.loading.synthetic.SyntheticDataModule
  init_args: {num_classes: 4, image_size: 16, num_train: 64, num_val: 16, batch_size: 8}
"""
STEPS_2_TASKS = 3 * 64 // (8 * 2)  # epochs x batches per rank


# The jobs' runs folder holds a space and a '#': sbatch splits `#SBATCH` lines at whitespace and reads an unescaped
# '#' as a comment, so a job log found at <run>/slurm/<job>.out shows the script's `--output` was quoted for sbatch.
RUNS = "job runs #1"


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "impulsevit"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "impulsevit.cli"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, slurm_cluster):  # noqa: F811
    root = tmp_path_factory.mktemp("jobs")
    (root / "tiny.yaml").write_text(RECIPE)
    env = {**slurm_cluster.env, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return {"root": root, "env": env, "cluster": slurm_cluster, "results": {}}


def _submit(ws, name: str, *extra: str) -> str:
    proc = subprocess.run([*_cli(), "submit", "--recipe", "tiny.yaml", "--runs-dir", RUNS, "--name", name, *extra],
                          cwd=ws["root"], env=ws["env"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(r"Submitted batch job (\d+)", proc.stdout)
    assert m, proc.stdout
    run_dir = ws["root"] / RUNS / name
    assert f"{run_dir}/slurm/{m.group(1)}.out" in proc.stdout
    return m.group(1)


def _wait(ws, name: str, job_id: str, until, timeout: float = 240.0) -> str:
    """Poll the run directory's events (no squeue/sacct) until ``until(state)``; returns the state."""
    run_dir = ws["root"] / RUNS / name
    t0 = time.monotonic()
    state = job_state(run_dir)
    while time.monotonic() - t0 < timeout:
        state = job_state(run_dir)
        if until(state):
            return state
        time.sleep(0.3)
    log = run_dir / "slurm" / f"{job_id}.out"
    raise AssertionError(f"job {job_id} state {state!r} after {timeout:.0f} s\n--- {log}:\n"
                         f"{log.read_text() if log.exists() else '(none)'}\n{ws['cluster'].logs()}")


def _job_log(ws, name: str, job_id: str) -> str:
    return (ws["root"] / RUNS / name / "slurm" / f"{job_id}.out").read_text()


def _loss_steps(run_dir: Path) -> list[int]:
    """Every ``train/loss`` step in the run's TensorBoard event files, duplicates kept (raw records, no purging)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = []
    for f in sorted(run_dir.rglob("events.out.tfevents.*")):
        for ev in EventFileLoader(str(f)).Load():
            steps += [ev.step for v in ev.summary.value if v.tag == "train/loss"]
    return sorted(steps)


def _check_run_dir(run_dir: Path) -> int:
    """Shared checks on a finished run directory; returns the final global step."""
    assert (run_dir / "config.yaml").is_file() and (run_dir / "submit.sbatch").is_file()
    assert list(run_dir.glob("events.out.tfevents.*")), "no TensorBoard events in the run directory"
    assert not list(run_dir.rglob("version_*")), "a version_N folder appeared: the requeued job must reuse the log"
    return _ckpt_step(run_dir / "checkpoints" / "last.ckpt")


def _plain_run(ws) -> tuple[int, list[int], str]:  # noqa: ANN001 - the workspace fixture's dict
    """The uninterrupted 2-task DDP job ``plain``, run once per module on first use (whichever test needs it first):
    ``(final step, logged loss steps, job log)``."""
    if "plain" not in ws["results"]:
        job = _submit(ws, "plain", "--tasks-per-node", "2", "--trainer.strategy=ddp")
        state = _wait(ws, "plain", job, lambda s: s in ("completed", "failed"))
        log = _job_log(ws, "plain", job)
        assert state == "completed", log
        run_dir = ws["root"] / RUNS / "plain"
        ws["results"]["plain"] = (_check_run_dir(run_dir), _loss_steps(run_dir), log)
    return ws["results"]["plain"]


@pytest.mark.slurm
@pytest.mark.slow
def test_submit_two_tasks_completes(workspace):
    step, steps, log = _plain_run(workspace)
    assert step == STEPS_2_TASKS
    assert steps == list(range(STEPS_2_TASKS)), steps
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log, log  # ranks from srun


@pytest.mark.slurm
@pytest.mark.slow
def test_usr1_checkpoints_requeues_and_resumes(workspace):
    ws, name = workspace, "preempt"
    plain_step, plain_steps, _ = _plain_run(ws)
    cluster, run_dir = ws["cluster"], ws["root"] / RUNS / name
    job = _submit(ws, name, "--tasks-per-node", "2", "--trainer.strategy=ddp")
    t0 = time.monotonic()
    while not ((run_dir / "progress").exists() and int((run_dir / "progress").read_text() or 0) >= 5):
        assert time.monotonic() - t0 < 180, f"job never reached step 5\n{cluster.logs()}"
        assert job_state(run_dir) not in ("completed", "failed"), _job_log(ws, name, job)
        time.sleep(0.05)
    cluster.run(["scancel", "--signal=USR1", job])  # to the job steps: both srun tasks
    t_signal = time.monotonic()
    state = _wait(ws, name, job, lambda s: s in ("completed", "failed") and
                  any(e["event"] == "resume" for e in read_events(run_dir)))
    log = _job_log(ws, name, job)
    assert state == "completed", log
    events = read_events(run_dir)
    kinds = [(e["event"], e["restart"]) for e in events]
    ckpt = next(e for e in events if e["event"] == "checkpoint")
    resume = next(e for e in events if e["event"] == "resume")
    requeue = next(e for e in events if e["event"] == "requeue")
    assert requeue["rc"] == "0" and ckpt["restart"] == "0" and resume["restart"] == "1", kinds
    assert ckpt["path"] == str(run_dir / "checkpoints" / "preempted.ckpt") == resume["path"], (ckpt, resume)
    assert int(ckpt["step"]) == int(resume["step"]) >= 5, (ckpt, resume)
    assert ("start", "1") in kinds and kinds[-1] == ("exit", "1"), kinds
    # one requeue owner: a single requeue, and no Lightning hpc_ckpt_*.ckpt (its USR1 handler never ran)
    assert [k for k, _ in kinds].count("requeue") == 1 and not list(run_dir.rglob("hpc_ckpt_*")), kinds
    # the restarted attempt ran under the same job id, wrote into the same directory and log file
    for needle in ("received SIGUSR1", f"checkpoint saved to {run_dir}/checkpoints/preempted.ckpt",
                   f"scontrol requeue {job} -> exit 0", f"resumed from {run_dir}/checkpoints/preempted.ckpt"):
        assert needle in log, needle
    print("\n".join(ln for ln in log.splitlines() if "[impulsevit]" in ln))  # shown with -s: the report's lines
    print(f"signal -> completed after requeue: {time.monotonic() - t_signal:.1f} s")
    assert _check_run_dir(run_dir) == plain_step
    assert _loss_steps(run_dir) == plain_steps  # neither duplicated nor missing steps across the requeue
    # the requeued job continued the interrupted epoch exactly: the uninterrupted run's weights, bit for bit
    a, b = (torch.load(d / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
            for d in (run_dir, ws["root"] / RUNS / "plain"))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.mark.slurm
@pytest.mark.slow
def test_ddp_checkpoint_from_two_ranks_resumes_on_one(workspace):
    """A copy of the 2-rank run ``plain`` continues for one more epoch as a 1-task job (a copy: the other tests compare
    against ``plain`` as it is, whatever order they run in)."""
    _plain_run(workspace)
    name = "plain-1task"
    run_dir = workspace["root"] / RUNS / name
    shutil.copytree(workspace["root"] / RUNS / "plain", run_dir)
    job = _submit(workspace, name, "--tasks-per-node", "1", "--trainer.max_epochs=4")
    state = _wait(workspace, name, job, lambda s: s in ("completed", "failed")
                  and sum(e["event"] == "exit" for e in read_events(run_dir)) == 2)
    log = _job_log(workspace, name, job)
    assert state == "completed", log
    assert f"resumed from {run_dir}/checkpoints/" in log and f"at global step {STEPS_2_TASKS}" in log, log
    one_rank_epoch = 64 // 8
    assert _check_run_dir(run_dir) == STEPS_2_TASKS + one_rank_epoch
    assert _loss_steps(run_dir) == list(range(STEPS_2_TASKS + one_rank_epoch))


@pytest.mark.slurm
@pytest.mark.slow
def test_fsdp2_under_srun_resumes_on_fewer_ranks_and_exports(workspace):
    """FSDP2 (ModelParallelStrategy) with 2 SLURM tasks writes a distributed checkpoint; a 1-task job resumes from it
    and ``impulsevit export`` consolidates it into a timm state dict."""
    ws, name = workspace, "fsdp2"
    run_dir = ws["root"] / RUNS / name
    job = _submit(ws, name, "--tasks-per-node", "2", "--trainer.strategy=fsdp2", "--trainer.max_epochs=1")
    assert _wait(ws, name, job, lambda s: s in ("completed", "failed")) == "completed", _job_log(ws, name, job)
    log = _job_log(ws, name, job)
    assert "MEMBER: 2/2" in log, log
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_dir() and (last / ".metadata").is_file(), "FSDP2 should write a distributed checkpoint folder"
    job = _submit(ws, name, "--tasks-per-node", "1", "--trainer.strategy=fsdp2", "--trainer.max_epochs=2")
    assert _wait(ws, name, job, lambda s: s in ("completed", "failed")
                 and sum(e["event"] == "exit" for e in read_events(run_dir)) == 2) == "completed", \
        _job_log(ws, name, job)
    log = _job_log(ws, name, job)
    assert f"at global step {64 // 16}" in log, log  # resumed after the 2-rank epoch (4 steps)
    out = ws["root"] / "fsdp2.pth"
    proc = subprocess.run([*_cli(), "export", str(last), str(out)], cwd=ws["root"], env=ws["env"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import timm

    model = timm.create_model("vit_tiny_patch16_224", num_classes=4, checkpoint_path=str(out),
                              img_size=16, patch_size=8, depth=1, embed_dim=32, num_heads=2)
    assert sum(p.numel() for p in model.parameters()) > 0
