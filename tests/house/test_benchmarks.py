"""Benchmarks cannot rot: every ``benchmarks/*.py``, found by glob, runs in its ``--smoke`` mode (the same code path
at tiny sizes, seconds on a CPU) as a subprocess, exits 0, prints its table and ends with ``ratio: <float>``, the
contract of docs/benchmarks.md. A new benchmark without a smoke mode, or one whose own checks fail (e.g.
``init_speed.py``'s equality with the per-head formulation), fails here.

A benchmark that truly cannot run without CUDA says so in one line and exits ``NEEDS_CUDA_STATUS``; it is listed in
``NEEDS_CUDA`` with its reason, the one list of them, and this file fails when a listed benchmark is gone or runs
without CUDA after all (no exemption outlives its reason)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from _cli_helpers import subprocess_env

pytestmark = pytest.mark.slow  # starts processes (tests/README.md, Lanes)

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))

TABLE_HEADERS = {
    "attention_overhead.py": "train step",
    "aug_fidelity.py": "statistic (KS distance vs timm)",
    "augment_cost.py": "timm / device",
    "callback_cost.py": "µs/step",
    "compile_step.py": "ms/step",
    "device_resample_speed.py": "device_us",
    "gpu_throughput.py": "columns: row",
    "init_speed.py": "max rel diff",
    "loader_profile.py": "stage",
    "loader_speed.py": "img/s/core",
    "loop_overhead.py": "plain PyTorch loop",
    "preview_fidelity.py": "PSNR vs timm",
    "scaling_model.py": "| recipe | model |",
}
"""Per benchmark, a piece of its table's header line: the smoke run must print it and at least one row with a number
after it (a cheap check that the table came out, not only the ratio)."""

NEEDS_CUDA: dict[str, str] = {}
"""Benchmarks that cannot run without CUDA, each with its reason; none today (``gpu_throughput.py``,
``augment_cost.py`` and ``device_resample_speed.py`` run their CPU path, ``compile_step.py`` is CPU-only)."""
NEEDS_CUDA_STATUS = 3
"""The exit status of a ``NEEDS_CUDA`` benchmark on a machine without CUDA (2 is argparse's usage error)."""

TIMEOUT_S = 800
"""One benchmark's smoke run, seconds: each takes 1-50 s of CPU; on the 2 cores shared with a whole test suite, up to
12 min (below pytest's --timeout 900 of the test that waits for it)."""


def run_smoke(name: str) -> tuple[subprocess.CompletedProcess, float]:
    """``python benchmarks/<name> --smoke`` in the repository (one thread per process, the repo importable) and its
    wall time in seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / name), "--smoke"], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    return proc, time.perf_counter() - t0


@pytest.fixture(scope="module")
def smoke_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Future]]:
    """The smoke run of every benchmark whose test was selected, started at once, two at a time (each process on one
    thread): ``{name: future of (process, seconds)}``. Each test waits for its own run only, so the per-test timeout
    bounds one benchmark, not all of them."""
    names = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "originalname", "") == "test_smoke_mode_prints_table_and_ratio"]
    pool = ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1)))
    try:
        yield {name: pool.submit(run_smoke, name) for name in names}
    finally:
        pool.shutdown(cancel_futures=True)  # runs not started yet (after a -x stop) are dropped


def ratio_of(line: str) -> float | None:
    """The finite float of a ``ratio: X`` line, else None."""
    m = re.fullmatch(r"ratio: (\S+)", line.strip())
    if m is None:
        return None
    try:
        value = float(m.group(1))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def table_printed(lines: list[str], header: str) -> bool:
    """A line holding ``header`` and, after it and before the last line, a line with a number."""
    start = next((i for i, line in enumerate(lines[:-1]) if header in line), None)
    return start is not None and any(re.search(r"\d", line) for line in lines[start + 1 : -1])


def test_every_benchmark_is_listed() -> None:
    """Each benchmark has its table header here (a new one needs a smoke mode and an entry), and every exemption
    names an existing benchmark."""
    assert BENCHMARKS, "no benchmarks/*.py found"
    unknown = sorted(set(BENCHMARKS) - set(TABLE_HEADERS))
    assert not unknown, f"add the table header of {unknown} to TABLE_HEADERS (and give it a --smoke mode)"
    gone = sorted((set(TABLE_HEADERS) | set(NEEDS_CUDA)) - set(BENCHMARKS))
    assert not gone, f"{gone} listed here but not in benchmarks/: remove the entries"


@pytest.mark.parametrize("name", BENCHMARKS)
def test_smoke_mode_prints_table_and_ratio(name: str, smoke_runs: dict[str, Future]) -> None:
    proc, seconds = smoke_runs[name].result()
    print(f"{name} --smoke: {seconds:.1f} s")
    report = f"{name} --smoke (rc {proc.returncode}, {seconds:.0f} s):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if name in NEEDS_CUDA and not torch.cuda.is_available():
        assert proc.returncode != 0, f"{name} ran without CUDA: remove it from NEEDS_CUDA\n{report}"
        assert proc.returncode == NEEDS_CUDA_STATUS, report
        assert len(lines) + len(proc.stderr.strip().splitlines()) == 1 and "CUDA" in proc.stdout + proc.stderr, report
        return
    assert proc.returncode == 0, report
    assert lines and ratio_of(lines[-1]) is not None, f"the last line is not 'ratio: <float>'\n{report}"
    assert table_printed(lines, TABLE_HEADERS[name]), f"no table under {TABLE_HEADERS[name]!r}\n{report}"
