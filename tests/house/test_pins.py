"""scripts/check_pins.py (the version check scripts/test.sh runs before the suite) on real installed distributions:
setup.cfg's ranges, the compat table (impulsevit._compat.CHECKED_ON) and constraints/ci.txt."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_pins.py"


def _run(cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--setup-cfg", str(cfg), *extra], capture_output=True,
                          text=True)


def _table(tmp_path: Path, rows: dict[str, str]) -> Path:
    path = tmp_path / "compat.py"
    path.write_text(f"CHECKED_ON: dict[str, str] = {rows!r}\n")
    return path


def _cfg(tmp_path: Path, install_requires: list[str], extras: dict[str, list[str]] | None = None) -> Path:
    text = "[options]\ninstall_requires =\n" + "".join(f"    {r}\n" for r in install_requires)
    if extras:
        text += "[options.extras_require]\n" + "".join(
            f"{k} =\n" + "".join(f"    {r}\n" for r in v) for k, v in extras.items())
    cfg = tmp_path / "setup.cfg"
    cfg.write_text(text)
    return cfg


def test_the_projects_pins_hold_in_this_environment():
    out = _run(ROOT / "setup.cfg", "--strict")
    assert out.returncode == 0, out.stderr
    for name in ("torch", "timm", "lightning"):
        assert f"{metadata.version(name)}" in out.stdout  # the installed versions are printed


def test_a_version_outside_the_compat_table_warns_and_fails_only_when_strict(tmp_path):
    """A newer release than the private uses were checked on is a user's right (no cap in setup.cfg): a warning
    naming the library, the version and the row; CI (--strict) fails on it."""
    timm = metadata.version("timm")
    major, minor = (int(x) for x in timm.split(".")[:2])
    cfg, table = _cfg(tmp_path, ["timm>=0.9", "numpy"]), _table(tmp_path, {"timm": f"<{major}.{minor}"})
    out = _run(cfg, "--compat", str(table))
    assert out.returncode == 0, out.stderr
    assert f"timm: installed {timm}, the compat table" in out.stderr and f"<{major}.{minor}" in out.stderr
    assert "UNCHECKED" in out.stdout
    strict = _run(cfg, "--compat", str(table), "--strict")
    assert strict.returncode == 1 and f"timm: installed {timm}" in strict.stderr
    inside = _run(cfg, "--compat", str(_table(tmp_path, {"timm": f">={major}.{minor}"})), "--strict")
    assert inside.returncode == 0 and "UNCHECKED" not in inside.stdout


def test_setup_cfg_has_no_upper_cap_on_torch_timm_lightning():
    """Users keep their current torch / timm / Lightning: setup.cfg gives ranges, constraints/ci.txt the CI pins."""
    from packaging.requirements import Requirement

    out = _run(ROOT / "setup.cfg")
    for line in out.stdout.splitlines()[2:]:
        name, spec = line.split()[:2]
        if name in ("torch", "timm", "lightning", "jsonargparse", "torchvision"):
            assert "<" not in spec and "==" not in spec, line
    pins = [Requirement(x.split("#")[0]) for x in (ROOT / "constraints" / "ci.txt").read_text().splitlines()
            if x.split("#")[0].strip()]
    assert all(len(p.specifier) == 1 and next(iter(p.specifier)).operator == "==" for p in pins)
    assert {"torch", "torchvision", "timm", "lightning", "jsonargparse", "ffcv"} <= {p.name for p in pins}


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
