"""``impulsevit runs``: one table of a real mixed runs directory — a finished tiny run, one stopped by SIGTERM
(preempted), one that failed with an exception, one running (its lock held by the live fit), the same run after a
SIGKILL (interrupted; failed once the job script's events log records the exit code), and a study's runs grouped.
All from the runs' own files (``run.json``, ``config.yaml``, ``.lock``, ``slurm/events.log``, ``study.json``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
from _cli_helpers import TINY, subprocess_env

from impulsevit.cluster.events import append_event, events_path
from impulsevit.run.runs import format_table, scan, select
from impulsevit.run.runs import main as runs_main

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


class RaiseAtStep(L.Callback):
    """Raises ``RuntimeError`` after optimizer step ``step``."""

    def __init__(self, step: int = 2) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError(f"boom at step {trainer.global_step}")


def _fit(runs: Path, name: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "impulsevit.cli", "fit", "--recipe", str(TINY), f"--runs_dir={runs}",
           f"--name={name}", "--trainer.max_epochs=1", *extra]
    env = subprocess_env()  # and this file's folder: the child imports test_runs.RaiseAtStep
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(Path(__file__).resolve().parent)])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "impulsevit.cli", "runs", *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _main_json(capsys, *args: str) -> list[dict]:
    capsys.readouterr()
    assert runs_main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_lists_a_mixed_directory(tmp_path, capsys):
    runs = tmp_path / "runs"
    marker = tmp_path / "running.marker"
    procs = {
        "done": _fit(runs, "done"),
        "stopped": _fit(runs, "stopped", "--trainer.callbacks+=_cli_helpers.SignalAtStep",
                        "--trainer.callbacks.step=2"),
        "broken": _fit(runs, "broken", "--trainer.callbacks+=test_runs.RaiseAtStep"),
        "live": _fit(runs, "live", "--trainer.max_epochs=50", "--trainer.callbacks+=_cli_helpers.SlowSteps",
                     "--trainer.callbacks.seconds=0.5", f"--trainer.callbacks.marker={marker}",
                     "--trainer.callbacks.after=5"),
    }
    try:
        codes = {n: procs[n].wait(timeout=600) for n in ("done", "stopped", "broken")}
        assert codes["done"] == 0 and codes["stopped"] == 143 and codes["broken"] not in (0, 143), \
            {n: (codes[n], procs[n].stderr.read().decode()[-2000:]) for n in codes}
        deadline = time.monotonic() + 600
        while not marker.exists() and procs["live"].poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), procs["live"].stderr.read().decode()[-2000:]

        rows = {r.name: r for r in scan(runs)}
        assert {n: r.status for n, r in rows.items()} == \
            {"done": "finished", "stopped": "preempted", "broken": "failed", "live": "running"}
        done, stopped, broken, live = rows["done"], rows["stopped"], rows["broken"], rows["live"]
        assert (done.epoch, done.step, done.total_steps) == (1, 4, 4)
        assert done.best_val_acc1 is not None and done.best_val_acc1 == done.last_val_acc1
        assert (done.recipe, done.backbone, done.init_method) == ("tiny_synthetic", "vit_tiny_patch16_224", "impulse")
        assert done.wall_seconds is not None and done.wall_seconds > 0
        assert stopped.step == 3 and stopped.reason == "SIGTERM"  # the signal at step 2, its checkpoint at the next
        assert stopped.last_event.startswith("checkpoint reason=stop step=3"), stopped
        assert broken.reason == "RuntimeError: boom at step 2"
        assert live.reason == f"pid {procs['live'].pid} on {json.loads((runs / 'live' / '.lock').read_text())['host']}"
        assert live.step is not None and live.total_steps == 200

        table = _cli(str(runs))
        lines = table.splitlines()
        assert lines[0].split()[:3] == ["run", "status", "recipe"] and len(lines) == 5, table
        assert [ln.split()[:2] for ln in lines[1:]] == [["broken", "failed"], ["done", "finished"],
                                                       ["live", "running"], ["stopped", "preempted"]], table
        failed = _main_json(capsys, str(runs), "--status", "failed,preempted")
        assert [(r["name"], r["status"]) for r in failed] == [("broken", "failed"), ("stopped", "preempted")]
        assert _main_json(capsys, str(runs), "--recipe", "nothing-like-it") == []
    finally:
        procs["live"].send_signal(signal.SIGKILL)  # killed without a word (out of memory, node failure)
        procs["live"].wait(timeout=60)

    after = {r.name: r for r in scan(runs)}["live"]
    assert after.status == "interrupted", after
    # under SLURM the job script then logs the exit code, which names the failure
    append_event(events_path(runs / "live"), event="exit", rc=137)
    after = {r.name: r for r in scan(runs)}["live"]
    assert after.status == "failed" and after.reason.startswith("exit rc=137"), after

    # a study: study.json's planned runs, grouped; a planned run not started yet is listed too
    study = runs / "tiny-study"
    study.mkdir()
    shutil.copytree(runs / "done", study / "impulse-s0")
    (study / "impulse-s0" / "status.json").write_text(json.dumps({"state": "done", "returncode": 0}))
    (study / "study.json").write_text(json.dumps({"recipe": str(TINY), "runs": [
        {"method": "impulse", "seed": 0, "name": "impulse-s0"}, {"method": "box", "seed": 0, "name": "box-s0"}]}))
    rows = select(scan(runs), sort="best")
    assert [(r.group, r.name, r.status) for r in rows][-2:] == [("tiny-study", "impulse-s0", "finished"),
                                                                 ("tiny-study", "box-s0", "unknown")]
    assert "study tiny-study:" in format_table(rows)
    assert [r.name for r in scan(study)] == ["impulse-s0", "box-s0"]
