"""Relative-position-bias attention beyond Swin v1: BEiT, ``VisionTransformerRelPos`` (table and MLP), Swin v2 and
Swin v2-CR — ``impulse`` writes each head's one-tap offset into the bias its attention adds to the logits.

The Swin v1 construction (:mod:`impulsevit.init.swin`, docs/method.md §4.2) carried over: for head ``i`` with offset
``(dy, dx)`` = ``impulse_offsets(h)[i]`` the bias of the query/key pair ``(q, q + (dy, dx))`` is ``c`` above every other
patch pair of that head, ``c = ln(m·(n−1)/(1−m))`` for target share ``m`` (default 0.75) among the ``n`` patch keys of
the window (BEiT / relpos: the whole token grid plus the class token). Q/K/V keep their values (timm's init: Q/K logits
≈ ±0.1, so the bias dominates). Queries whose neighbour is off the grid / window get a flat bias row (zero padding).

Where the bias comes from decides how it is written (a *carrier*):

* **table** (BEiT per-block ``relative_position_bias_table`` or the shared ``rel_pos_bias``; relpos ``RelPosBias``):
  the entry the module's own ``relative_position_index`` uses for a query/key pair at the target displacement is set to
  ``c``, every other entry (class-token entries included) to 0.
* **mlp** (relpos ``RelPosMlp``, Swin v2 ``cpb_mlp``, Swin v2-CR ``meta_mlp``): the bias is ``act(W·φ(x) [+ b])`` over
  the relative coordinates ``x`` with hidden features ``φ`` (ReLU of the first layer, kept). The last layer ``W``
  (and its bias, if any) is the least-squares solution of ``φ W ≈ Z`` with ``Z`` the pre-activation target table:
  ``c`` / 0 for the identity activation; ``logit(t/16)`` of the clipped targets ``t = c + 16ε`` / ``16ε`` (``ε`` =
  ``floor``, default 0.01) for Swin v2's ``16·sigmoid``. Hidden units fewer than relative positions leave a residual:
  the note reports its max and the realised worst margin (target bias minus the largest other bias of the same query).
* Swin v2 / v2-CR also scale their cosine logits by ``exp(logit_scale)`` (timm init ``ln 10``: cosine logits in
  ``[−10, 10]`` would swamp a bias of ≈ 5); option ``logit_scale`` (default 1.0, i.e. ``ln 1 = 0``) sets it, so the
  cosine term moves a logit by at most ±1.

Not supported: ``RelPosBiasTf`` (MaxViT tables), relpos models with more than one prefix token, BEiT with rotary
embeddings. ``mimetic`` is not registered here: the ViT ``mimetic`` adapter refuses these models (one line).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import nn

from impulsevit.init.api import InitResult, read_full, register, write_full_
from impulsevit.init.baselines import base_values, write_values
from impulsevit.init.capture import captured_attention, module_calls
from impulsevit.init.diagnostics import AttentionMaps, register_attention_maps
from impulsevit.init.impulse import impulse_offsets
from impulsevit.init.kinds import _beit_classes, _relpos_classes, is_relbias_vit, is_swinv2
from impulsevit.init.options import BiasImpulseOptions, as_dict, check_range

__all__ = [
    "Carrier",
    "bias_carriers",
    "is_relbias_vit",
    "is_swinv2",
    "target_rows",
    "fit_last_layer",
    "carrier_bias",
    "relbias_summary",
]


@dataclasses.dataclass
class Carrier:
    """One source of relative-position bias.

    Attributes:
        name: module path (for notes).
        window: ``(wh, ww)`` grid of the patch tokens it covers.
        heads: heads it has a column for.
        pair_rows: ``(n, n)`` long: for patch query ``q`` and patch key ``k`` (window row-major), the row of the output
            table that gives their bias.
        rows: rows of the output table.
        kind: ``"table"`` or ``"mlp"``.
        table: the table parameter (``kind == "table"``).
        last: the MLP's last ``nn.Linear`` (``kind == "mlp"``).
        features: ``() -> (rows, hidden)`` the inputs of ``last`` over the output rows (``kind == "mlp"``).
        squash: ``"identity"`` or ``"sigmoid16"`` (Swin v2: ``16·sigmoid``).
        logit_scale: the cosine-attention ``logit_scale`` parameter of the module (Swin v2 / v2-CR), else None.
        prefix: prefix (class) tokens that also receive attention (with a flat bias).
        first, coords: the MLP's first ``nn.Linear`` and its input, the relative coordinates (``kind == "mlp"``).
    """

    name: str
    window: tuple[int, int]
    heads: int
    pair_rows: torch.Tensor
    rows: int
    kind: str
    table: nn.Parameter | None = None
    last: nn.Linear | None = None
    features: Callable[[], torch.Tensor] | None = None
    squash: str = "identity"
    logit_scale: nn.Parameter | None = None
    prefix: int = 0
    first: nn.Linear | None = None
    coords: torch.Tensor | None = None


def _index_pairs(index: torch.Tensor, window: tuple[int, int], prefix: int) -> torch.Tensor:
    n = window[0] * window[1]
    side = n + prefix
    index = read_full(index).reshape(side, side)
    return index[prefix:, prefix:].long().clone()


def _table_carrier(name: str, module: nn.Module, window: tuple[int, int], prefix: int) -> Carrier:
    table = module.relative_position_bias_table
    return Carrier(name, tuple(int(w) for w in window), int(table.shape[1]),
                   _index_pairs(module.relative_position_index, window, prefix), int(table.shape[0]), "table",
                   table=table, prefix=prefix)


def _mlp_features(mlp: nn.Module, last: nn.Linear, coords: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The inputs of ``last`` when ``mlp`` runs on ``coords`` (captured from the MLP's own forward, eval mode)."""

    def run() -> torch.Tensor:
        (call,) = module_calls(mlp, [last], read_full(coords))
        return call.args[0].reshape(-1, last.in_features).double()

    return run


