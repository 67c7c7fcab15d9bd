"""A recipe block (a mapping of a LightningCLI config) as its typed dataclass, one key check for every block: the
model's (:mod:`impulsevit.training.config`) and the data's (:mod:`impulsevit.data.loading.config`). A leaf, so both
layers use it."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["as_config"]


def as_config(cls: type, value: Any, key: str, section: str = "model") -> Any:
    """``value`` as a ``cls`` dataclass: ``None`` gives the defaults, a mapping is checked key by key.

    ``section`` is the recipe section the block belongs to (``model``, ``data``); messages name ``section.key``.

    Raises:
        TypeError: a mapping with keys that ``cls`` does not have (the message names ``key`` and the valid keys).
    """
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise TypeError(f"unknown key(s) {unknown} in {section}.{key}; valid keys: {sorted(names)}")
        return cls(**value)
    raise TypeError(f"{section}.{key} must be a mapping or {cls.__name__}, got {type(value).__name__}")
