"""Job logs a person can read: where stdout is not a terminal (a file, a pipe: SLURM's ``%j.out``, ``nohup``,
``| tee``) ``fit`` prints one plain line every ``log_every_n_steps`` steps and one per validation instead of
progress-bar frames; on a terminal (a real pseudo-terminal here) the bar is still drawn.
Through the real CLI, tiny recipe."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from _cli_helpers import TINY, run_cli, subprocess_env

from impulsevit.callbacks.console import LineProgressBar, format_duration

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

FIT = [sys.executable, "-m", "impulsevit.cli", "fit", "--recipe", str(TINY), "--trainer.enable_progress_bar=true",
       "--trainer.log_every_n_steps=2"]
TRAIN_LINE = re.compile(r"^epoch (\d)/2 step (\d)/4 \(global (\d)/8\) \| [\d.]+ img/s \([\d.]+/device\) \| "
                        r"loss [\d.]+ \| lr [\d.e+-]+ \| eta \d+:\d\d:\d\d \| max rss \d+(\.\d)? [MG]iB$")
VAL_LINE = re.compile(r"^epoch (\d)/2 validation \(global step (\d)\) \| val/acc1 [\d.]+ \| val/acc5 [\d.]+ \| "
                      r"val/loss [\d.]+")


def test_redirected_fit_prints_one_line_per_n_steps_and_per_validation(tmp_path):
    log = tmp_path / "log"
    with open(log, "wb") as out:
        rc = subprocess.run([*FIT, f"--runs_dir={tmp_path}", "--name=r"], stdout=out, stderr=subprocess.STDOUT,
                            env=subprocess_env(), timeout=300).returncode
    text = log.read_text()
    assert rc == 0, text
    assert "\r" not in text and "it/s" not in text, text  # no bar frames
    train = [m.groups()[:3] for m in map(TRAIN_LINE.match, text.splitlines()) if m]
    val = [m.groups() for m in map(VAL_LINE.match, text.splitlines()) if m]
    # 2 epochs x 4 steps, a line every 2 steps; a validation line at the end of each epoch
    assert train == [("1", "2", "2"), ("1", "4", "4"), ("2", "2", "6"), ("2", "4", "8")], text
    assert val == [("1", "4"), ("2", "8")], text
    lines = text.splitlines()
    assert lines.index(next(ln for ln in lines if ln.startswith("epoch 1/2 validation"))) > \
        lines.index(next(ln for ln in lines if ln.startswith("epoch 1/2 step 4/4")))


def test_on_a_terminal_the_bar_is_drawn(tmp_path):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 0 columns: tqdm draws nothing
    try:
        proc = subprocess.Popen([*FIT, f"--runs_dir={tmp_path}", "--name=t", "--trainer.max_epochs=1"],
                                stdout=slave, stderr=subprocess.DEVNULL, env=subprocess_env())
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=300) == 0
    finally:
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert "Epoch 0" in text and "\r" in text and "4/4" in text, text  # tqdm's redrawn bar
    assert not re.search(r"^epoch 1/1 step", text, re.M), text


def test_explicit_line_callback_takes_its_interval(tmp_path, capsys):
    cli = run_cli("fit", "--recipe", str(TINY), f"--runs_dir={tmp_path}", "--name=e",
                  "--trainer.enable_progress_bar=true", "--trainer.log_every_n_steps=1",
                  "--trainer.callbacks+=impulsevit.callbacks.LineProgressBar", "--trainer.callbacks.every_n_steps=4",
                  "--trainer.callbacks.every_seconds=0")
    bars = [c for c in cli.trainer.callbacks if isinstance(c, LineProgressBar)]
    assert len(bars) == 1 and bars[0].every_n_steps == 4 and cli.trainer.progress_bar_callback is bars[0]
    out = capsys.readouterr().out.splitlines()
    assert [ln.split(" | ")[0] for ln in out if re.match(r"epoch \d/2 step", ln)] == \
        ["epoch 1/2 step 4/4 (global 4/8)", "epoch 2/2 step 4/4 (global 8/8)"], out


def test_format_duration():
    assert format_duration(0) == "0:00:00"
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(float("inf")) == "?"


def test_submit_job_script_gets_the_lines():
    """``submit``'s job script writes the fit's stdout to ``slurm/%j.out`` through ``srun`` without a pseudo-terminal
    and leaves the progress bar on: the fit sees a file and prints lines (the golden scripts are what
    ``render_sbatch`` writes, tests/cli/test_submit.py)."""
    golden = sorted((Path(__file__).resolve().parents[1] / "golden").glob("submit_*.sbatch"))
    assert golden
    for path in golden:
        text = path.read_text()
        assert re.search(r"^#SBATCH --output=\S+/slurm/%j\.out$", text, re.M), path
        srun = next(ln for ln in text.splitlines() if ln.startswith("srun "))
        assert "--pty" not in srun and "enable_progress_bar" not in srun and "LineProgressBar" not in srun, srun