def _relpos_carrier(name: str, module: nn.Module) -> Carrier:
    from timm.layers.pos_embed_rel import RelPosBias, RelPosMlp

    window = tuple(int(w) for w in module.window_size)
    if isinstance(module, RelPosBias):
        return _table_carrier(name, module, window, int(module.prefix_tokens))
    if isinstance(module, RelPosMlp):
        heads = int(module.num_heads)
        pairs = _index_pairs(module.relative_position_index, window, 0)
        rows = (2 * window[0] - 1) * (2 * window[1] - 1)
        squash = "sigmoid16" if module.mode == "swin" else "identity"
        return Carrier(name, window, heads, pairs, rows, "mlp", last=module.mlp.fc2,
                       features=_mlp_features(module.mlp, module.mlp.fc2, module.rel_coords_log), squash=squash,
                       prefix=int(module.prefix_tokens), first=module.mlp.fc1, coords=module.rel_coords_log)
    raise ValueError(f"{name}: relative position module {type(module).__name__} is not supported "
                     "(RelPosBias and RelPosMlp are)")


def bias_carriers(model: nn.Module) -> list[tuple[list[int], Carrier]]:
    """Every bias carrier of ``model`` with the indices of the attention layers (forward order) that add it.

    Raises:
        ValueError: naming the model and the unsupported piece.
    """
    name = type(model).__name__
    out: list[tuple[list[int], Carrier]] = []
    if isinstance(model, _beit_classes()):
        if getattr(model, "rope", None) is not None:
            raise ValueError(f"{name}: rotary embeddings together with a relative bias are not supported")
        grid = tuple(int(g) for g in model.patch_embed.grid_size)
        if model.rel_pos_bias is not None:
            out.append((list(range(len(model.blocks))), _table_carrier("rel_pos_bias", model.rel_pos_bias, grid, 1)))
        for i, blk in enumerate(model.blocks):
            if blk.attn.relative_position_bias_table is not None:
                out.append(([i], _table_carrier(f"blocks.{i}.attn", blk.attn, tuple(blk.attn.window_size), 1)))
    elif isinstance(model, _relpos_classes()):
        if model.num_prefix_tokens > 1:
            raise ValueError(f"{name}: {model.num_prefix_tokens} prefix tokens; relative bias supports at most 1")
        if model.shared_rel_pos is not None:
            out.append((list(range(len(model.blocks))), _relpos_carrier("shared_rel_pos", model.shared_rel_pos)))
        for i, blk in enumerate(model.blocks):
            if blk.attn.rel_pos is not None:
                out.append(([i], _relpos_carrier(f"blocks.{i}.attn.rel_pos", blk.attn.rel_pos)))
    elif is_swinv2(model):
        from timm.models.swin_transformer_v2 import WindowAttention
        from timm.models.swin_transformer_v2_cr import WindowMultiHeadAttention

        layer = 0
        for mod_name, mod in model.named_modules():
            if isinstance(mod, WindowAttention):
                window = tuple(int(w) for w in mod.window_size)
                last = mod.cpb_mlp[-1]
                rows = (2 * window[0] - 1) * (2 * window[1] - 1)
                carrier = Carrier(mod_name, window, int(mod.num_heads), read_full(mod.relative_position_index).long(),
                                  rows, "mlp", last=last, features=_mlp_features(mod.cpb_mlp, last,
                                                                                 mod.relative_coords_table),
                                  squash="sigmoid16", logit_scale=mod.logit_scale, first=mod.cpb_mlp[0],
                                  coords=mod.relative_coords_table)
            elif isinstance(mod, WindowMultiHeadAttention):
                window = tuple(int(w) for w in mod.window_size)
                n = window[0] * window[1]
                pairs = torch.arange(n * n).reshape(n, n)  # meta_mlp runs on every (query, key) pair, row-major
                carrier = Carrier(mod_name, window, int(mod.num_heads), pairs, n * n, "mlp", last=mod.meta_mlp.fc2,
                                  features=_mlp_features(mod.meta_mlp, mod.meta_mlp.fc2,
                                                         mod.relative_coordinates_log),
                                  logit_scale=mod.logit_scale, first=mod.meta_mlp.fc1,
                                  coords=mod.relative_coordinates_log)
            else:
                continue
            out.append(([layer], carrier))
            layer += 1
    if not out:
        raise ValueError(f"{name} has no relative position bias to carry the impulse")
    return out


