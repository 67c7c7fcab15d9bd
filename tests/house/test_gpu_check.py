"""``benchmarks/gpu_check.sh`` on a bare machine, as a lent GPU machine is: a copy of the repository (no ``.venv`` in
it, nothing installed from it, no pin check) and a Python without FFCV and without jsonargparse. Their absence is made
real for the interpreter by packages of those names on ``PYTHONPATH`` that fail to import. The script must say which
versions it found, skip the rows that need the missing packages with a note, run the rest, and exit 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

REPO = Path(__file__).resolve().parents[2]


def test_library_imports_without_jsonargparse() -> None:
    """The fast stand-in for the bare-machine run: everything the GPU benchmarks import (the module, the callbacks, the
    datamodules, the initializers) imports without Lightning's CLI module, which needs jsonargparse."""
    code = ("import sys; import impulsevit, impulsevit.callbacks, impulsevit.training.module, impulsevit.data, "
            "impulsevit.init; "
            "bad = sorted(m for m in sys.modules if m.startswith(('jsonargparse', 'lightning.pytorch.cli'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


@pytest.mark.slow
def test_bare_machine_mode(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".whl", "runs", "data_cache", "__pycache__", "*.beton", "build", "dist", "*.egg-info"))
    absent = tmp_path / "absent"
    for name in ("ffcv", "jsonargparse"):
        (absent / name).mkdir(parents=True)
        (absent / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed on this machine')\n")
    env = {**os.environ, "CPU_ONLY": "1", "PYTHON": sys.executable, "PYTHONPATH": str(absent), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=1500)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    found = next(line for line in out.splitlines() if line.startswith("gpu_check: found"))
    assert "ffcv absent" in found and "jsonargparse absent" in found and "torch 2." in found, found
    table = out[out.index("check "):]
    assert "FFCV loader" in table and "ffcv not importable" in table
    for name in ("timm[", "fit[", "fit_fsdp2["):
        row = next(line for line in table.splitlines() if line.startswith(name))
        assert " ok " in row and "img/s" in row, row
    aug = next(line for line in table.splitlines() if line.startswith("DeviceAugment 28 px"))
    assert " ok " in aug and "µs/img" in aug and "timm PIL chain" in aug, aug
    resample = next(line for line in table.splitlines() if line.startswith("device resample 32 px"))
    assert " ok " in resample and "µs/img" in resample and "numba resample" in resample, resample
    assert "FAILED" not in table and "Traceback" not in out
    assert not (copy / ".venv").exists()  # nothing was installed into the copy
