"""The package as a user installs it: a wheel built from the source tree, installed into a fresh venv, run from a
directory outside the source tree — recipes come from the wheel (package data), not from a checkout.

The fresh venv gets no packages from the network: a ``.pth`` file appends this interpreter's site-packages (torch,
timm, Lightning, ...) after its own, so ``impulsevit`` itself is imported from the installed wheel only (the
``.pth`` path line does not run the editable-install hook that lives in those site-packages).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow  # wheel build + venv + two CLI start-ups: ~30-60 s on 2 busy cores

ROOT = Path(__file__).resolve().parents[2]
_NOT_SOURCE = (".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__", "data_cache", "lightning_logs",
               ".pytest_cache", ".ruff_cache", "*.beton")


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", IMPULSEVIT_CACHE=str(tmp / "cache"), PYTHONNOUSERSITE="1")
    env.pop("IMPULSEVIT_RECIPES", None)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(venv, a working directory outside the source tree, env) with the freshly built wheel installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = _env(tmp)
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
          str(src)], tmp, env)
    (wheel,) = (tmp / "dist").glob("impulsevit-*.whl")
    shipped = {Path(n).name for n in zipfile.ZipFile(wheel).namelist() if n.startswith("impulsevit/recipes_data/")}
    assert {p.name for p in (ROOT / "recipes").glob("*.yaml")} <= shipped

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    vpy = venv / "bin" / "python"
    purelib = _run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).stdout
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib.strip(), "_impulsevit_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps", "--no-index", str(wheel)],
         tmp, env)
    work = tmp / "elsewhere"
    work.mkdir()
    return venv, work, env


def test_wheel_ships_the_recipes_and_lists_them_from_anywhere(installed):
    venv, work, env = installed
    where = _run([str(venv / "bin" / "python"), "-c", "import impulsevit; print(impulsevit.__file__)"], work, env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel, not the source tree
    listing = _run([str(venv / "bin" / "impulsevit"), "recipes"], work, env).stdout
    listed = {line.split()[0] for line in listing.splitlines() if line.strip()}
    assert listed == {p.stem for p in (ROOT / "recipes").glob("*.yaml")}


def test_quickstart_trains_from_the_wheel(installed):
    venv, work, env = installed
    out = _run([str(venv / "bin" / "impulsevit"), "fit", "--recipe", "quickstart", "--trainer.max_steps=1",
                "--trainer.limit_val_batches=1", "--data.init_args.train_subset=256", "--data.init_args.val_subset=128",
                "--data.init_args.backend=torchvision", "--data.init_args.num_workers=0"], work, env)
    assert "Initializer: applied 'impulse'" in out.stdout + out.stderr  # the recipe's init method ran
    ckpt = torch.load(work / "runs/quickstart/checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 1
    recipe = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    assert ckpt["hyper_parameters"]["backbone_kwargs"] == recipe["model"]["backbone_kwargs"]