def target_rows(carrier: Carrier, offsets: list[tuple[int, int]]) -> tuple[torch.Tensor, list[int]]:
    """``(rows, heads)`` bool: the output rows that are each head's target (its one-tap displacement), and the heads
    whose offset does not fit the window. Found through ``pair_rows`` at a query that has the neighbour, so the
    module's own index convention decides which row it is."""
    wh, ww = carrier.window
    on = torch.zeros(carrier.rows, len(offsets), dtype=torch.bool)
    misfit = []
    for head, (dy, dx) in enumerate(offsets):
        r, c = max(0, -dy), max(0, -dx)
        if r + dy >= wh or c + dx >= ww or r >= wh or c >= ww:
            misfit.append(head)
            continue
        # every query with its neighbour in the window (the cr MLP has one row per pair, so mark them all)
        for qr in range(wh):
            for qc in range(ww):
                if 0 <= qr + dy < wh and 0 <= qc + dx < ww:
                    on[int(carrier.pair_rows[qr * ww + qc, (qr + dy) * ww + qc + dx]), head] = True
    return on, misfit


def fit_last_layer(features: torch.Tensor, target: torch.Tensor, with_bias: bool) -> tuple[torch.Tensor, torch.Tensor |
                                                                                           None, torch.Tensor]:
    """Least squares ``features @ Wᵀ (+ b) ≈ target`` in float64 (minimum-norm solution).

    Returns:
        ``W (heads, hidden)``, ``b (heads,)`` or None, and the fitted values ``(rows, heads)``.
    """
    design = torch.cat([features, torch.ones(features.shape[0], 1, dtype=features.dtype)], 1) if with_bias else features
    solution = torch.linalg.lstsq(design, target.double(), driver="gelsd").solution  # (hidden[+1], heads)
    fitted = design @ solution
    if with_bias:
        return solution[:-1].T.contiguous(), solution[-1].contiguous(), fitted
    return solution.T.contiguous(), None, fitted


def _bias_for(target_mass: float, keys: int) -> float:
    return math.log(target_mass * (keys - 1) / (1.0 - target_mass))


@dataclasses.dataclass(frozen=True)
class RelBiasImpulseOptions(BiasImpulseOptions):
    """``impulse`` on BEiT / relpos-ViT tables and Swin v2 position MLPs: the Swin v1 options plus ``logit_scale``
    (> 0; Swin v2's cosine attention: its learnable scale is set to ``ln(logit_scale)``) and ``floor`` (in (0, 0.5);
    the smallest ``16·sigmoid`` output the MLP fit aims for off the target)."""

    logit_scale: float = 1.0
    floor: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("logit_scale", self.logit_scale, 0.0, open_low=True)
        check_range("floor", self.floor, 0.0, 0.5, open_low=True, open_high=True)


