"""``python -m impulsevit``: the same command as the ``impulsevit`` console script, exit statuses included."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _cli_helpers import subprocess_env

pytestmark = pytest.mark.slow  # starts processes (tests/README.md, Lanes)


def _python_m(*args: str, cwd) -> subprocess.CompletedProcess:  # noqa: ANN001 - a path
    return subprocess.run([sys.executable, "-m", "impulsevit", *args], cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)


def test_python_m_impulsevit_is_the_command(tmp_path):
    res = _python_m("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "fit" in res.stdout and "export" in res.stdout
    res = _python_m("download", cwd=tmp_path)  # a subcommand's usage error: its one line and exit status 2
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert "impulsevit download: error: the following arguments are required" in res.stderr
