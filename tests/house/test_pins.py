"""scripts/check_pins.py (the version check scripts/test.sh runs before the suite) on real installed distributions."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_pins.py"


def _run(cfg: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--setup-cfg", str(cfg)], capture_output=True, text=True)


def _cfg(tmp_path: Path, install_requires: list[str], extras: dict[str, list[str]] | None = None) -> Path:
    text = "[options]\ninstall_requires =\n" + "".join(f"    {r}\n" for r in install_requires)
    if extras:
        text += "[options.extras_require]\n" + "".join(
            f"{k} =\n" + "".join(f"    {r}\n" for r in v) for k, v in extras.items())
    cfg = tmp_path / "setup.cfg"
    cfg.write_text(text)
    return cfg


def test_the_projects_pins_hold_in_this_environment():
    out = _run(ROOT / "setup.cfg")
    assert out.returncode == 0, out.stderr
    for name in ("torch", "timm", "lightning"):
        assert f"{metadata.version(name)}" in out.stdout  # the installed versions are printed


def test_a_version_outside_its_pin_fails_and_names_pin_and_version(tmp_path):
    lightning = metadata.version("lightning")
    major, minor = (int(x) for x in lightning.split(".")[:2])
    cfg = _cfg(tmp_path, [f"lightning>=2.0,<{major}.{minor}", "timm"])
    out = _run(cfg)
    assert out.returncode == 1
    assert f"lightning: installed {lightning}, setup.cfg allows <{major}.{minor},>=2.0" in out.stderr
    assert "timm" not in out.stderr  # only the violated pin is listed as a problem


def test_missing_required_fails_missing_extra_does_not(tmp_path):
    absent = "impulsevit-no-such-distribution"
    assert _run(_cfg(tmp_path, ["numpy"], {"opt": [f"{absent}>=1"]})).returncode == 0
    out = _run(_cfg(tmp_path, ["numpy", f"{absent}>=1"]))
    assert out.returncode == 1 and f"{absent}: required >=1, not installed" in out.stderr


def test_installed_extra_outside_its_pin_fails(tmp_path):
    out = _run(_cfg(tmp_path, ["numpy"], {"dev": [f"pytest<{metadata.version('pytest')}"]}))
    assert out.returncode == 1 and "pytest [extra dev]" in out.stderr
