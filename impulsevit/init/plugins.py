"""Initializers from outside the package: import paths and installed plugins, resolved and validated up front.

A recipe's ``model.init.method`` is one of

* a built-in method name (``impulse``, ``mimetic``, ``torch``, ``timm``, ``weight_selection``, ``box``, ``random``);
* the name of an entry point in the group ``impulsevit.initializers`` of an installed distribution
  (``[options.entry_points] impulsevit.initializers = my_init = my_pkg.inits:my_init``);
* an import path ``module:function`` (``my_pkg.inits:my_init``; the module must be importable, e.g. on
  ``PYTHONPATH``).

A plugin function has the signature ``fn(model: nn.Module, generator: torch.Generator, **options) -> None |
InitResult``: it initialises ``model`` in place, draws its random numbers from ``generator`` (so every rank computes
the same weights) and may return an :class:`~impulsevit.init.api.InitResult` with resolved options, offsets and notes.
Built-in names win over entry points of the same name (the listing marks those as shadowed).

:func:`resolve_method` checks, without touching a model, that the module imports, the attribute exists and is
callable, and that its signature accepts ``(model, generator, **options)`` for the given options; every failure is a
one-line ``ValueError`` naming the method string and what was expected. ``ImageClassifier`` and the ``Initializer``
callback call it when they are constructed, i.e. before any data is prepared. ``impulsevit init list`` (:func:`main`)
prints every method with its source.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from impulsevit.init.registry import methods, origins

__all__ = ["ENTRY_POINT_GROUP", "MethodInfo", "check_init_method", "resolve_method", "list_methods", "is_import_path",
           "main"]

ENTRY_POINT_GROUP = "impulsevit.initializers"


@dataclasses.dataclass(frozen=True)
class MethodInfo:
    """One resolvable init method.

    Attributes:
        name: the string a recipe gives as ``model.init.method``.
        kind: ``builtin``, ``registered`` (``@register`` in a plugin module, :mod:`impulsevit.cli.extensions`) or
            ``plugin``.
        families: for registered methods, the model families it supports (dispatch order); empty for plugins.
        source: ``builtin``, ``registered by <module>`` (both, joined by `` + ``, when a plugin module adds a family
            to a built-in method), ``entry point <dist> <version> (<module:function>)`` or ``import path``.
        function: the plugin function (``None`` for built-ins).
    """

    name: str
    kind: str
    families: tuple[str, ...]
    source: str
    function: Callable[..., Any] | None = None


def is_import_path(method: str) -> bool:
    """True when ``method`` has the form ``module:function`` (a plugin by import path)."""
    return ":" in method


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _ep_source(ep: importlib.metadata.EntryPoint) -> str:
    dist = ep.dist
    who = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
    return f"entry point of {who} ({ep.value})"


def _check_callable(method: str, source: str, fn: Any, options: Mapping[str, Any] | None) -> None:
    if not callable(fn):
        raise ValueError(f"init method {method!r} ({source}) is a {type(fn).__name__}, expected a function "
                         "fn(model, generator, **options)")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: accept, the call will tell
        return
    try:
        sig.bind(object(), object(), **dict(options or {}))
    except TypeError as e:
        given = f" with options {sorted(options)}" if options else ""
        raise ValueError(
            f"init method {method!r} ({source}): {getattr(fn, '__qualname__', fn)}{sig} cannot be called as "
            f"fn(model, generator, **options){given}: {e}"
        ) from None


def _load_import_path(method: str) -> Callable[..., Any]:
    module_name, _, attr = method.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ValueError(f"init method {method!r}: expected an import path 'module:function' (e.g. "
                         "'my_pkg.inits:my_init')")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"init method {method!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); "
                         "expected an importable 'module:function' (is its directory on PYTHONPATH?)") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"init method {method!r}: module {module_name!r} has no attribute {attr!r}; expected "
                             "'module:function' naming a function fn(model, generator, **options)")
        obj = getattr(obj, part)
    return obj


def resolve_method(method: str, options: Mapping[str, Any] | None = None) -> MethodInfo:
    """Resolve and validate ``method`` (see the module docstring); imports the plugin, touches no model.

    Args:
        method: built-in name, entry-point name or ``module:function``.
        options: the options the method will get; for plugins, checked against the function's signature.

    Raises:
        ValueError: unknown name, import failure, not callable, or a signature that does not accept
            ``(model, generator, **options)`` — one line naming ``method``.
    """
    if not isinstance(method, str) or not method:
        raise ValueError(f"init method must be a non-empty string, got {method!r}")
    builtin = methods()
    if method in builtin:
        where = list(dict.fromkeys("builtin" if m.startswith("impulsevit.") else f"registered by {m}"
                                   for m in origins(method)))
        kind = "builtin" if "builtin" in where else "registered"
        return MethodInfo(method, kind, tuple(builtin[method]), " + ".join(where))
    if is_import_path(method):
        fn = _load_import_path(method)
        _check_callable(method, "import path", fn, options)
        return MethodInfo(method, "plugin", (), "import path", fn)
    eps = [ep for ep in _entry_points() if ep.name == method]
    if eps:
        ep, source = eps[0], _ep_source(eps[0])
        try:
            fn = ep.load()
        except Exception as e:  # noqa: BLE001 - any failure of third-party code at import is reported the same way
            raise ValueError(f"init method {method!r} ({source}) cannot be loaded: {type(e).__name__}: {e}") from None
        _check_callable(method, source, fn, options)
        return MethodInfo(method, "plugin", (), source, fn)
    plugins = sorted({ep.name for ep in _entry_points()} - set(builtin))
    extra = f"; entry points ({ENTRY_POINT_GROUP}): {', '.join(plugins)}" if plugins else ""
    raise ValueError(f"unknown init method {method!r}; available: {', '.join(sorted(builtin))}{extra}; or an import "
                     "path 'module:function'")


def check_init_method(method: str, options: Mapping[str, Any] | None = None) -> None:
    """The one check of a recipe's ``model.init.method``: it resolves (:func:`resolve_method`).

    Called by the CLI before any class is built (so before the data is instantiated or prepared) and by
    ``ImageClassifier.__init__`` for the Python API; nothing downstream checks the method again (the initializer's
    dispatch only looks it up).

    Raises:
        ConfigError: one line naming the key, the bad value and the known methods.
    """
    from impulsevit.errors import ConfigError

    try:
        resolve_method(method, dict(options or {}))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model.init.method: {e}") from None


def list_methods(extra: Sequence[str] = ()) -> list[tuple[MethodInfo | None, str, str]]:
    """Every built-in method, every entry point of ``impulsevit.initializers`` and each of ``extra`` (import paths).

    Returns:
        rows ``(info, name, problem)``: ``info`` is ``None`` when the entry could not be resolved and ``problem`` then
        says why (an entry point shadowed by a built-in is listed with ``problem='shadowed by the built-in'``).
    """
    rows: list[tuple[MethodInfo | None, str, str]] = []
    builtin = methods()
    for name in sorted(builtin):
        rows.append((resolve_method(name), name, ""))
    for ep in sorted(_entry_points(), key=lambda e: e.name):
        if ep.name in builtin:
            rows.append((MethodInfo(ep.name, "plugin", (), _ep_source(ep)), ep.name, "shadowed by the built-in"))
            continue
        try:
            rows.append((resolve_method(ep.name), ep.name, ""))
        except ValueError as e:
            rows.append((None, ep.name, str(e)))
    for name in extra:
        try:
            rows.append((resolve_method(name), name, ""))
        except ValueError as e:
            rows.append((None, name, str(e)))
    return rows


def format_methods(rows: Sequence[tuple[MethodInfo | None, str, str]]) -> str:
    """The table ``impulsevit init list`` prints from :func:`list_methods` rows: name, kind, families, source
    (unresolvable entries as ``error``, with the reason below the table)."""
    table = [("name", "kind", "families", "source")]
    problems = []
    for info, name, problem in rows:
        if info is None:
            table.append((name, "error", "-", "-"))
            problems.append(f"  {name}: {problem}")
            continue
        source = info.source + (f" — {problem}" if problem else "")
        table.append((name, info.kind, ", ".join(info.families) or "any (plugin)", source))
    widths = [max(len(r[i]) for r in table) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3] for r in table]
    if problems:
        lines += ["", "problems:", *problems]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``impulsevit init list [module:function ...]``: list the init methods and where each comes from.

    Exit status 1 when one of the given import paths does not resolve (the reason is printed), else 0."""
    parser = argparse.ArgumentParser(prog="impulsevit init", description="initializers: built-in, registered by "
                                     "plugin modules (impulsevit --plugins), installed plugins (entry-point group "
                                     f"{ENTRY_POINT_GROUP}) and import paths")
    sub = parser.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="list the init methods with their source")
    lst.add_argument("methods", nargs="*", metavar="module:function", help="import paths to resolve and show too")
    args = parser.parse_args(list(argv) if argv is not None else None)
    rows = list_methods(args.methods)
    print(format_methods(rows))
    failed = {name for info, name, _ in rows if info is None}
    return 1 if failed & set(args.methods) else 0
