"""Attention diagnostics: per-layer, per-head attention maps and their summary (target mass, hit rate, entropy, …).

``attention_maps(model)`` dispatches to the first function registered with :func:`register_attention_maps` whose
``matches(model)`` is true, so other families (Swin, Mixer) add theirs from their own modules::

    @register_attention_maps(matches=is_swin)
    def _swin_maps(model, images): -> AttentionMaps
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from impulsevit.init import impulse
from impulsevit.init.api import InitReport, read_full
from impulsevit.init.capture import module_calls
from impulsevit.init.vit_layout import VitLayout, is_vit, patch_pseudo_input, vit_layout

__all__ = [
    "AttentionMaps",
    "HeadSummary",
    "Summary",
    "attention_maps",
    "register_attention_maps",
    "summarize",
]


class AttentionMaps(list):
    """A list over layers of ``(h, T, T)`` float32 attention tensors (rows = queries, sum to 1 over keys).

    Attributes:
        grid: ``(H, W)`` patch grid.
        num_prefix: prefix tokens (class / register / distillation) at the start of each axis: 0 for the pseudo-input
            path (patch tokens only), the model's count for real images.
        source: ``'pseudo-input'`` or ``'images'``.
    """

    def __init__(self, maps: Sequence[torch.Tensor], grid: tuple[int, int], num_prefix: int, source: str) -> None:
        super().__init__(maps)
        self.grid = grid
        self.num_prefix = num_prefix
        self.source = source

    @property
    def patch_slice(self) -> slice:
        """Index range of the patch tokens on both axes."""
        return slice(self.num_prefix, self.num_prefix + self.grid[0] * self.grid[1])


MapsFn = Callable[[nn.Module, torch.Tensor | None], AttentionMaps]
_MAPS: list[tuple[Callable[[nn.Module], bool], MapsFn]] = []


def register_attention_maps(matches: Callable[[nn.Module], bool]) -> Callable[[MapsFn], MapsFn]:
    """Decorator: ``fn(model, images_or_None) -> AttentionMaps`` handles models where ``matches(model)``."""

    def deco(fn: MapsFn) -> MapsFn:
        _MAPS.append((matches, fn))
        return fn

    return deco


def attention_maps(model: nn.Module, images: torch.Tensor | None = None) -> AttentionMaps:
    """Per-layer, per-head attention of ``model``.

    Args:
        images: ``None`` → the pseudo-input (ViT: each block's ``norm1`` applied to the patch rows of ``pos_embed``, no
            qkv bias, no patch content — the input the impulse solve designs for; maps are patch tokens only,
            ``(h, N, N)``). A ``(B, C, H, W)`` batch → the real forward's attention at every block (incl. biases and
            the residual stream), averaged over the batch, ``(h, L, L)`` with prefix tokens first
            (``maps.patch_slice`` selects the patch tokens). The model's train/eval mode is restored afterwards.

    Raises:
        ValueError: no registered diagnostics for this model class.
    """
    for matches, fn in _MAPS:  # the built-in families' are registered by `import impulsevit.init`
        if matches(model):
            with torch.no_grad():
                return fn(model, images)
    raise ValueError(f"no attention-map diagnostics registered for {type(model).__name__}")


@register_attention_maps(matches=is_vit)
def _vit_maps(model: nn.Module, images: torch.Tensor | None) -> AttentionMaps:
    layout = vit_layout(model, need_pos_embed=images is None)
    if images is None:
        return _vit_pseudo_input_maps(model, layout)
    return _vit_image_maps(model, layout, images)


def _vit_pseudo_input_maps(model: nn.Module, layout: VitLayout) -> AttentionMaps:
    """Each block's attention on its ``norm1`` of the patch rows of ``pos_embed`` (``LN0`` without ``norm1``), without
    qkv bias: patch tokens only, ``(h, N, N)``."""
    pos_embed = read_full(model.get_parameter(layout.pos_name)).detach().float()
    patch_rows = pos_embed[0, layout.patch_rows]
    maps = []
    for i, attn in enumerate(layout.attns):
        norm = getattr(model.blocks[i], "norm1", None)
        tokens = _float_call(norm, patch_rows) if norm is not None else patch_pseudo_input(pos_embed, layout.patch_rows)
        maps.append(_head_attention(attn, tokens.unsqueeze(0), bias=False)[0])
    return AttentionMaps(maps, layout.grid, 0, "pseudo-input")


def _float_call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` in float32 whatever the dtype its parameters are held in (FSDP2 unshards them in its
    ``param_dtype``, e.g. bfloat16, and a float32 input to a bfloat16 LayerNorm is an error on CPU and CUDA)."""
    state = {n: t.float() for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_floating_point()}
    return torch.func.functional_call(module, state, (x.float(),))


