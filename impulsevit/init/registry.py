"""The registry of built-in init methods: ``register`` (the decorator family modules use), ``methods`` and
``supports``, and :class:`InitResult`, what a handler returns.

It sits below :mod:`impulsevit.init.api` (which dispatches through it) and :mod:`impulsevit.init.plugins` (which
resolves names against it), so neither imports the other back. The built-in family modules are imported on first use
(:func:`_load_builtin`) so their ``@register`` calls run: every module of the ``impulsevit.init`` package is imported
(there is no list of them), so a new family file with ``@register`` is picked up by being there. Families from outside
the package register from a module ``impulsevit`` imports as a plugin (:mod:`impulsevit.cli.extensions`).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["Handler", "InitResult", "add_function", "find", "methods", "origins", "register", "schemas", "supports"]


@dataclasses.dataclass
class InitResult:
    """What a handler returns: resolved options, per-layer per-head offsets ``(dy, dx)`` (empty when the method has
    none) and free-form notes (e.g. "sin-cos pseudo-input: rank truncated to 23")."""

    options: dict[str, Any]
    offsets: list[list[tuple[int, int]]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


Handler = Callable[[nn.Module, torch.Generator, Any], InitResult]
"""The one handler signature: ``handler(model, generator, options) -> InitResult``, where ``options`` is an instance of
the schema the handler registered (:mod:`impulsevit.init.options`; the ``dict`` given for one registered without)."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    method: str
    family: str
    matches: Callable[[nn.Module], bool]
    handler: Handler
    options: type | None
    source: str  # "" for handlers registered by a module's @register; the plugin's origin for wrapped functions


_REGISTRY: list[_Entry] = []
_PACKAGE = __name__.rpartition(".")[0]  # impulsevit.init: the built-in families are its modules


def register(method: str, *, family: str, matches: Callable[[nn.Module], bool],
             options: type | None = None) -> Callable[[Handler], Handler]:
    """Decorator registering ``handler(model, generator, options) -> InitResult`` for ``method`` on models where
    ``matches(model)`` is true.

    Args:
        method: the name a recipe gives as ``model.init.method``.
        family: the model family the handler adapts (shown by ``impulsevit init list`` and the report).
        matches: whether the handler applies to a model (no side effects; called on meta-device models too).
        options: the handler's options schema, a frozen dataclass (:mod:`impulsevit.init.options`): the user's
            options are checked against it in one place and reach the handler as an instance of it
            (:class:`~impulsevit.init.options.NoOptions` takes none). Without one (``None``, the default, as
            handlers written before schemas existed) the options reach the handler unchecked, as the ``dict`` given.

    ``initialize`` runs the first registered handler of ``method`` whose ``matches`` is true; the built-in families
    are loaded before a handler from outside the package is added, so they come first."""

    def deco(fn: Handler) -> Handler:
        if not fn.__module__.startswith(_PACKAGE + "."):  # a built-in one is being loaded by its module's import
            _load_builtin()
        _REGISTRY.append(_Entry(method, family, matches, fn, options, ""))
        return fn

    return deco


def add_function(method: str, handler: Handler, options: type | None, source: str) -> None:
    """Register a wrapped plugin function (:mod:`impulsevit.init.plugins`) as the handler of ``method`` for any model
    (family ``plugin``); idempotent per method name. Not listed by :func:`methods`, which lists the families'
    handlers."""
    _load_builtin()
    if not any(e.method == method for e in _REGISTRY):
        _REGISTRY.append(_Entry(method, "plugin", lambda m: True, handler, options, source))


def find(method: str, model: nn.Module) -> _Entry | None:
    """The handler entry ``initialize`` dispatches ``method`` on ``model`` to: the first registered one whose
    ``matches(model)`` is true (``None`` when none does)."""
    _load_builtin()
    return next((e for e in _REGISTRY if e.method == method and e.matches(model)), None)


def schemas(method: str) -> dict[str, type | None]:
    """The options schema of each family handler of ``method`` (dispatch order)."""
    _load_builtin()
    return {e.family: e.options for e in _REGISTRY if e.method == method and not e.source}


def origins(method: str) -> list[str]:
    """The modules whose handlers registered ``method`` (in dispatch order, without repeats)."""
    _load_builtin()
    return list(dict.fromkeys(e.handler.__module__ for e in _REGISTRY if e.method == method and not e.source))


def methods() -> dict[str, list[str]]:
    """Methods registered by family modules (``@register``) and, for each, the families it supports (in dispatch
    order). Plugin functions (:func:`add_function`) are not listed: ``impulsevit init list`` shows them by source."""
    _load_builtin()
    out: dict[str, list[str]] = {}
    for e in _REGISTRY:
        if not e.source:
            out.setdefault(e.method, []).append(e.family)
    return out


_LOADED = False


def _load_builtin() -> None:
    """Import every module of the ``impulsevit.init`` package (found with ``pkgutil``, in name order) so the
    ``@register`` calls of the family modules run (idempotent)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    modules = pkgutil.iter_modules(importlib.import_module(_PACKAGE).__path__)
    for module in sorted(modules, key=lambda m: m.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{_PACKAGE}.{module.name}")


def supports(model: nn.Module, method: str) -> bool:
    """Whether a registered handler of ``method`` applies to ``model`` (its family matches), without running it."""
    _load_builtin()
    return any(e.method == method and e.matches(model) for e in _REGISTRY if not e.source)