def _impulse(model: nn.Module, generator: torch.Generator, opts: RelBiasImpulseOptions) -> InitResult:
    carriers = bias_carriers(model)
    layers = max(i for users, _ in carriers for i in users) + 1
    offsets: list[list[tuple[int, int]] | None] = [None] * layers
    for users, _ in carriers:
        for i in users:
            offsets[i] = []
    if any(o is None for o in offsets):
        raise ValueError(f"{type(model).__name__}: layers {[i for i, o in enumerate(offsets) if o is None]} have no "
                         "relative position bias; a partial impulse init is not supported")
    values, notes = base_values(model, generator, opts.base)  # the base first, then the structure on top of it
    write_values(model, values)
    for users, carrier in carriers:  # everything is validated: from here on, write
        head_offsets = impulse_offsets(carrier.heads, opts.kernel_size, opts.offsets, generator=generator)
        for i in users:
            offsets[i] = head_offsets
        keys = carrier.window[0] * carrier.window[1] + carrier.prefix
        c = float(opts.bias) if opts.bias is not None else _bias_for(float(opts.target_mass), keys)
        on, misfit = target_rows(carrier, head_offsets)
        if misfit:
            notes.append(f"{carrier.name}: window {carrier.window} cannot hold the offsets of heads {misfit}; flat")
        if carrier.kind == "table":
            write_full_(carrier.table, on.double() * c)
            notes.append(f"{carrier.name}: table, window {carrier.window[0]}x{carrier.window[1]}, bias c={c:.4f}")
            continue
        notes.append(_write_mlp(carrier, on, c, float(opts.floor), generator))
        if carrier.logit_scale is not None:
            write_full_(carrier.logit_scale, torch.full(tuple(carrier.logit_scale.shape),
                                                        math.log(float(opts.logit_scale))))
    if any(c.logit_scale is not None for _, c in carriers):
        notes.append(f"cosine attention: logit_scale set to ln({float(opts.logit_scale)})")
    return InitResult(options=as_dict(opts), offsets=[list(o) for o in offsets], notes=notes)


def _write_mlp(carrier: Carrier, on: torch.Tensor, c: float, floor: float, generator: torch.Generator) -> str:
    """Redraw the first layer as hinges through the coordinate cloud, least-squares the last; the note it returns
    reports the residual and the worst realised margin of a target over the other keys of its query."""
    first, coords = carrier.first, read_full(carrier.coords).reshape(-1, carrier.first.in_features).double()
    directions = torch.randn(first.out_features, first.in_features, generator=generator, dtype=torch.float64)
    directions = directions / directions.norm(dim=1, keepdim=True)
    reach = float(coords.norm(dim=1).max())
    write_full_(first.weight, directions)
    if first.bias is not None:
        write_full_(first.bias, (torch.rand(first.out_features, generator=generator, dtype=torch.float64) * 2 - 1)
                    * reach)
    if carrier.squash == "sigmoid16":
        hi = min((c + 16 * floor) / 16, 1 - floor)
        target = torch.where(on, math.log(hi / (1 - hi)), math.log(floor / (1 - floor))).double()
    else:
        target = on.double() * c
    weight, bias, fitted = fit_last_layer(carrier.features(), target, carrier.last.bias is not None)
    write_full_(carrier.last.weight, weight)
    if bias is not None:
        write_full_(carrier.last.bias, bias)
    used = torch.unique(carrier.pair_rows.flatten())
    realised = fitted if carrier.squash == "identity" else 16 * torch.sigmoid(fitted)
    pair_bias = realised[carrier.pair_rows]  # (n, n, heads)
    margins = []
    for head in range(carrier.heads):
        rows_on = on[carrier.pair_rows, head]  # (n, n)
        has = rows_on.any(1)
        if has.any():
            tgt = pair_bias[:, :, head][rows_on]
            other = pair_bias[:, :, head].masked_fill(rows_on, -math.inf)[has].max(1).values
            margins.append(float((tgt - other).min()))
    residual = float((fitted - target)[used].abs().max())
    return (f"{carrier.name}: mlp ({carrier.squash}) first layer redrawn, last layer least squares, window "
            f"{carrier.window[0]}x{carrier.window[1]}, c={c:.4f}, residual max {residual:.3g}, worst target margin "
            f"{min(margins) if margins else float('nan'):.3f}")


