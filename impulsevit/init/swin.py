"""Swin Transformer (timm ``SwinTransformer``, v1): impulse and mimetic initializers, attention diagnostics.

``impulse`` (docs/method.md §4.2, the "faithful-in-spirit" construction; the paper's exact Swin mechanics are unknown):
every block's relative-position bias table gets, for head ``i`` with offset ``(dy, dx)`` = ``impulse_offsets(h)[i]``
(docs/method.md §2.1), the value ``c`` at the relative coordinate of the target neighbour and ``0`` everywhere else.
Q/K are left as they are, so at init the bias dominates the logits: within a window each query puts
``e^c / (e^c + n - 1)`` of its softmax mass on the key at ``(r + dy, c + dx)`` (``n`` = unmasked keys in its window).
``c`` defaults to the value that gives ``target_mass`` (0.75) in a *full* window of the block's size, i.e.
``c = log(target_mass · (n - 1) / (1 - target_mass))`` (≈ 4.97 for 7×7, 3.81 for 4×4); ``bias=`` fixes ``c`` for all
blocks instead. A query whose neighbour lies outside its window (window border, image border) has a flat bias row —
no target, like zero padding; in shifted-window blocks timm's own mask (−100) already removes wrapped tokens, so they
never receive the target.

The bias table is indexed through the module's own ``relative_position_index`` buffer (timm: relative coordinate
= query − key), read from the buffer rather than re-derived, so the construction follows whatever convention the
installed timm uses.

``mimetic`` (Trockman & Kolter; docs/method.md §5.1) per block: per head ``W_qᵀ W_k`` = best rank-``d`` approximation of
``qk_alpha·Z + qk_beta·I`` (``Z`` i.i.d. ``U(±√(3/D))``), and ``x W_vᵀ W_oᵀ = x (value_alpha·Z' − value_beta·I)`` per
block. Both start from the one ``base`` option (:class:`~impulsevit.init.options.BaseOptions`): by default every
tensor they do not write is at PyTorch's constructor init, as the ``torch`` method draws it for the same seed.

Not supported: ``SwinTransformerV2`` (its bias comes from a continuous-position MLP, not a table; it does not match
this family and ``initialize`` raises). Windows smaller than 2 along an axis cannot hold a vertical/horizontal
neighbour: such heads keep a flat (all-zero) table and a note says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from impulsevit._compat.timm import swin_relative_position_bias
from impulsevit.init.api import InitResult, read_full, register
from impulsevit.init.baselines import as_tensor, base_values, write_values
from impulsevit.init.diagnostics import AttentionMaps, register_attention_maps
from impulsevit.init.impulse import impulse_offsets, mimetic_qk_factors, value_proj_factors
from impulsevit.init.options import BaseOptions, BiasImpulseOptions, MimeticOptions, as_dict

__all__ = [
    "is_swin",
    "swin_blocks",
    "impulse_bias_table",
    "swin_window_attention",
    "swin_attention_maps",
    "swin_summary",
]

def _swin_classes() -> tuple[type, type]:
    from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock

    return SwinTransformer, SwinTransformerBlock


def is_swin(model: nn.Module) -> bool:
    """True for timm's ``SwinTransformer`` (v1) and subclasses."""
    return isinstance(model, _swin_classes()[0])


