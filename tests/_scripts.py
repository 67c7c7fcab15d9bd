"""Load a repository script (``benchmarks/``, ``scripts/``, or a file such as ``tests/conftest.py``) as a module, so a
test can call its functions: these files are not in a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """The module defined by the file ``path`` (relative to the repository root, or absolute), executed once per call
    under ``name`` (default: the file's stem); not added to ``sys.modules``."""
    path = REPO / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
