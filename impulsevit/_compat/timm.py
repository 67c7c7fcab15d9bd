"""timm private members impulsevit uses (see :mod:`impulsevit._compat`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["fix_timm_posterize", "module_init_fn", "model_card_readme", "swin_relative_position_bias",
           "vit_tokens_before_blocks"]


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


def vit_tokens_before_blocks(vit: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """What a timm ``VisionTransformer`` feeds its first block for ``images`` ``(n, C, H, W)``: the patch embedding,
    the prefix tokens and the position embedding, patch dropout and ``norm_pre`` — ``forward_features`` up to
    ``blocks`` — as ``(n, L, D)``. Runs in the model's current mode (call it in eval mode for no dropout).

    Reaches: ``timm.models.vision_transformer.VisionTransformer._pos_embed``
    Checked on: timm>=1.0.20,<1.1
    Waits for: a public timm call for the token sequence before the blocks.
    """
    return vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(images))))


def model_card_readme(model_card: dict[str, Any], model_name: str) -> str:
    """The Hugging Face Hub README text timm writes for ``model_card`` (``description``, ``details``, ``citation``,
    ...), for a model folder named ``model_name``.

    Reaches: ``timm.models._hub.generate_readme``
    Checked on: timm>=1.0.20,<1.1
    Waits for: a public export of the README writer (timm writes it only inside ``push_to_hf_hub``, which uploads).
    """
    from timm.models._hub import generate_readme

    return generate_readme(model_card, model_name)


def _posterize_at_least_1bit(img, bits_to_keep, **kwargs):  # noqa: ANN001, ANN202 - timm op signature
    from timm.data.auto_augment import posterize

    return posterize(img, max(1, int(bits_to_keep)), **kwargs)


def fix_timm_posterize(transform) -> None:  # noqa: ANN001 - timm RandAugment or a Compose holding one
    """Pillow >= 11 rejects ``posterize(bits=0)``, which timm's ``PosterizeIncreasing`` requests at magnitude 10
    (reachable with ``m9-mstd0.5``, then the PIL pipeline raises): make the RandAugment ops in ``transform`` keep at
    least 1 bit, as :class:`impulsevit.data.augment.rand_augment.BatchRandAugment` does. Modifies the given objects
    only, not timm.

    Reaches: ``timm.data.auto_augment.AugmentOp.aug_fn`` of the Posterize ops (replaced on the given ``RandAugment``)
    Checked on: timm>=1.0.20,<1.1
    Waits for: timm clamping posterize's bits to >= 1 itself (Pillow >= 11 refuses 0).
    """
    from timm.data.auto_augment import RandAugment

    for t in [transform, *getattr(transform, "transforms", [])]:
        if isinstance(t, RandAugment):
            for op in t.ops:
                if op.name.startswith("Posterize"):
                    op.aug_fn = _posterize_at_least_1bit
