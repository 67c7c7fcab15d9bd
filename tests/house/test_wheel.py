"""The package as a user installs it: a wheel built from the source tree, ``pip install``-ed into a fresh venv with its
dependencies resolved from the wheel's own metadata, FFCV (and numba, llvmlite, wandb, mlflow) absent, run from a
directory outside the source tree — recipes come from the wheel (package data), not from a checkout; no repo script.

The fresh venv borrows installed distributions of this interpreter through a ``.pth`` file naming a folder of links
to them (a CUDA build of torch is gigabytes, and which torch a user has is theirs); the optional ones (FFCV, numba,
llvmlite, OpenCV, wandb, mlflow) and impulsevit itself are left out. By default every distribution but those is
borrowed and pip installs the wheel with ``--no-index``: it resolves the wheel's requirements (its metadata) against
what the venv sees, so a requirement missing from setup.cfg or a module that needs an extra fails here (~1-2 min).
With ``IMPULSEVIT_WHEEL_FROM_INDEX=1`` only torch and torchvision (and what they require) are borrowed and pip
installs the wheel's other requirements (timm, Lightning, jsonargparse, ...) from the package index as a user's pip
does (~6 min on 2 busy cores; run before a release). Fashion-MNIST is Debian's system copy
when it is installed (``scripts/setup.sh`` installs it); the download path is tested in
``tests/data/test_data_download_preview.py`` against a local HTTP server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch
import yaml
from packaging.requirements import Requirement

from impulsevit.data.sources import formats

pytestmark = pytest.mark.slow  # wheel build + venv + pip install + three CLI runs: ~1-3 min on 2 busy cores

ROOT = Path(__file__).resolve().parents[2]
_NOT_SOURCE = (".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__", "data_cache", "lightning_logs",
               ".pytest_cache", ".ruff_cache", "*.beton")
OPTIONAL = ("ffcv", "numba", "llvmlite", "wandb", "mlflow", "cv2")
FROM_INDEX = os.environ.get("IMPULSEVIT_WHEEL_FROM_INDEX", "") not in ("", "0")
_NOT_BORROWED = re.compile(r"^(impulsevit|ffcv|numba|llvmlite|wandb|mlflow.*|opencv.*)$")
"""Distributions of this interpreter the venv never sees: the package itself and the optional dependencies."""
SUBSET = ["--data.init_args.train_subset=256", "--data.init_args.val_subset=128", "--data.init_args.num_workers=0",
          "--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.max_epochs=1"]


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "IMPULSEVIT_RECIPES")}
    env.update(OMP_NUM_THREADS="1", IMPULSEVIT_CACHE=str(tmp / "cache"), IMPULSEVIT_DATA=str(tmp / "data"),
               PYTHONNOUSERSITE="1", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 900, status: int = 0,
         ) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == status, \
        f"{' '.join(cmd)}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _borrowed() -> list[metadata.Distribution]:
    """What the venv borrows: with ``FROM_INDEX`` torch, torchvision and every distribution they require (markers
    evaluated here); else every distribution installed here but :data:`_NOT_BORROWED`."""
    if not FROM_INDEX:
        return [d for d in metadata.distributions()
                if not _NOT_BORROWED.match(re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower())]
    seen: dict[str, metadata.Distribution] = {}
    stack = ["torch", "torchvision"]
    while stack:
        name = stack.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(req.name)
    return list(seen.values())


def _view(view: Path) -> None:
    """A folder of links to the top-level files and folders of the :func:`_borrowed` distributions."""
    view.mkdir()
    for dist in _borrowed():
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            top = f.parts[0]
            if top in ("..", "bin") or top.startswith("__editable__") or top.endswith(".pth") or \
                    (view / top).exists() or not (base / top).exists():
                continue
            (view / top).symlink_to(base / top)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(venv, a working directory outside the source tree, env) with the freshly built wheel pip-installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = _env(tmp)
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
          str(src)], tmp, env)
    (wheel,) = (tmp / "dist").glob("impulsevit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("impulsevit/recipes_data/")}
    assert {p.name for p in (ROOT / "recipes").glob("*.yaml")} <= shipped
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)  # this pip installs into it
    vpy = venv / "bin" / "python"
    purelib = _run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).stdout
    _view(tmp / "borrowed")
    Path(purelib.strip(), "_impulsevit_test_borrowed.pth").write_text(f"{tmp / 'borrowed'}\n")
    # the wheel's requirements, resolved by pip from its metadata against what the venv sees (and, FROM_INDEX,
    # installed from the index)
    _run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", *([] if FROM_INDEX else ["--no-index"]),
          str(wheel)], tmp, env, timeout=1200)
    work = tmp / "elsewhere"
    work.mkdir()
    return venv, work, env


def test_the_wheel_installs_with_its_requirements_and_without_the_optional_ones(installed):
    venv, work, env = installed
    vpy = str(venv / "bin" / "python")
    where = _run([vpy, "-c", "import impulsevit; print(impulsevit.__file__)"], work, env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel, not the source tree
    for mod in OPTIONAL:  # the extras are not installed ...
        assert _run([vpy, "-c", f"import importlib.util; print(importlib.util.find_spec({mod!r}))"], work,
                    env).stdout.strip() == "None", mod
    # ... and every module of the package that needs none of them imports (resample is FFCV's decoder code)
    code = ("import importlib, pkgutil, impulsevit, sys; sys.argv = ['x', '--help']\n"
            "bad = []\n"
            "for m in pkgutil.walk_packages(impulsevit.__path__, 'impulsevit.'):\n"
            "    if m.name.endswith('__main__') or m.name == 'impulsevit.data.loading.resample': continue\n"
            "    try: importlib.import_module(m.name)\n"
            "    except Exception as e: bad.append(f'{m.name}: {e!r}')\n"
            "print('\\n'.join(bad))")
    assert _run([vpy, "-c", code], work, env).stdout.strip() == ""
    # the installed set satisfies every requirement
    _run([sys.executable, "-m", "pip", "--python", vpy, "check"], work, env)
    version = _run([vpy, "-c", "from importlib import metadata; print(metadata.version('impulsevit'))"], work, env)
    from impulsevit._version import __version__

    assert version.stdout.strip() == __version__  # setup.cfg reads the version from impulsevit/_version.py


def test_wheel_ships_the_recipes_and_lists_them_from_anywhere(installed):
    venv, work, env = installed
    listing = _run([str(venv / "bin" / "impulsevit"), "recipes"], work, env).stdout
    listed = {line.split()[0] for line in listing.splitlines() if line.strip()}
    assert listed == {p.stem for p in (ROOT / "recipes").glob("*.yaml")}


def test_a_missing_extra_is_one_line_naming_it(installed):
    """Asking for FFCV explicitly: one line naming the extra, exit 2 (the other subcommands go through the same
    boundary: tests/cli/test_missing_extra.py, in-process)."""
    venv, work, env = installed
    exe = str(venv / "bin" / "impulsevit")
    for args, extra in ((["fit", "--recipe", "quickstart", "--data.init_args.backend=ffcv"], "ffcv"),):
        out = _run([exe, *args], work, env, status=2)
        lines = [ln for ln in out.stderr.splitlines() if "error" in ln]
        assert len(lines) == 1 and f"pip install 'impulsevit[{extra}]'" in lines[0], out.stderr
        assert "Traceback" not in out.stderr and "is not valid" not in out.stderr


@pytest.mark.skipif(not Path(formats.FASHION_MNIST_SYSTEM_DIR).is_dir(),
                    reason=f"Debian's dataset-fashion-mnist is not installed ({formats.FASHION_MNIST_SYSTEM_DIR}); "
                           "scripts/setup.sh installs it (no download from the test)")
@pytest.mark.parametrize("backend", ["recipe", "torchvision"])
def test_quickstart_trains_from_the_wheel_to_its_summary(installed, backend):
    """The README's first command on a small subset: the recipe's ``backend: auto`` becomes torchvision with one line
    saying so (no FFCV here); the run ends with its summary and a checkpoint; Debian's copy is read, nothing is
    downloaded into the user's data cache."""
    venv, work, env = installed
    name = f"qs_{backend}"
    extra = [] if backend == "recipe" else [f"--data.init_args.backend={backend}"]
    out = _run([str(venv / "bin" / "impulsevit"), "fit", "--recipe", "quickstart", "--name", name, *SUBSET, *extra],
               work, env)
    text = out.stdout + out.stderr
    assert "Initializer: applied 'impulse'" in text  # the recipe's init method ran
    assert f"impulsevit: run finished: runs/{name}" in text and "final val/acc1:" in text
    said = [ln for ln in text.splitlines() if "FFCV is not installed" in ln]
    assert len(said) == (1 if backend == "recipe" else 0), said
    ckpt = torch.load(work / "runs" / name / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 2
    # LightningCLI records the arguments as given (``auto`` for the recipe); the line above says what ran
    assert ckpt["datamodule_hyper_parameters"]["backend"] == ("auto" if backend == "recipe" else "torchvision")
    recipe = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    assert ckpt["hyper_parameters"]["backbone_kwargs"] == recipe["model"]["backbone_kwargs"]
    assert not (Path(env["IMPULSEVIT_DATA"]) / "fashion_mnist").exists()


@pytest.mark.skipif(not FROM_INDEX, reason="IMPULSEVIT_WHEEL_FROM_INDEX=1 installs the requirements from the index")
def test_the_venv_sees_no_package_of_this_interpreter_but_torchs(installed):
    """The isolation the other tests rely on: timm and Lightning were installed into the venv by pip (from the
    wheel's metadata), not borrowed from this interpreter."""
    venv, work, env = installed
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for name in ("timm", "lightning", "jsonargparse"):
        where = _run([str(venv / "bin" / "python"), "-c", f"import {name}; print({name}.__file__)"], work, env)
        path = Path(where.stdout.strip())
        assert path.is_relative_to(venv) and not any(path.is_relative_to(h) for h in here), (name, path)
