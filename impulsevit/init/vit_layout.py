"""Where the pieces of a timm ViT are: :func:`vit_layout` (the attention of each block, width, heads, patch grid, the
patch rows of ``pos_embed``), :func:`is_vit` (the ``vit`` family's ``matches``) and the pseudo-input ``LN0(pe)``.

Read by the ``vit`` family's handlers (:mod:`impulsevit.init.vit`) and by the attention-map diagnostics
(:mod:`impulsevit.init.diagnostics`), which therefore sit beside the family rather than above it. Applies to timm's
``VisionTransformer`` family and any model with a top-level ``blocks`` sequence of timm fused-qkv ``Attention``; refuses
(one-line ``ValueError`` naming the model) separate q/k/v projections, ``qk_norm`` and relative / rotary encodings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from impulsevit.init import impulse
from impulsevit.init.kinds import is_relbias_vit, is_rope_vit

__all__ = ["VitLayout", "vit_layout", "is_vit", "patch_pseudo_input"]


@dataclasses.dataclass
class VitLayout:
    """Where the pieces of a ViT are.

    Attributes:
        model: class name (for messages).
        attn_names: module path of each block's attention (``blocks.3.attn``), in depth order.
        attns: the attention modules.
        dim: embedding width ``D``; ``num_heads`` ``h``; ``head_dim`` ``d``.
        grid: ``(H, W)`` patch grid, or ``None`` if unknown.
        pos_name: ``'pos_embed'`` or ``None`` if the model has no absolute position embedding.
        patch_rows: rows of ``pos_embed[0]`` that belong to patch tokens (the prefix rows are skipped when
            ``no_embed_class`` is false).
        num_prefix: prefix tokens in the sequence (class + register + distillation).
    """

    model: str
    attn_names: list[str]
    attns: list[nn.Module]
    dim: int
    num_heads: int
    head_dim: int
    grid: tuple[int, int] | None
    pos_name: str | None
    patch_rows: slice | None
    num_prefix: int

    @property
    def attn_width(self) -> int:
        """``A = h·d``: the width of the attention's Q, K and V (the rows of each third of ``qkv.weight``)."""
        return self.num_heads * self.head_dim


def _is_fused_attention(m: nn.Module) -> bool:
    qkv, proj = getattr(m, "qkv", None), getattr(m, "proj", None)
    return (
        isinstance(qkv, nn.Linear)
        and isinstance(proj, nn.Linear)
        and isinstance(getattr(m, "num_heads", None), int)
        and isinstance(getattr(m, "head_dim", None), int)
        and qkv.out_features == 3 * m.num_heads * m.head_dim
    )


def is_vit(model: nn.Module) -> bool:
    """True for models with a top-level ``blocks`` container whose blocks have an ``attn`` with a ``qkv`` projection
    (the dispatch test; :func:`vit_layout` then checks every detail and raises with the missing piece).

    BEiT with a relative position bias and ``VisionTransformerRelPos`` are not ViTs here: their logits carry a bias
    table / MLP, which :mod:`impulsevit.init.relbias` writes instead; nor are rotary ``Eva`` models
    (:mod:`impulsevit.init.rope`)."""
    if is_relbias_vit(model) or is_rope_vit(model):
        return False
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module):
        return False
    return any(hasattr(getattr(b, "attn", None), "qkv") for b in blocks.children())


def _check_position_encoding(model: nn.Module, name: str) -> None:
    """Refuse rotary and shared relative position encodings (they change the logits the impulse solve designs)."""
    if getattr(model, "rope", None) is not None:
        raise ValueError(
            f"{name} uses rotary position embeddings (`rope`), which rotate Q and K per token: the designed Q/K "
            "logits would not hold; not supported (build it without rope, or use init 'torch' / 'timm')"
        )
    for shared in ("rel_pos_bias", "shared_rel_pos"):
        if getattr(model, shared, None) is not None:
            raise ValueError(
                f"{name} uses a shared relative position bias (`{shared}`) added to the attention logits; not "
                "supported by the ViT adapter (it needs an absolute `pos_embed` as pseudo-input and plain logits)"
            )


def _block_attention(name: str, index: int, block: nn.Module) -> nn.Module:
    """Block ``index``'s attention, checked: timm's fused-qkv ``Attention`` without a relative position bias or
    ``qk_norm``."""
    attn = getattr(block, "attn", None)
    for rel in ("relative_position_bias_table", "rel_pos"):
        if getattr(attn, rel, None) is not None:
            raise ValueError(
                f"{name}: block {index} attention has a relative position bias (`{rel}`) added to its logits; not "
                "supported by the ViT adapter (it needs an absolute `pos_embed` as pseudo-input and plain logits)"
            )
    if attn is None or not _is_fused_attention(attn):
        raise ValueError(
            f"{name}: block {index} has no timm-style attention with a fused `qkv` Linear (3·heads·head_dim outputs), "
            "`proj`, `num_heads`, `head_dim` — separate q/k/v projections are not supported"
        )
    for norm in ("q_norm", "k_norm"):
        if not isinstance(getattr(attn, norm, nn.Identity()), nn.Identity):
            raise ValueError(f"{name}: block {index} uses {norm} (qk_norm=True), which would undo the designed Q/K")
    return attn