def swin_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, block)`` for every ``SwinTransformerBlock`` in forward order.

    Raises:
        ValueError: naming the model class when a block lacks a window attention with a relative-position bias table.
    """
    block_cls = _swin_classes()[1]
    blocks = [(n, m) for n, m in model.named_modules() if isinstance(m, block_cls)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no timm SwinTransformerBlock; cannot apply a Swin initializer")
    for name, blk in blocks:
        attn = getattr(blk, "attn", None)
        for attr in ("relative_position_bias_table", "relative_position_index", "qkv", "proj", "num_heads"):
            if not hasattr(attn, attr):
                raise ValueError(f"{type(model).__name__}: block {name!r} has no attn.{attr} (timm WindowAttention)")
    return blocks


def _window(blk: nn.Module) -> tuple[int, int]:
    wh, ww = blk.attn.window_size
    return int(wh), int(ww)


def impulse_bias_table(
    rel_index: torch.Tensor, window: tuple[int, int], offsets: list[tuple[int, int]], value: float
) -> tuple[torch.Tensor, list[int]]:
    """The relative-position bias table ``((2wh−1)(2ww−1), heads)`` with ``value`` at each head's target entry.

    Args:
        rel_index: the block's ``relative_position_index`` buffer, ``(wh·ww, wh·ww)``, row = query, column = key.
        window: ``(wh, ww)``.
        offsets: one ``(dy, dx)`` per head.
        value: the bias constant ``c`` (logit units).

    Returns:
        The table (float64) and the heads whose offset does not fit in the window (their column stays 0).
    """
    wh, ww = window
    table = torch.zeros((2 * wh - 1) * (2 * ww - 1), len(offsets), dtype=torch.float64)
    misfit = []
    for head, (dy, dx) in enumerate(offsets):
        # any query that has the neighbour inside the window tells us the table row of this relative position
        r, c = max(0, -dy), max(0, -dx)
        if r + dy >= wh or c + dx >= ww or r >= wh or c >= ww:
            misfit.append(head)
            continue
        table_row = int(rel_index[r * ww + c, (r + dy) * ww + (c + dx)])
        table[table_row, head] = value
    return table, misfit


def _bias_for(target_mass: float, window_area: int) -> float:
    return math.log(target_mass * (window_area - 1) / (1.0 - target_mass))


@register("impulse", family="swin", matches=is_swin, options=BiasImpulseOptions)
def impulse_swin(model: nn.Module, generator: torch.Generator, options: BiasImpulseOptions) -> InitResult:
    """Impulse relative-position bias for every Swin block; Q/K/V untouched.

    Options:
        target_mass: softmax share of the target key for an interior query of a full window with zero Q/K
            contribution, in (0, 1); sets ``c`` per block from its window area. Default 0.75 (c ≈ 4.97 at 7×7).
        bias: if given, the constant ``c`` for all blocks (``target_mass`` is then only reported, not used).
        kernel_size: 3 (default, the released §2.1 order) or 5 (``impulse.kernel_offsets(5)``).
        offsets: ``"fixed"`` (default; no randomness) or ``"random"`` (per block and head, with replacement, from the
            generator, as in the earlier release — docs/method.md §3).
    """
    opts = options
    target_mass = float(opts.target_mass)
    blocks = swin_blocks(model)
    tables = {f"{name}.attn.relative_position_bias_table" for name, _ in blocks}
    values, notes = base_values(model, generator, opts.base, tables)
    plans, offsets = [], []
    for name, blk in blocks:
        attn = blk.attn
        wh, ww = _window(blk)
        heads = int(attn.num_heads)
        table_shape = tuple(attn.relative_position_bias_table.shape)
        if table_shape != ((2 * wh - 1) * (2 * ww - 1), heads):
            raise ValueError(
                f"{type(model).__name__}: block {name!r} relative_position_bias_table has shape {table_shape}, "
                f"expected ({(2 * wh - 1) * (2 * ww - 1)}, {heads}) for window {wh}x{ww}"
            )
        head_offsets = impulse_offsets(heads, opts.kernel_size, opts.offsets, generator=generator)
        if wh * ww < 2:
            bias = 0.0
        else:
            bias = float(opts.bias) if opts.bias is not None else _bias_for(target_mass, wh * ww)
        table, misfit = impulse_bias_table(read_full(attn.relative_position_index), (wh, ww), head_offsets, bias)
        if misfit:
            notes.append(f"{name}: window {wh}x{ww} cannot hold the offsets of heads {misfit}; their bias stays flat")
        plans.append((f"{name}.attn.relative_position_bias_table", table))
        offsets.append(head_offsets)
        notes.append(f"{name}: window {wh}x{ww}, shift {tuple(blk.shift_size)}, bias c={bias:.4f}")
    values.update(plans)
    write_values(model, values)
    return InitResult(options=as_dict(opts), offsets=offsets, notes=notes)


@dataclasses.dataclass(frozen=True)
class SwinMimeticOptions(BaseOptions, MimeticOptions):
    """``mimetic`` on Swin v1: the shared mimetic options and ``base``."""


@register("mimetic", family="swin", matches=is_swin, options=SwinMimeticOptions)
def mimetic_swin(model: nn.Module, generator: torch.Generator, options: SwinMimeticOptions) -> InitResult:
    """Mimetic Q/K per head (and V/proj per block) for every Swin block; option names as for ViT.

    Options:
        qk_alpha, qk_beta: ``W_qᵀ W_k ≈ qk_alpha·Z + qk_beta·I`` per head (default 0.7, 0.7).
        value: ``"mimetic"`` (default): ``W_v W_o ≈ value_alpha·Z − value_beta·I`` per block, row convention
            (needs ``heads·head_dim == dim``); ``"default"``: leave V/proj as they are.
        value_alpha, value_beta: default 0.4, 0.4.
    """
    opts = options
    blocks = swin_blocks(model)
    shapes = []
    for name, blk in blocks:
        attn = blk.attn
        dim = attn.qkv.in_features
        heads = int(attn.num_heads)
        attn_dim = attn.qkv.out_features // 3
        if attn.qkv.out_features != 3 * attn_dim or attn_dim % heads:
            raise ValueError(f"{type(model).__name__}: block {name!r} qkv has {attn.qkv.out_features} rows, "
                             f"expected 3·heads·head_dim")
        if opts.value == "mimetic" and attn_dim != dim:
            raise ValueError(f"{type(model).__name__}: block {name!r} has heads·head_dim={attn_dim} != dim={dim}; "
                             "mimetic V/proj needs them equal (pass value='default')")
        shapes.append((dim, heads, attn_dim // heads))
    values, notes = base_values(model, generator, opts.base)
    for (name, blk), (dim, heads, head_dim) in zip(blocks, shapes):
        width = heads * head_dim
        qkv_name = f"{name}.attn.qkv.weight"
        qkv = (as_tensor(values[qkv_name]) if qkv_name in values else read_full(blk.attn.qkv.weight).detach()
               ).to(torch.float64).clone()
        wq, wk, _ = mimetic_qk_factors(dim, heads, head_dim, generator, float(opts.qk_alpha), float(opts.qk_beta))
        qkv[:width] = wq.reshape(width, dim)
        qkv[width : 2 * width] = wk.reshape(width, dim)
        proj = None
        if opts.value == "mimetic":
            wv, proj, _ = value_proj_factors(dim, generator, float(opts.value_alpha), float(opts.value_beta))
            qkv[2 * width :] = wv
        values[qkv_name] = qkv
        if proj is not None:
            values[f"{name}.attn.proj.weight"] = proj
    write_values(model, values)
    return InitResult(options=as_dict(opts), notes=[*notes, f"{len(blocks)} Swin blocks"])


# ---------------------------------------------------------------------------------------------------- diagnostics


def swin_window_attention(model: nn.Module, images: torch.Tensor) -> list[dict[str, Any]]:
    """The real post-softmax attention of every Swin block on ``images`` (captured from timm's own forward).

    Temporarily switches each ``WindowAttention`` to its non-fused path (which applies ``attn.softmax``) and records
    the softmax output; the model's outputs are unchanged.

    Returns:
        Per block a dict: ``name``; ``attn`` ``(B·nW, heads, n, n)`` (window-major order of timm's
        ``window_partition`` over the cyclically shifted, padded grid); ``mask`` ``(nW, n, n)`` (0 / −100) or None;
        ``window`` ``(wh, ww)``; ``shift`` ``(sy, sx)``; ``resolution`` ``(H, W)`` of the block input.
    """
    blocks = swin_blocks(model)
    records: list[dict[str, Any]] = []
    hooks, fused = [], []

    def make_hook(rec: dict[str, Any]) -> Callable[..., None]:
        def hook(_mod: nn.Module, _inp: Any, out: torch.Tensor) -> None:
            rec["attn"] = out.detach()

        return hook

    try:
        for name, blk in blocks:
            rec = {"name": name, "window": _window(blk), "shift": tuple(int(s) for s in blk.shift_size),
                   "resolution": tuple(int(r) for r in blk.input_resolution), "mask": blk.attn_mask}
            records.append(rec)
            fused.append((blk.attn, blk.attn.fused_attn))
            blk.attn.fused_attn = False
            hooks.append(blk.attn.softmax.register_forward_hook(make_hook(rec)))
        with torch.no_grad():
            model(images)
    finally:
        for hook in hooks:
            hook.remove()
        for attn, flag in fused:
            attn.fused_attn = flag
    return records


def swin_attention_maps(model: nn.Module, images: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per block, per head attention ``(heads, n, n)`` within one window (``n = wh·ww``).

    Without ``images``: the attention of an unshifted full window with zero Q/K contribution, i.e.
    ``softmax(relative-position bias)`` — the Swin analogue of ViT's pseudo-input maps. With ``images``: the real
    attention averaged over batch and windows (shifted blocks average over their masked windows too).
    """
    if images is None:
        return [torch.softmax(swin_relative_position_bias(b.attn)[0].detach().float(), dim=-1)
                for _, b in swin_blocks(model)]
    return [rec["attn"].float().mean(0) for rec in swin_window_attention(model, images)]


def swin_summary(
    model: nn.Module, images: torch.Tensor | None = None, offsets: list[list[tuple[int, int]]] | None = None
) -> list[list[dict[str, float]]]:
    """Per block, per head: ``target_mass`` and ``hit_rate`` (argmax on the target) over the queries whose target
    lies in the window, ``entropy`` (nats, mean over queries) and ``distance`` (mean attention distance in tokens),
    from :func:`swin_attention_maps`. ``offsets`` default to :func:`impulse_offsets` per block."""
    maps = swin_attention_maps(model, images)
    out = []
    for layer, ((_, blk), block_maps) in enumerate(zip(swin_blocks(model), maps)):
        wh, ww = _window(blk)
        head_offsets = offsets[layer] if offsets is not None else impulse_offsets(block_maps.shape[0])
        ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")
        ys, xs = ys.flatten().float(), xs.flatten().float()
        dist = ((ys[:, None] - ys[None]) ** 2 + (xs[:, None] - xs[None]) ** 2).sqrt()
        rows = []
        for head, (dy, dx) in enumerate(head_offsets):
            attn = block_maps[head]
            entropy = -(attn.clamp_min(1e-12).log() * attn).sum(-1).mean()
            query_list, key_list = [], []
            for r in range(wh):
                for c in range(ww):
                    if 0 <= r + dy < wh and 0 <= c + dx < ww:
                        query_list.append(r * ww + c)
                        key_list.append((r + dy) * ww + c + dx)
            queries = torch.tensor(query_list, dtype=torch.long)
            keys = torch.tensor(key_list, dtype=torch.long)
            mass = attn[queries, keys].mean() if query_list else torch.tensor(float("nan"))
            hit = (attn[queries].argmax(-1) == keys).float().mean() if query_list else torch.tensor(float("nan"))
            rows.append({"target_mass": float(mass), "hit_rate": float(hit), "entropy": float(entropy),
                         "distance": float((attn * dist).sum(-1).mean())})
        out.append(rows)
    return out


@register_attention_maps(matches=is_swin)
def _swin_maps(model: nn.Module, images: torch.Tensor | None) -> AttentionMaps:
    """``impulsevit.init.attention_maps`` for Swin: :func:`swin_attention_maps` with ``grid`` = the window, so
    ``summarize(maps, report)`` treats the window as the token grid ("pseudo-input" = zero Q/K contribution).

    Raises:
        ValueError: the blocks' windows differ (e.g. a stage whose resolution is below the window); use
            :func:`swin_summary`, which handles a window per block.
    """
    windows = sorted({_window(blk) for _, blk in swin_blocks(model)})
    if len(windows) != 1:
        raise ValueError(f"{type(model).__name__}: blocks use different windows {windows}; attention_maps needs one "
                         "window for all blocks — use impulsevit.init.swin.swin_summary instead")
    was_training = model.training
    try:
        model.eval()
        maps = swin_attention_maps(model, images)
    finally:
        model.train(was_training)
    return AttentionMaps(maps, windows[0], 0, "pseudo-input" if images is None else "images")
