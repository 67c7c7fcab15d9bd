"""Which timm attention family a model belongs to, by its class and attributes only (no weights read): the dispatch
predicates the family adapters register with (:mod:`impulsevit.init.relbias`, :mod:`impulsevit.init.rope`) and that
:func:`impulsevit.init.vit_layout.is_vit` uses to step aside for them. A leaf of ``init/``: it imports no other
impulsevit module, so the adapters and the ViT solve can all depend on it without a cycle."""

from __future__ import annotations

from torch import nn

__all__ = ["is_relbias_vit", "is_rope_vit", "is_swinv2"]


def _beit_classes() -> tuple[type, ...]:
    from timm.models.beit import Beit

    return (Beit,)


def _relpos_classes() -> tuple[type, ...]:
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    return (VisionTransformerRelPos,)


def _swinv2_classes() -> tuple[type, ...]:
    from timm.models.swin_transformer_v2 import SwinTransformerV2
    from timm.models.swin_transformer_v2_cr import SwinTransformerV2Cr

    return (SwinTransformerV2, SwinTransformerV2Cr)


def is_relbias_vit(model: nn.Module) -> bool:
    """True for timm ``Beit`` with a relative position bias (shared or per block) and ``VisionTransformerRelPos``."""
    if isinstance(model, _relpos_classes()):
        return True
    if isinstance(model, _beit_classes()):
        return getattr(model, "rel_pos_bias", None) is not None or any(
            getattr(b.attn, "relative_position_bias_table", None) is not None for b in model.blocks)
    return False


def is_swinv2(model: nn.Module) -> bool:
    """True for timm ``SwinTransformerV2`` and ``SwinTransformerV2Cr``."""
    return isinstance(model, _swinv2_classes())


def is_rope_vit(model: nn.Module) -> bool:
    """True for timm ``Eva`` models built with rotary embeddings (``model.rope`` set)."""
    from timm.models.eva import Eva

    return isinstance(model, Eva) and getattr(model, "rope", None) is not None