def _token_grid(model: nn.Module, grid: Sequence[int] | None) -> tuple[int, int] | None:
    """``(H, W)``: the ``grid`` override if given (checked), else ``patch_embed.grid_size``, else ``None``."""
    if grid is None:
        grid_size = getattr(getattr(model, "patch_embed", None), "grid_size", None)
        return (int(grid_size[0]), int(grid_size[1])) if grid_size is not None and len(grid_size) == 2 else None
    if len(grid) != 2 or min(grid) < 1:
        raise ValueError(f"grid must be (H, W) with positive ints, got {grid!r}")
    return int(grid[0]), int(grid[1])


def _pos_embed_patch_rows(
    model: nn.Module, name: str, pos: torch.Tensor | None, grid: tuple[int, int] | None, dim: int, num_prefix: int
) -> slice:
    """The rows of ``pos_embed[0]`` that belong to the patch tokens, after checking that there is an absolute
    ``(1, L, D)`` position embedding with one row per patch of the known ``grid`` (plus the prefix rows unless
    ``no_embed_class``)."""
    if pos is None:
        raise ValueError(
            f"{name} has no absolute position embedding (`pos_embed` is None / pos_embed='none'); impulse init "
            "uses it as the pseudo-input"
        )
    if grid is None:
        raise ValueError(f"{name}: unknown token grid (no `patch_embed.grid_size`); pass the option grid=(H, W)")
    if pos.dim() != 3 or pos.shape[0] != 1 or pos.shape[2] != dim:
        raise ValueError(f"{name}.pos_embed must be (1, L, {dim}), got {tuple(pos.shape)}")
    n = grid[0] * grid[1]
    embed_prefix = 0 if getattr(model, "no_embed_class", False) else num_prefix
    if pos.shape[1] != n + embed_prefix:
        raise ValueError(
            f"{name}.pos_embed has {pos.shape[1]} rows, expected {n} patch tokens of the {grid[0]}x{grid[1]} "
            f"grid + {embed_prefix} prefix rows"
        )
    return slice(embed_prefix, embed_prefix + n)


def vit_layout(model: nn.Module, *, need_pos_embed: bool, grid: Sequence[int] | None = None) -> VitLayout:
    """Locate blocks, attention, prefix tokens, pos_embed rows and the token grid of a timm ViT.

    Args:
        need_pos_embed: require an absolute ``pos_embed`` and a grid (``impulse``); ``mimetic`` does not.
        grid: ``(H, W)`` override when ``patch_embed.grid_size`` is absent.

    Raises:
        ValueError: naming the model class and the missing / unsupported piece.
    """
    name = type(model).__name__
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module) or len(list(blocks.children())) == 0:
        raise ValueError(f"{name} has no transformer `blocks`: not a timm VisionTransformer")
    _check_position_encoding(model, name)
    attns = [_block_attention(name, i, block) for i, block in enumerate(blocks.children())]
    attn_names = [f"blocks.{i}.attn" for i in range(len(attns))]
    h, d = attns[0].num_heads, attns[0].head_dim
    dim = attns[0].qkv.in_features
    if any((a.num_heads, a.head_dim, a.qkv.in_features) != (h, d, dim) for a in attns):
        raise ValueError(f"{name}: blocks differ in heads / head_dim / width; not supported")
    num_prefix = int(getattr(model, "num_prefix_tokens", 1 if getattr(model, "cls_token", None) is not None else 0))
    token_grid = _token_grid(model, grid)
    pos = getattr(model, "pos_embed", None)
    pos = pos if isinstance(pos, torch.Tensor) else None
    patch_rows = _pos_embed_patch_rows(model, name, pos, token_grid, dim, num_prefix) if need_pos_embed else None
    pos_name = "pos_embed" if pos is not None else None
    return VitLayout(name, attn_names, attns, dim, h, d, token_grid, pos_name, patch_rows, num_prefix)


def patch_pseudo_input(pos_embed: torch.Tensor, rows: slice, eps: float = 1e-5) -> torch.Tensor:
    """``P = LN0(pe)``: the patch rows of a ``(1, L, D)`` position embedding, layer-normed, float64 ``(N, D)``."""
    return impulse.layer_norm_rows(pos_embed[0, rows].to(torch.float64), eps)
