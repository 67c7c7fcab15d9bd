"""Resolving and checking a recipe's ``model.init.method`` before any model exists, and ``impulsevit init list``.

The one way to add an init method is a handler registered with ``@impulsevit.init.register(method, family=...,
matches=..., options=<frozen dataclass>)`` in a module that is imported: by you (Python), or by ``impulsevit`` as a
plugin module (``--plugins``, ``IMPULSEVIT_PLUGINS``, an entry point of the group ``impulsevit.plugins`` whose value is
the module; :mod:`impulsevit.cli.extensions`). Such a method is a name in the registry like a built-in one, and
:func:`resolve_method` only looks it up (:func:`impulsevit.init.registry.methods`).

Deprecated, removed in 0.3.0 (each use warns with a ``DeprecationWarning`` naming the replacement):

* an import path ``module:function`` as the method (``my_pkg.inits:my_init``);
* an entry point of the group ``impulsevit.plugins`` whose value names a *function* (``my_init =
  my_pkg.inits:my_init``) rather than a module;
* the entry-point group ``impulsevit.initializers``.

Such a function ``fn(model, generator, *, opt=default, ...) -> None | InitResult`` is wrapped into a registered handler
(family ``plugin``, any model) whose options schema comes from its keyword parameters
(:func:`impulsevit.init.options.schema_from_signature`), so its options are checked by the same
:func:`~impulsevit.init.options.parse_options`. Every failure is a one-line ``ValueError`` / ``TypeError`` naming the
method string and what was expected. ``impulsevit init list`` (:func:`main`) prints every method with its source.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from impulsevit.argparser import ArgumentParser
from impulsevit.init.options import as_dict, known_keys, parse_options, schema_from_signature, unknown_keys_message
from impulsevit.init.registry import REMOVAL_VERSION, InitResult, add_function, methods, origins, schemas

__all__ = ["ENTRY_POINT_GROUP", "LEGACY_GROUP", "MethodInfo", "check_init_method", "resolve_method", "list_methods",
           "is_import_path", "main"]

ENTRY_POINT_GROUP = "impulsevit.plugins"
"""The project's one entry-point group: its value is a plugin module (a value ``module:function``, an init function, is
deprecated and read until 0.3.0)."""
LEGACY_GROUP = "impulsevit.initializers"
"""The former init-function group, read with a ``DeprecationWarning`` until 0.3.0; ``impulsevit.plugins`` wins a
name."""

_HOW = ("register a handler with @impulsevit.init.register(method, family=..., matches=..., options=...) in a module "
        "and import it (impulsevit --plugins MODULE, IMPULSEVIT_PLUGINS, or an impulsevit.plugins entry point whose "
        "value is the module)")


def _deprecated(what: str) -> None:
    warnings.warn(f"{what} is deprecated and will be removed in impulsevit {REMOVAL_VERSION}: {_HOW}",
                  DeprecationWarning, stacklevel=4)


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
    """The init-function entry points: those of :data:`ENTRY_POINT_GROUP` naming a function, then those of
    :data:`LEGACY_GROUP` (a name taken by the first group is skipped)."""
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.attr]
    legacy = [ep for ep in importlib.metadata.entry_points(group=LEGACY_GROUP) if ep.name not in {e.name for e in eps}]
    if legacy:
        warnings.warn(f"entry-point group {LEGACY_GROUP!r} is deprecated ({', '.join(e.name for e in legacy)}) and "
                      f"will be removed in impulsevit {REMOVAL_VERSION}: {_HOW}", DeprecationWarning, stacklevel=3)
    return eps + legacy


def _ep_source(ep: importlib.metadata.EntryPoint) -> str:
    dist = ep.dist
    who = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
    legacy = ", deprecated group " + LEGACY_GROUP if ep.group == LEGACY_GROUP else ""
    return f"entry point of {who} ({ep.value}{legacy})"


def _check_callable(method: str, source: str, fn: Any) -> None:
    """``fn`` is a function that takes ``(model, generator)`` positionally (its options are checked by schema)."""
    if not callable(fn):
        raise ValueError(f"init method {method!r} ({source}) is a {type(fn).__name__}, expected a function "
                         "fn(model, generator, **options)")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: accept, the call will tell
        return
    try:
        sig.bind_partial(object(), object())
    except TypeError as e:
        raise ValueError(
            f"init method {method!r} ({source}): {getattr(fn, '__qualname__', fn)}{sig} cannot be called as "
            f"fn(model, generator, **options): {e}"
        ) from None


def _wrap(method: str, fn: Callable[..., Any], source: str) -> Callable[..., InitResult]:
    """The registered handler of a plugin function: ``fn(model, generator, **options)`` with the parsed options, its
    result checked (``None`` reports the options as given) and its source added to the notes."""

    def handler(model: Any, generator: Any, options: Any) -> InitResult:
        kwargs = as_dict(options)
        result = fn(model, generator, **kwargs)
        if result is None:
            result = InitResult(options=kwargs)
        elif not isinstance(result, InitResult):
            raise TypeError(f"init method {method!r} ({source}) returned {type(result).__name__}; expected None or "
                            "impulsevit.init.InitResult")
        return InitResult(options=result.options, offsets=result.offsets,
                          notes=[f"plugin from {source}", *result.notes])

    handler.__qualname__ = f"plugin:{method}"
    return handler


def _register_function(method: str, fn: Any, source: str) -> MethodInfo:
    """Check ``fn`` and wrap it into a registered handler (family ``plugin``) whose schema is its signature."""
    _check_callable(method, source, fn)
    add_function(method, _wrap(method, fn, source), schema_from_signature(fn, method), source)
    return MethodInfo(method, "plugin", (), source, fn)


def _check_options(info: MethodInfo, options: Mapping[str, Any] | None) -> None:
    """``options`` against a resolved method: a plugin's against its signature's schema (names, types), a built-in's
    names against its family handlers' schemas (types and values once the model's family is known)."""
    if info.kind == "plugin":
        parse_options(schema_from_signature(info.function, info.name), dict(options or {}), method=info.name,
                      family="plugin")
    else:
        _check_family_keys(info.name, options)


def _check_family_keys(method: str, options: Mapping[str, Any] | None) -> None:
    """Before any model exists: every option key is one some family handler of ``method`` takes (with a hint for a
    misspelt one). Types and values are checked once the model's family is known (``parse_options``)."""
    if not options:
        return
    valid: set[str] = set()
    for schema in schemas(method).values():
        keys = known_keys(schema)
        if keys is None:  # a handler that takes any keys
            return
        valid.update(keys)
    message = unknown_keys_message(options, sorted(valid), repr(method))
    if message:
        raise TypeError(message)


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
            ``(model, generator)`` — one line naming ``method``.
        TypeError: an option no handler of ``method`` takes (with the closest valid name), or for a plugin an option
            of the wrong type.
    """
    if not isinstance(method, str) or not method:
        raise ValueError(f"init method must be a non-empty string, got {method!r}")
    builtin = methods()
    if method in builtin:
        where = list(dict.fromkeys("builtin" if m.startswith("impulsevit.") else f"registered by {m}"
                                   for m in origins(method)))
        kind = "builtin" if "builtin" in where else "registered"
        info = MethodInfo(method, kind, tuple(builtin[method]), " + ".join(where))
    elif is_import_path(method):
        _deprecated(f"init method {method!r}: an import path 'module:function' as model.init.method")
        info = _register_function(method, _load_import_path(method), "import path")
    elif eps := [ep for ep in _entry_points() if ep.name == method]:
        ep, source = eps[0], _ep_source(eps[0])
        try:
            fn = ep.load()
        except Exception as e:  # noqa: BLE001 - any failure of third-party code at import is reported the same way
            raise ValueError(f"init method {method!r} ({source}) cannot be loaded: {type(e).__name__}: {e}") from None
        _deprecated(f"init method {method!r} ({source}): an entry point naming a function")
        info = _register_function(method, fn, source)
    else:
        info = None
    if info is not None:
        _check_options(info, options)
        return info
    plugins = sorted({ep.name for ep in _entry_points()} - set(builtin))
    extra = f"; entry points ({ENTRY_POINT_GROUP}): {', '.join(plugins)}" if plugins else ""
    raise ValueError(f"unknown init method {method!r}; available: {', '.join(sorted(builtin))}{extra}; or a method "
                     "a plugin module registers (impulsevit --plugins MODULE)")


def check_init_method(method: str, options: Mapping[str, Any] | None = None) -> None:
    """The one check of a recipe's ``model.init.method``: it resolves (:func:`resolve_method`).

    Called by the CLI before any class is built (so before the data is instantiated or prepared) and by
    ``ImageClassifier.__init__`` for the Python API; nothing downstream checks the method again (the initializer's
    dispatch only looks it up).

    Raises:
        ConfigError: one line naming the key (``model.init.method`` or ``model.init.options``), the bad value and
            what was expected.
    """
    from impulsevit.errors import ConfigError

    try:
        info = resolve_method(method)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model.init.method: {e}") from None
    try:
        _check_options(info, options)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model.init.options: {e}") from None


def list_methods(extra: Sequence[str] = ()) -> list[tuple[MethodInfo | None, str, str]]:
    """Every built-in method, every init-function entry point (:func:`_entry_points`) and each of ``extra`` (import
    paths).

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
    parser = ArgumentParser(prog="impulsevit init", description="initializers: built-in and registered by "
                            "plugin modules (impulsevit --plugins MODULE, IMPULSEVIT_PLUGINS, entry-point "
                            f"group {ENTRY_POINT_GROUP}); deprecated until {REMOVAL_VERSION}: function entry "
                            "points and import paths")
    sub = parser.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="list the init methods with their source")
    lst.add_argument("methods", nargs="*", metavar="module:function", help="import paths to resolve and show too")
    args = parser.parse_args(list(argv) if argv is not None else None)
    rows = list_methods(args.methods)
    print(format_methods(rows))
    failed = {name for info, name, _ in rows if info is None}
    return 1 if failed & set(args.methods) else 0
