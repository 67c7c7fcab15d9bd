"""Plugins: the user's modules that register datasets (``impulsevit.data.register_dataset``) or init families and
methods (``impulsevit.init.register``), imported when the ``impulsevit`` command starts.

A plugin is a module; importing it runs its registrations. ``impulsevit`` imports, in this order and once each:

* every entry point of the group ``impulsevit.plugins`` of an installed distribution (its value names the module:
  ``[options.entry_points] impulsevit.plugins = my_data = my_pkg.extras``), as pytest does with ``pytest11``; an
  entry whose value names a function (``my_init = my_pkg.inits:my_init``) is deprecated until 0.3.0
  (:mod:`impulsevit.init.plugins`): its module is imported here, the function is looked up when a recipe names it;
* the modules of ``IMPULSEVIT_PLUGINS`` (comma-separated module names, e.g. ``my_pkg.extras,my_inits``; the module
  must be importable, e.g. on ``PYTHONPATH``);
* the modules of ``--plugins my_pkg.extras[,...]`` anywhere on the command line, which adds them to
  ``IMPULSEVIT_PLUGINS`` so processes the run starts (DDP ranks, SLURM steps, DataLoader workers) import them too.

A module that does not import is one line naming it and where it was named (:class:`~impulsevit.errors.ConfigError`,
exit status 2), before any work. From Python, import the module yourself: registrations are plain calls.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Sequence

from impulsevit.errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "ENV_VAR", "load_plugins", "split_plugins_flag"]

ENTRY_POINT_GROUP = "impulsevit.plugins"  # = impulsevit.init.plugins.ENTRY_POINT_GROUP (not imported: the entry stays
# light, importing no torch before the subcommand is known; tests/init/test_plugins.py checks they agree)
ENV_VAR = "IMPULSEVIT_PLUGINS"


def split_plugins_flag(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` without ``--plugins X`` / ``--plugins=X`` and the module names those gave (``X`` comma-separated).

    Raises:
        ConfigError: ``--plugins`` without a value."""
    rest: list[str] = []
    names: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg == "--plugins" or arg.startswith("--plugins="):
            value = arg.partition("=")[2] if "=" in arg else (items[i + 1] if i + 1 < len(items) else "")
            i += 1 if "=" in arg else 2
            if not value or value.startswith("-"):
                raise ConfigError("--plugins needs a module name (--plugins my_pkg.extras[,other.module])")
            names += [n.strip() for n in value.split(",") if n.strip()]
            continue
        rest.append(arg)
        i += 1
    return rest, names


def load_plugins(extra: Sequence[str] = ()) -> list[str]:
    """Import the plugin modules (module docstring) and return their names in import order. ``extra`` (the
    ``--plugins`` names) is appended to ``IMPULSEVIT_PLUGINS`` in ``os.environ`` for the processes the run starts.

    Raises:
        ConfigError: a module that does not import (not found, or its own code raised any exception while it was
            imported), naming it, where it came from and the exception (``--debug``: its traceback)."""
    current = [n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()]
    wanted: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        who = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an installed distribution"
        wanted.setdefault(ep.module, f"entry point {ep.name!r} of {who} (group {ENTRY_POINT_GROUP})")
    for name in [*current, *extra]:
        wanted.setdefault(name, f"{ENV_VAR} / --plugins")
    for name, where in wanted.items():
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"plugin module {name!r} (from {where}) cannot be imported: {type(e).__name__}: {e} "
                              "(expected an importable module name such as my_pkg.extras; is its folder on "
                              "PYTHONPATH?)") from None
        except Exception as e:  # noqa: BLE001 - the user's module failed while importing: their code, one line
            where_in = _frame_in(e, name)
            raise ConfigError(f"plugin module {name!r} (from {where}) raised {type(e).__name__} while being "
                              f"imported{where_in}: {e} (--debug shows the traceback)") from e
    if extra:  # only modules that imported are handed on: a failed start leaves the environment as it found it
        os.environ[ENV_VAR] = ",".join(dict.fromkeys([*current, *extra]))
    return list(wanted)


def _frame_in(exc: BaseException, module: str) -> str:
    """`` (FILE:LINE)``: the innermost traceback frame of ``exc`` in the plugin ``module``'s own file ('' when none is
    found, e.g. a syntax error, whose message names the line)."""
    mod = sys.modules.get(module)
    tb, found = exc.__traceback__, ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if (mod is not None and code.co_filename == getattr(mod, "__file__", None)) or \
                code.co_filename.replace(os.sep, ".").removesuffix(".py").endswith(module):
            found = f" ({code.co_filename}:{tb.tb_lineno})"
        tb = tb.tb_next
    return found
