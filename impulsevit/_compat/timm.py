"""timm private members impulsevit uses (see :mod:`impulsevit._compat`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["module_init_fn", "model_card_readme", "swin_relative_position_bias"]


def module_init_fn(model: nn.Module) -> Callable[[nn.Module], None] | None:
    """The per-module init function of a timm model that has no public ``init_weights`` (``model.apply(fn)`` runs
    timm's own init), or None when the model has none.

    Reaches: ``_init_weights`` of timm's models (``VisionTransformer._init_weights``, ...)
    Checked on: timm>=1.0.20,<1.1
    Waits for: ``init_weights()`` on every timm model (most have it; the older ones only have ``_init_weights``).
    """
    fn = getattr(model, "_init_weights", None)
    return fn if callable(fn) else None


def swin_relative_position_bias(attn: nn.Module) -> torch.Tensor:
    """The relative-position bias a timm Swin ``WindowAttention`` adds to its attention logits: ``(1, heads, n, n)``
    for ``n = window_h·window_w`` tokens of one window (before the shift mask).

    Reaches: ``timm.models.swin_transformer.WindowAttention._get_rel_pos_bias``
    Checked on: timm>=1.0.20,<1.1
    Waits for: a public accessor of the bias (timm reads it only inside ``forward``).
    """
    return attn._get_rel_pos_bias()


def model_card_readme(model_card: dict[str, Any], model_name: str) -> str:
    """The Hugging Face Hub README text timm writes for ``model_card`` (``description``, ``details``, ``citation``,
    ...), for a model folder named ``model_name``.

    Reaches: ``timm.models._hub.generate_readme``
    Checked on: timm>=1.0.20,<1.1
    Waits for: a public export of the README writer (timm writes it only inside ``push_to_hf_hub``, which uploads).
    """
    from timm.models._hub import generate_readme

    return generate_readme(model_card, model_name)