def _vit_image_maps(model: nn.Module, layout: VitLayout, images: torch.Tensor) -> AttentionMaps:
    """Each block's attention in the real forward of ``images`` (in eval mode; the mode is restored), with biases,
    averaged over the batch: ``(h, L, L)``, prefix tokens first."""
    captured = module_calls(model, list(layout.attns), images,  # inside each call: FSDP2's unsharded weights
                            during=lambda attn, call: _head_attention(attn, call.args[0], True).mean(0))
    return AttentionMaps(captured, layout.grid, layout.num_prefix, "images")


def _head_attention(attn: nn.Module, x: torch.Tensor, bias: bool) -> torch.Tensor:
    """Softmax attention ``(B, h, T, T)`` of a timm ``Attention`` on tokens ``x`` ``(B, T, D)``, float32."""
    weight, qkv_bias = attn.qkv.weight.float(), attn.qkv.bias
    qkv = x.float() @ weight.T
    if bias and qkv_bias is not None:
        qkv = qkv + qkv_bias.float()
    batch, num_tokens, _ = x.shape
    qkv = qkv.reshape(batch, num_tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = _float_call(attn.q_norm, qkv[0]), _float_call(attn.k_norm, qkv[1])
    scale = getattr(attn, "scale", attn.head_dim**-0.5)
    return torch.softmax((q * scale) @ k.transpose(-2, -1), dim=-1)


@dataclasses.dataclass
class HeadSummary:
    """Diagnostics of one head (all means over patch-token queries; probabilities are not renormalised to patches).

    Attributes:
        target_mass: mean probability on the head's target neighbour over interior queries (grid rows/cols at least
            ``max(1, |dy|, |dx|)`` from the border). ``nan`` without offsets.
        hit_rate: fraction of interior queries whose argmax key (over all keys) is the target.
        border_max: mean max-probability of queries whose neighbour is off the grid (``nan`` if none, e.g. identity).
        entropy: mean row entropy in nats (over all keys; uniform over ``T`` keys = ``ln T``).
        distance: mean attention distance in patch units (``Σ_k p·‖pos_q − pos_k‖`` over patch keys).
    """

    layer: int
    head: int
    offset: tuple[int, int] | None
    target_mass: float
    hit_rate: float
    border_max: float
    entropy: float
    distance: float


class Summary(list):
    """A list of :class:`HeadSummary`, printable as a table (``str(summary)``)."""

    def table(self) -> str:
        lines = ["layer head offset   target_mass hit_rate border_max entropy distance"]
        for s in self:
            off = f"({s.offset[0]:+d},{s.offset[1]:+d})" if s.offset is not None else "   -   "
            lines.append(
                f"{s.layer:>5} {s.head:>4} {off:<8} {s.target_mass:>11.3f} {s.hit_rate:>8.3f} {s.border_max:>10.3f} "
                f"{s.entropy:>7.3f} {s.distance:>8.3f}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def mean(self, field: str, offset: tuple[int, int] | None = None) -> float:
        """Mean of ``field`` over heads (optionally only heads with ``offset``), ignoring nan."""
        vals = [getattr(s, field) for s in self if offset is None or s.offset == tuple(offset)]
        vals = [v for v in vals if not math.isnan(v)]
        return sum(vals) / len(vals) if vals else float("nan")


def summarize(
    maps: Sequence[torch.Tensor],
    offsets: InitReport | Sequence[Sequence[tuple[int, int]]] | None = None,
    *,
    grid: tuple[int, int] | None = None,
    num_prefix: int | None = None,
) -> Summary:
    """Per layer / head diagnostics of attention maps against the designed offsets.

    Args:
        maps: from :func:`attention_maps` (its ``grid`` / ``num_prefix`` are used), or a plain list of ``(h, T, T)``
            tensors together with ``grid`` (and ``num_prefix``, default 0).
        offsets: per layer, per head ``(dy, dx)`` (e.g. ``InitReport.offsets``); a single row is used for every layer.
            ``None`` → only entropy and distance.
    """
    grid = grid or getattr(maps, "grid", None)
    if grid is None:
        raise ValueError("summarize needs the token grid: pass maps from attention_maps() or grid=(H, W)")
    prefix = num_prefix if num_prefix is not None else getattr(maps, "num_prefix", 0)
    if isinstance(offsets, InitReport):
        offsets = offsets.offsets
    if offsets is not None and len(offsets) not in (1, len(maps)):
        raise ValueError(f"offsets has {len(offsets)} layers, maps has {len(maps)}")
    H, W = grid
    n = H * W
    token_row = torch.arange(n) // W
    token_col = torch.arange(n) % W
    token_distance = torch.sqrt(
        ((token_row[:, None] - token_row[None]) ** 2 + (token_col[:, None] - token_col[None]) ** 2).float()
    )
    out = Summary()
    for layer, layer_maps in enumerate(maps):
        layer_maps = layer_maps.float()
        if layer_maps.shape[-1] != n + prefix:
            raise ValueError(f"layer {layer}: maps have {layer_maps.shape[-1]} tokens, expected {n} + {prefix} prefix")
        rows = layer_maps[:, prefix : prefix + n]  # patch queries, all keys
        entropy = -(rows * rows.clamp_min(1e-30).log()).sum(-1).mean(-1)
        distance = (rows[:, :, prefix:] * token_distance).sum(-1).mean(-1)
        for head in range(layer_maps.shape[0]):
            offset = None
            mass = hit = border = float("nan")
            if offsets is not None:
                offset = tuple(offsets[0 if len(offsets) == 1 else layer][head])
                mass, hit, border = _target_scores(rows[head], offset, grid, prefix, token_row, token_col)
            out.append(HeadSummary(layer, head, offset, mass, hit, border, entropy[head].item(), distance[head].item()))
    return out


def _target_scores(
    head_rows: torch.Tensor,
    offset: tuple[int, int],
    grid: tuple[int, int],
    prefix: int,
    token_row: torch.Tensor,
    token_col: torch.Tensor,
) -> tuple[float, float, float]:
    """``(target_mass, hit_rate, border_max)`` of one head (see :class:`HeadSummary`; ``nan`` where no query counts).

    Args:
        head_rows: the head's patch-query rows over all keys, ``(N, T)``.
        offset: the head's ``(dy, dx)``.
        prefix: prefix tokens before the patch keys.
        token_row, token_col: grid row / column of every patch token, ``(N,)``.
    """
    H, W = grid
    target_of = impulse.shift_index(H, W, offset)
    margin = max(1, abs(offset[0]), abs(offset[1]))
    mass = hit = border = float("nan")
    interior = torch.nonzero(
        (token_row >= margin) & (token_row < H - margin) & (token_col >= margin) & (token_col < W - margin)
    ).squeeze(1)
    if interior.numel():
        targets = target_of[interior] + prefix
        mass = head_rows[interior, targets].mean().item()
        hit = (head_rows[interior].argmax(-1) == targets).float().mean().item()
    off_grid = torch.nonzero(target_of < 0).squeeze(1)
    if off_grid.numel():
        border = head_rows[off_grid].max(-1).values.mean().item()
    return mass, hit, border
