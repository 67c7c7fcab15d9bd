"""A 2-rank ``torchrun`` launch (how Kubernetes' PyTorchJob and bare multi-node clusters start jobs) of ``impulsevit
fit`` on CPU (gloo), then the same launch with ``--resume auto`` continuing it; torch's "all_gather is deprecated" line
(Lightning's all_gather) is not printed. The run's state is read from its ``run.json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli_helpers import TINY, subprocess_env

pytestmark = pytest.mark.slow

TORCHRUN = Path(sys.executable).with_name("torchrun")


def _torchrun(runs: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", "-m", "impulsevit.cli", "fit", "--recipe",
           str(TINY), "--trainer.devices=2", "--trainer.strategy=ddp", f"--runs_dir={runs}", "--name=tr", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=900)


@pytest.mark.skipif(not os.access(TORCHRUN, os.X_OK), reason="torchrun is not installed next to this interpreter")
def test_torchrun_two_ranks_fit_then_resume(tmp_path):
    first = _torchrun(tmp_path, "--trainer.max_epochs=1")
    assert first.returncode == 0, first.stderr[-4000:]
    summary = json.loads((tmp_path / "tr" / "run.json").read_text())
    # 64 images, 16 per rank and step on 2 ranks: 2 steps per epoch
    assert (summary["state"], summary["epoch"], summary["global_step"]) == ("finished", 1, 2), summary
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in first.stdout + first.stderr

    second = _torchrun(tmp_path, "--trainer.max_epochs=2", "--resume", "auto")
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "impulsevit: resuming from" in out, out[-4000:]
    summary = json.loads((tmp_path / "tr" / "run.json").read_text())
    assert (summary["state"], summary["epoch"], summary["global_step"], summary["total_steps"]) == \
        ("finished", 2, 4, 4), summary
    for text in (first.stdout + first.stderr, out):
        assert "all_gather is deprecated" not in text
