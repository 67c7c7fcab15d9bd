"""The registry of built-in init methods: ``register`` (the decorator family modules use), ``methods`` and
``supports``, and :class:`InitResult`, what a handler returns.

It sits below :mod:`impulsevit.init.api` (which dispatches through it) and :mod:`impulsevit.init.plugins` (which
resolves names against it), so neither imports the other back. The built-in family modules are imported on first use
(:func:`_load_builtin`) so their ``@register`` calls run.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["Handler", "InitResult", "methods", "register", "supports"]


@dataclasses.dataclass
class InitResult:
    """What a handler returns: resolved options, per-layer per-head offsets ``(dy, dx)`` (empty when the method has
    none) and free-form notes (e.g. "sin-cos pseudo-input: rank truncated to 23")."""

    options: dict[str, Any]
    offsets: list[list[tuple[int, int]]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


Handler = Callable[[nn.Module, torch.Generator, dict[str, Any]], InitResult]


@dataclasses.dataclass(frozen=True)
class _Entry:
    method: str
    family: str
    matches: Callable[[nn.Module], bool]
    handler: Handler


_REGISTRY: list[_Entry] = []


def register(method: str, *, family: str, matches: Callable[[nn.Module], bool]) -> Callable[[Handler], Handler]:
    """Decorator registering ``handler`` for ``method`` on models where ``matches(model)`` is true."""

    def deco(fn: Handler) -> Handler:
        _REGISTRY.append(_Entry(method, family, matches, fn))
        return fn

    return deco


def methods() -> dict[str, list[str]]:
    """Registered methods and, for each, the families it supports (in dispatch order)."""
    _load_builtin()
    out: dict[str, list[str]] = {}
    for e in _REGISTRY:
        out.setdefault(e.method, []).append(e.family)
    return out


_LOADED = False


def _load_builtin() -> None:
    """Import the built-in family modules so their ``@register`` calls run (idempotent)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for name in ("vit", "baselines", "weight_selection", "swin", "mixer", "convmixer"):
        importlib.import_module(f"impulsevit.init.{name}")


def supports(model: nn.Module, method: str) -> bool:
    """Whether a registered handler of ``method`` applies to ``model`` (its family matches), without running it."""
    _load_builtin()
    return any(e.method == method and e.matches(model) for e in _REGISTRY)
