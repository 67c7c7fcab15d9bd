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


def _summary(**over: object) -> dict:
    """A ``run.json`` with every key ``RunRecord.write_summary`` writes, as a finished tiny run leaves it."""
    base = {"state": "finished", "reason": None, "epoch": 1, "max_epochs": 1, "global_step": 4, "total_steps": 4,
            "last_val_acc1": 0.25, "best_val_acc1": 0.25, "wall_seconds": 12.5, "started": "2026-12-06T10:00:00+00:00",
            "backbone": "vit_tiny_patch16_224", "init_method": "impulse", "recipes": ["tiny_synthetic"],
            "pretrained": None, "host": "h", "pid": 1, "updated": "2026-12-06T10:01:00+00:00"}
    return {**base, **over}


def test_runs_lists_badly_typed_run_files(tmp_path):
    """Values of another type in ``run.json`` / ``config.yaml`` / ``status.json`` / ``study.json`` are unknown cells,
    each named once on stderr; the other runs and the other cells print, ``--sort best`` puts unknowns last."""
    from faults import harness

    runs = tmp_path / "runs"
    config = TINY.read_text()
    cases = {  # name -> (run.json, config.yaml text)
        "good": (_summary(best_val_acc1=0.5), config),
        "list-is-number": (_summary(recipes=5, best_val_acc1=0.75), config),
        "acc-is-text": (_summary(best_val_acc1="high", last_val_acc1="high", epoch="one"), config),
        "backbone-is-mapping": (_summary(backbone={"name": "vit"}, best_val_acc1=0.1),
                                config.replace("backbone: vit_tiny_patch16_224", "backbone: {name: vit}")),
        "state-is-list": (_summary(state=["finished"], global_step=True, wall_seconds=[1]), "model: [1, 2]\n"),
    }
    assert "backbone: {name: vit}" in cases["backbone-is-mapping"][1]
    for name, (summary, cfg) in cases.items():
        (runs / name).mkdir(parents=True)
        (runs / name / "run.json").write_text(json.dumps(summary))
        (runs / name / "config.yaml").write_text(cfg)
    study = runs / "st"
    shutil.copytree(runs / "good", study / "a-s0")
    (study / "a-s0" / "status.json").write_text(json.dumps({"state": {"done": 1}, "returncode": "zero"}))
    (study / "study.json").write_text(json.dumps({"recipe": 3, "runs": [{"name": "a-s0"}, {"name": 7}]}))

    res = harness.run("runs", str(runs), "--sort", "best", cwd=tmp_path, timeout=300)
    assert res.rc == 0 and "Traceback" not in res.err, res.err[-3000:]
    lines = res.out.splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == ["list-is-number", "good", "state-is-list",
                                                   "backbone-is-mapping", "acc-is-text", "study", "a-s0"], res.out
    by_name = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert by_name["list-is-number"][1:3] == ["finished", "-"]  # recipe unknown, the rest as written
    assert by_name["good"][1:5] == ["finished", "tiny_synthetic", "vit_tiny_patch16_224", "impulse"]
    assert by_name["backbone-is-mapping"][3] == "-" and "10.00" in by_name["backbone-is-mapping"]
    assert by_name["acc-is-text"][1] == "finished" and by_name["acc-is-text"][5:9] == ["-", "4/4", "-", "-"]
    assert by_name["state-is-list"][1:7] == ["unknown", "tiny_synthetic", "vit_tiny_patch16_224", "impulse", "1/1",
                                             "-"]
    warned = [ln for ln in res.err_lines if "warning" in ln]
    expected = [f"{runs / 'list-is-number' / 'run.json'}: recipes is 5, not a list",
                f"{runs / 'acc-is-text' / 'run.json'}: best_val_acc1 is 'high', not a number",
                f"{runs / 'acc-is-text' / 'run.json'}: epoch is 'one', not an integer",
                f"{runs / 'backbone-is-mapping' / 'config.yaml'}: model.backbone is {{'name': 'vit'}}, not a string",
                f"{runs / 'state-is-list' / 'run.json'}: state is ['finished'], not a string",
                f"{runs / 'state-is-list' / 'run.json'}: global_step is True, not an integer",
                f"{runs / 'state-is-list' / 'config.yaml'}: model is [1, 2], not a mapping",
                f"{study / 'study.json'}: recipe is 3, not a string",
                f"{study / 'study.json'}: runs[1].name is 7, not a string",
                f"{study / 'a-s0' / 'status.json'}: state is {{'done': 1}}, not a string"]
    for note in expected:
        assert sum(note in ln for ln in warned) == 1, (note, warned)
    assert len(warned) == len(set(warned)), warned
