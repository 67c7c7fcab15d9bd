"""The registry of init methods: ``register`` (the one decorator, for the built-in families and a plugin's alike),
``find`` (what ``initialize`` dispatches to), ``methods`` and ``supports``, and :class:`InitResult`, what a handler
returns.

It imports no family: it sits below :mod:`impulsevit.init.api` and :mod:`impulsevit.init.plugins`, and below every
family module, which registers its handlers when it is imported. The built-in families are imported by the package,
``impulsevit/init/__init__.py``, which lists them (``BUILTIN_FAMILIES``; as timm's ``timm/models/__init__.py`` lists
its model modules): any import of ``impulsevit.init`` or of one of its modules has registered them, before a plugin
module (which imports ``impulsevit.init.register``) can add its own, so the built-ins come first in dispatch.
``tests/house/test_layers.py`` (``test_every_registering_module_is_a_listed_builtin_family``) checks that every module
of the package calling ``@register`` is in that list and that this module imports nothing at run time.
"""

from __future__ import annotations

import dataclasses
import warnings
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
the schema the handler registered (:mod:`impulsevit.init.options`; the ``dict`` given for one registered with
:data:`~impulsevit.init.options.OPEN`)."""

REMOVAL_VERSION = "0.3.0"
"""The release that removes the deprecated routes (a handler registered without ``options=``, an init method given as a
``module:function`` import path or as a function entry point, the entry-point group ``impulsevit.initializers``)."""

_UNSET: Any = object()


@dataclasses.dataclass(frozen=True)
class _Entry:
    method: str
    family: str
    matches: Callable[[nn.Module], bool]
    handler: Handler
    options: type | None
    source: str  # "" for handlers registered by a module's @register; the plugin's origin for wrapped functions


_REGISTRY: list[_Entry] = []


def register(method: str, *, family: str, matches: Callable[[nn.Module], bool],
             options: type | None = _UNSET) -> Callable[[Handler], Handler]:
    """Decorator registering ``handler(model, generator, options) -> InitResult`` for ``method`` on models where
    ``matches(model)`` is true.

    Args:
        method: the name a recipe gives as ``model.init.method``.
        family: the model family the handler adapts (shown by ``impulsevit init list`` and the report).
        matches: whether the handler applies to a model (no side effects; called on meta-device models too).
        options: the handler's options schema, a frozen dataclass (:mod:`impulsevit.init.options`): the user's
            options are checked against it in one place and reach the handler as an instance of it
            (:class:`~impulsevit.init.options.NoOptions` takes none;
            :data:`~impulsevit.init.options.OPEN` any keys, as a ``dict``, for a handler that refuses whatever it is
            given). Omitting it is deprecated (``DeprecationWarning``; an error from 0.3.0): the options then reach
            the handler unchecked, as the ``dict`` given.

    ``initialize`` runs the first registered handler of ``method`` whose ``matches`` is true; the built-in families
    are registered by ``import impulsevit.init``, before any plugin module can add a handler, so they come first."""
    if options is _UNSET:
        warnings.warn(f"@register({method!r}, family={family!r}) without options= (the options as an unchecked dict) "
                      f"is deprecated and will be removed in impulsevit {REMOVAL_VERSION}: give the handler's options "
                      "as a frozen dataclass (impulsevit.init.options.NoOptions for none)", DeprecationWarning,
                      stacklevel=2)
        options = None

    def deco(fn: Handler) -> Handler:
        _REGISTRY.append(_Entry(method, family, matches, fn, options, ""))
        return fn

    return deco


def add_function(method: str, handler: Handler, options: type | None, source: str) -> None:
    """Register a wrapped plugin function (:mod:`impulsevit.init.plugins`) as the handler of ``method`` for any model
    (family ``plugin``); idempotent per method name. Not listed by :func:`methods`, which lists the families'
    handlers."""
    if not any(e.method == method for e in _REGISTRY):
        _REGISTRY.append(_Entry(method, "plugin", lambda m: True, handler, options, source))


def find(method: str, model: nn.Module) -> _Entry | None:
    """The handler entry ``initialize`` dispatches ``method`` on ``model`` to: the first registered one whose
    ``matches(model)`` is true (``None`` when none does)."""
    return next((e for e in _REGISTRY if e.method == method and e.matches(model)), None)


def schemas(method: str) -> dict[str, type | None]:
    """The options schema of each family handler of ``method`` (dispatch order)."""
    return {e.family: e.options for e in _REGISTRY if e.method == method and not e.source}


def origins(method: str) -> list[str]:
    """The modules whose handlers registered ``method`` (in dispatch order, without repeats)."""
    return list(dict.fromkeys(e.handler.__module__ for e in _REGISTRY if e.method == method and not e.source))


def methods() -> dict[str, list[str]]:
    """Methods registered by family modules (``@register``) and, for each, the families it supports (in dispatch
    order). Plugin functions (:func:`add_function`) are not listed: ``impulsevit init list`` shows them by source."""
    out: dict[str, list[str]] = {}
    for e in _REGISTRY:
        if not e.source:
            out.setdefault(e.method, []).append(e.family)
    return out


def supports(model: nn.Module, method: str) -> bool:
    """Whether a registered handler of ``method`` applies to ``model`` (its family matches), without running it."""
    return any(e.method == method and e.matches(model) for e in _REGISTRY if not e.source)
