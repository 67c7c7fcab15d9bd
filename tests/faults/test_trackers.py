"""Faults around trackers (``--tracker``, impulsevit/training/trackers.py), through the real command in its own
session: a
wrong tracker name is one line before any work. (A SIGTERM mid-fit with W&B / MLflow on, and no process left behind:
tests/training/test_trackers.py, whose preempted runs go through this harness.)"""

from __future__ import annotations

from faults.harness import (
    TINY,
    assert_no_survivors,
    assert_one_line_error,
    run,
    snapshot,
)


def test_unknown_tracker_is_one_line_and_writes_nothing(tmp_path):
    before = snapshot(tmp_path)
    res = run("fit", "--recipe", TINY, "--runs_dir=runs", "--name=t", "--tracker=wandb,tensorbored", cwd=tmp_path)
    assert_one_line_error(res, 2, "--tracker 'tensorbored'", "unknown tracker")
    assert_no_survivors(res.sid)
    assert snapshot(tmp_path) == before
