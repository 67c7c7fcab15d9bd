"""docker/Dockerfile installs what setup.cfg declares (Docker cannot build here, so the Dockerfile is read).

Checks: the dependency layer installs the project from ``setup.cfg`` with exactly the ``ffcv`` extra and no package
pinned on the side (so the image's Python dependency set *is* install_requires + extras[ffcv]); FFCV's system packages
are the ones ``scripts/setup.sh`` installs; the base is a CUDA PyTorch image whose torch satisfies setup.cfg; the
entrypoint is the ``impulsevit`` console script; every COPY source exists and is not excluded by ``.dockerignore``.
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import re
import shlex
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
FFCV_SYSTEM_PACKAGES = {"libopencv-dev", "libturbojpeg0-dev", "pkg-config"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").strip() + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _reqs(block: str) -> list[Requirement]:
    return [Requirement(ln.strip()) for ln in block.strip().splitlines() if ln.strip()]


def pip_installs() -> list[list[str]]:
    """The argument lists (options dropped) of every ``pip install`` in RUN instructions."""
    found = []
    for kind, args in instructions():
        if kind != "RUN":
            continue
        lexer = shlex.shlex(args, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands: list[list[str]] = [[]]
        for tok in lexer:
            if tok in ("&&", ";", "||", "|"):
                commands.append([])
            else:
                commands[-1].append(tok)
        for words in commands:
            if "pip" in words and "install" in words[words.index("pip"):]:
                rest = words[words.index("install", words.index("pip")) + 1:]
                found.append([w for w in rest if not w.startswith("-")])
    return found


def test_dependency_set_is_setup_cfg_with_ffcv_extra():
    installs = pip_installs()
    assert installs, "the Dockerfile installs nothing with pip"
    extras_declared = {k: _reqs(v) for k, v in setup_cfg()["options.extras_require"].items()}
    install_requires = _reqs(setup_cfg()["options"]["install_requires"])
    extras: set[str] = set()
    for t in (t for args in installs for t in args):  # only the project itself: every dependency comes from setup.cfg
        m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", t)
        assert m, f"pip installs {t!r} outside setup.cfg; add it to setup.cfg instead"
        extras |= set(m.group(1).split(",")) if m.group(1) else set()
    assert extras == {"ffcv"}, f"the image should install exactly the ffcv extra, got {extras}"
    image_deps = {r.name.lower() for r in install_requires} | {r.name.lower() for r in extras_declared["ffcv"]}
    assert {"torch", "timm", "lightning", "ffcv"} <= image_deps
    # the dependency layer sees setup.cfg before it installs (dependencies are resolved from it)
    order = [(k, a) for k, a in instructions() if k in ("COPY", "RUN")]
    first_pip = next(i for i, (k, a) in enumerate(order) if k == "RUN" and "pip install" in a)
    assert any(k == "COPY" and "setup.cfg" in a for k, a in order[:first_pip])


def test_ffcv_system_packages_match_setup_script():
    apt = set()
    for kind, args in instructions():
        if kind == "RUN" and "apt-get install" in args:
            cmd = args.split("apt-get install", 1)[1].split("&&")[0]
            apt |= {w for w in shlex.split(cmd) if not w.startswith("-")}
    assert FFCV_SYSTEM_PACKAGES <= apt, f"missing FFCV system packages: {FFCV_SYSTEM_PACKAGES - apt}"
    setup_sh = (ROOT / "scripts" / "setup.sh").read_text()
    apt_pkgs = set(re.search(r'APT_PKGS="([^"]*)"', setup_sh).group(1).split())
    assert FFCV_SYSTEM_PACKAGES <= apt_pkgs, "scripts/setup.sh and the Dockerfile disagree on FFCV's system packages"


def test_base_is_cuda_pytorch_satisfying_setup_cfg():
    base = next(a for k, a in instructions() if k == "ARG" and a.startswith("BASE_IMAGE="))
    image = base.split("=", 1)[1]
    m = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn\d+-devel", image)
    assert m, f"base {image!r} is not a CUDA pytorch/pytorch *-devel image (FFCV compiles during the build)"
    torch_req = next(r for r in _reqs(setup_cfg()["options"]["install_requires"]) if r.name == "torch")
    assert Version(m.group(1)) in torch_req.specifier, f"base torch {m.group(1)} does not satisfy {torch_req}"
    assert ("FROM", "${BASE_IMAGE}") in instructions()


def test_entrypoint_is_a_console_script_setup_cfg_installs():
    (entry,) = [json.loads(a) for k, a in instructions() if k == "ENTRYPOINT"]
    declared = {line.split("=")[0].strip() for line in setup_cfg()["options.entry_points"]["console_scripts"]
                .splitlines() if line.strip()}
    assert entry[0] in declared, f"ENTRYPOINT {entry} runs no console script of setup.cfg ({sorted(declared)})"


def test_copy_sources_exist_and_are_in_the_build_context():
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    for k, args in instructions():
        if k != "COPY":
            continue
        *sources, _dest = shlex.split(args)
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            assert not any(fnmatch.fnmatch(src, pat) for pat in ignore), f"COPY {src} is excluded by .dockerignore"
    assert any(fnmatch.fnmatch(".venv", pat) for pat in ignore), ".venv must not be sent to the Docker daemon"
