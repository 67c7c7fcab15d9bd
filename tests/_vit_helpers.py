"""Small timm ViTs and pseudo-input helpers shared by the tests/init/ files (not a test module)."""

from __future__ import annotations

import hashlib
import math

import torch
from timm.models.vision_transformer import VisionTransformer

from impulsevit.init.impulse import layer_norm_rows


def vit(
    img: int | tuple[int, int] = 32,
    patch: int = 4,
    dim: int = 64,
    depth: int = 2,
    heads: int = 4,
    **kw,
) -> VisionTransformer:
    """A small timm ViT built with ``weight_init='skip'`` (as the released recipes do)."""
    kw.setdefault("num_classes", 10)
    return VisionTransformer(
        img_size=img, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads, weight_init="skip", **kw
    )


def vit_grid(grid: int, dim: int, heads: int, depth: int = 1) -> VisionTransformer:
    """A ViT whose token grid is ``grid × grid`` (patch 2), e.g. 14 with D = 192/384/768 for ViT-Ti/S/B geometry."""
    return vit(img=2 * grid, patch=2, dim=dim, depth=depth, heads=heads, num_classes=0, mlp_ratio=1.0)


def pseudo_logits(model: VisionTransformer, layer: int = 0) -> torch.Tensor:
    """Float64 logits ``Λ`` ``(h, N, N)`` of one block on ``P = LN0(pe)`` (no bias), as in docs/method.md §2.6."""
    rows = model.pos_embed.detach()[0, model.num_prefix_tokens if not model.no_embed_class else 0 :]
    p = layer_norm_rows(rows.double())
    attn = model.blocks[layer].attn
    h, d = attn.num_heads, attn.head_dim
    w = attn.qkv.weight.detach().double()
    q = (p @ w[: h * d].T).reshape(-1, h, d).transpose(0, 1)
    k = (p @ w[h * d : 2 * h * d].T).reshape(-1, h, d).transpose(0, 1)
    return q @ k.transpose(1, 2) / math.sqrt(d)


def nan_empty_construction(monkeypatch) -> None:
    """Make ``torch.empty`` return NaN-filled tensors, so a constructor's uninitialized memory is visibly bad."""
    real = torch.empty

    def nan_empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", nan_empty)


def state_digest(model: torch.nn.Module) -> str:
    """sha256 over the sorted state dict (names and raw bytes)."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
