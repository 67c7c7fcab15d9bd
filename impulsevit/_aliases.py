"""The module paths of before the regroup into layer folders (issue #34), read where old names are stored: inside
:func:`old_module_paths`, ``impulsevit.module``, ``impulsevit.config``, ``impulsevit.export``, ... resolve to the very
same module objects as their new paths (``impulsevit.training.module``, ...). It is entered where impulsevit reads
names a file stored: the command line's parse and instantiation (``class_path`` strings of recipes, of the
``config.yaml`` of old runs, and of the command line: :class:`impulsevit.cli.trainer_cli.ImpulseCLI`) and the
unpickling of a trusted checkpoint (:func:`impulsevit.safe_load.load_checkpoint`). Outside it, an old path is not
importable: ``import impulsevit`` changes nothing in ``sys.meta_path`` (Lightning likewise keeps its renamed-module
shim to checkpoint loading). Each old name read gives one :class:`DeprecationWarning` naming the new path and
:data:`REMOVED_IN`, the version that drops these aliases.

A leaf (no impulsevit imports).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Iterator
from types import ModuleType

__all__ = ["MOVED", "REMOVED_IN", "old_module_paths"]

REMOVED_IN = "0.3.0"
"""The impulsevit version that no longer reads the old module paths."""

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
        warnings.warn(f"{spec.name} moved to {new}; write {new} (the old path is read from recipes, config.yaml "
                      f"class_path strings and checkpoints until impulsevit {REMOVED_IN}, which removes it)",
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


_FINDER = _AliasFinder()
_lock = threading.Lock()
_depth = 0


@contextlib.contextmanager
def old_module_paths() -> Iterator[None]:
    """Within the block, the old module paths of :data:`MOVED` import as their modules (a finder first on
    ``sys.meta_path``); nested and concurrent blocks share one finder, removed when the last one ends. A module
    imported under an old name stays in ``sys.modules`` under it afterwards (it is the same object)."""
    global _depth
    with _lock:
        if _depth == 0:
            sys.meta_path.insert(0, _FINDER)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)