@register("impulse", family="relbias", matches=is_relbias_vit, options=RelBiasImpulseOptions)
def impulse_relbias(model: nn.Module, generator: torch.Generator, options: RelBiasImpulseOptions) -> InitResult:
    """Impulse relative-position bias for BEiT / ``VisionTransformerRelPos`` (see the module docstring).

    Options (:class:`RelBiasImpulseOptions`): ``target_mass`` 0.75, ``bias`` None (fixed ``c``), ``kernel_size`` 3 |
    5, ``offsets`` "fixed" | "random", ``logit_scale`` (Swin v2 only), ``floor`` (``16·sigmoid`` MLPs only).
    """
    return _impulse(model, generator, options)


@register("impulse", family="swinv2", matches=is_swinv2, options=RelBiasImpulseOptions)
def impulse_swinv2(model: nn.Module, generator: torch.Generator, options: RelBiasImpulseOptions) -> InitResult:
    """Impulse continuous position bias for Swin v2 / v2-CR (least-squares last MLP layer; ``logit_scale``)."""
    return _impulse(model, generator, options)


# ---------------------------------------------------------------------------------------------------- diagnostics


def carrier_bias(carrier: Carrier) -> torch.Tensor:
    """The bias ``(heads, n, n)`` the carrier adds between patch tokens, from its current parameters (float32)."""
    if carrier.kind == "table":
        values = read_full(carrier.table).detach().float()
    else:
        with torch.no_grad():
            values = carrier.last(carrier.features().to(carrier.last.weight.dtype)).float()
        if carrier.squash == "sigmoid16":
            values = 16 * torch.sigmoid(values)
    return values[carrier.pair_rows].permute(2, 0, 1)


def _layer_bias(model: nn.Module) -> list[torch.Tensor]:
    carriers = bias_carriers(model)
    layers = max(i for users, _ in carriers for i in users) + 1
    out: list[torch.Tensor | None] = [None] * layers
    for users, carrier in carriers:
        bias = carrier_bias(carrier)
        for i in users:
            out[i] = bias if out[i] is None else out[i] + bias
    return [b for b in out if b is not None]


@register_attention_maps(matches=lambda m: is_relbias_vit(m) or is_swinv2(m))
def _relbias_maps(model: nn.Module, images: torch.Tensor | None) -> AttentionMaps:
    """``attention_maps`` for BEiT / relpos ViTs (grid = the patch grid; with images prefix tokens first) and Swin v2
    (grid = the window; with images averaged over batch and windows). Without images: ``softmax`` of each layer's
    bias between patch tokens (zero Q/K contribution, the analogue of the ViT pseudo-input).

    Raises:
        ValueError: Swin v2 blocks with different windows.
    """
    windows = sorted({c.window for _, c in bias_carriers(model)})
    if len(windows) != 1:
        raise ValueError(f"{type(model).__name__}: blocks use different windows {windows}; attention_maps needs one "
                         "window for all blocks")
    if images is None:
        return AttentionMaps([torch.softmax(b, -1) for b in _layer_bias(model)], windows[0], 0, "pseudo-input")
    maps = [m.mean(0) for m in captured_attention(model, images)]
    prefix = 0 if is_swinv2(model) else int(getattr(model, "num_prefix_tokens", 0))
    return AttentionMaps(maps, windows[0], prefix, "images")


def relbias_summary(model: nn.Module, offsets: list[list[tuple[int, int]]],
                    images: torch.Tensor | None = None) -> list[list[tuple[tuple[int, int], float, float]]]:
    """Per layer, per head ``(offset, hit_rate, target_mass)`` over interior queries, each layer on its own grid /
    window (Swin v2 stages may differ): without images ``softmax`` of the layer's bias between patch tokens; with
    images the model's own forward (averaged over batch and windows)."""
    from impulsevit.init.diagnostics import summarize

    carriers = bias_carriers(model)
    window_of: dict[int, tuple[int, int]] = {i: c.window for users, c in carriers for i in users}
    if images is None:
        maps, prefix = [torch.softmax(b, -1) for b in _layer_bias(model)], 0
    else:
        maps = [m.mean(0) for m in captured_attention(model, images)]
        prefix = 0 if is_swinv2(model) else int(getattr(model, "num_prefix_tokens", 0))
    out = []
    for layer, layer_map in enumerate(maps):
        rows = summarize([layer_map], [offsets[layer]], grid=window_of[layer], num_prefix=prefix)
        out.append([(s.offset, s.hit_rate, s.target_mass) for s in rows])
    return out
