"""Faults around trackers (``--tracker``, impulsevit/trackers.py), through the real command in its own session: a
wrong tracker name is one line before any work; a SIGTERM mid-fit with W&B on leaves no W&B service process behind
and keeps the run's W&B id for the resume."""

from __future__ import annotations

import json
import os
import signal

import pytest

from faults.harness import (
    REPO,
    TINY,
    assert_no_survivors,
    assert_one_line_error,
    finish,
    run,
    snapshot,
    start,
    wait_for,
)


def test_unknown_tracker_is_one_line_and_writes_nothing(tmp_path):
    before = snapshot(tmp_path)
    res = run("fit", "--recipe", TINY, "--runs_dir=runs", "--name=t", "--tracker=wandb,tensorbored", cwd=tmp_path)
    assert_one_line_error(res, 2, "--tracker 'tensorbored'", "unknown tracker")
    assert_no_survivors(res.sid)
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_sigterm_with_wandb_leaves_no_service_process_and_keeps_the_run_id(tmp_path):
    pytest.importorskip("wandb")
    marker = tmp_path / "started"
    slow = ('--trainer.callbacks=[{"class_path": "_cli_helpers.SlowSteps", "init_args": {"seconds": 0.3, '
            f'"marker": "{marker}", "after": 2}}}}]')
    extra = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wb"),
             "WANDB_CACHE_DIR": str(tmp_path / "wb"), "WANDB_DATA_DIR": str(tmp_path / "wb"),
             "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = start("fit", "--recipe", TINY, "--runs_dir=runs", "--name=w", "--tracker=wandb", slow, cwd=tmp_path,
                 extra_env=extra)
    wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=300, what="two training steps")
    assert marker.exists(), proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGTERM)
    res = finish(proc, timeout=180)
    assert res.rc == 128 + signal.SIGTERM, res.err[-3000:]
    assert_no_survivors(res.sid, grace=30)  # wandb-core, the W&B service, included
    run_dir = tmp_path / "runs" / "w"
    ids = json.loads((run_dir / "trackers.json").read_text())["ids"]["wandb"]
    assert len(ids) == 1 and list(run_dir.glob(f"wandb/offline-run-*-{ids[0]}/run-{ids[0]}.wandb"))
    assert (run_dir / "checkpoints" / "preempted.ckpt").is_file() and (run_dir / "config.yaml").is_file()
