"""The docs: the Sphinx site (docs/conf.py) builds with warnings as errors, its API reference and the tutorial are
rendered, the packages it needs are declared, and the README stays a short page whose links all resolve."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # one Sphinx build with autodoc (imports torch, timm, Lightning): ~15-50 s on 2 busy cores
def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_nb")
    out = tmp_path / "html"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(tmp_path / "doctrees"),
           str(ROOT / "docs"), str(out)]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"sphinx-build -W failed (exit {run.returncode}):\n{run.stderr[-5000:]}"
    for page in ("index", "usage", "guarantees", "cluster", "extending", "method", "results", "benchmarks", "design",
                 "api", "tutorial"):
        assert (out / f"{page}.html").is_file(), f"docs/{page} was not built"
    api = (out / "api.html").read_text()
    # autodoc rendered the docstrings, not only the names
    assert 'id="impulsevit.init.initialize"' in api and "generator" in api
    assert 'id="impulsevit.data.ImageDataModule"' in api
    tutorial = (out / "tutorial.html").read_text()
    assert "<img" in tutorial, "the tutorial's stored figures are not rendered"


def _extra(name: str) -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.extras_require"][name].splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")}


def test_the_dev_extra_installs_what_the_docs_tests_need() -> None:
    """scripts/setup.sh installs `.[dev,ffcv]`: the docs extra's requirements must be in dev, as written."""
    docs, dev = _extra("docs"), _extra("dev")
    assert docs and docs <= dev, f"setup.cfg: the dev extra lacks {sorted(docs - dev)} of the docs extra"
    names = {re.split(r"[<>=!\[ ]", r)[0].lower() for r in dev}
    assert {"nbclient", "nbformat", "ipykernel"} <= names, "setup.cfg: the dev extra must install the notebook runner"


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150, "README.md grew past 150 lines: move reference text to docs/"
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert local, "README.md links to no page of the repository"
    missing = [t for t in local if t != "CITATION.cff" and not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    # the two commands of a clone; .ci/run is the README's test command
    assert "bash scripts/setup.sh" in text and "bash scripts/test.sh" in text
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    for page in ("usage", "guarantees", "cluster", "extending", "method", "results", "benchmarks", "design"):
        assert f"docs/{page}.md" in text, f"README.md does not link docs/{page}.md"
