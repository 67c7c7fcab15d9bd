"""The module paths of before the regroup into layer folders (issue #34), kept importable: ``impulsevit.module``,
``impulsevit.config``, ``impulsevit.export``, ... resolve to the very same module objects as their new paths
(``impulsevit.training.module``, ...), so users' imports, recipes' and old runs' ``class_path`` strings and
``mock.patch`` targets keep working. One :class:`DeprecationWarning` per old name names the new path.

A leaf (no impulsevit imports at module level); installed once by ``impulsevit/__init__.py``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    **{f"impulsevit.{m}": f"impulsevit.training.{m}" for m in (
        "backbone", "checkpointing", "config", "datainfo", "ema", "loss", "metrics", "module", "optim", "sharding",
        "strategies", "trackers")},
    **{f"impulsevit.{m}": f"impulsevit.run.{m}" for m in ("preflight", "recipes", "rundir", "runs")},
    **{f"impulsevit.{m}": f"impulsevit.tools.{m}" for m in ("export", "predict", "preview")},
    "impulsevit.extensions": "impulsevit.cli.extensions",
    "impulsevit.cluster.submit": "impulsevit.cli.submit",
    "impulsevit.cluster.convert_job": "impulsevit.cli.convert_job",
    "impulsevit.data.storage.locking": "impulsevit.data.locking",
}
"""Old dotted module name -> its module's name now."""


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path is an alias)",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module was executed once, under its new name."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds an old name of :data:`MOVED` and loads it as the module of its new name (the same object)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader())


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
