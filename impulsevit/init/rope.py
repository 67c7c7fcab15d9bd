"""Rotary ViTs (timm ``Eva``: EVA-02, DINOv3, ``vit_*_rope_*`` / ``*_rope_mixed_*``, Perception Encoder): ``impulse``
as a *coherent sum* of rotary phases.

Construction (derived in ``impulsevit/init/FAMILIES.md``, "Rotary ViTs"). RoPE rotates a patch token's query and key
by ``R_p`` (block-diagonal 2×2 rotations, pair ``j`` by the angle ``ω_j·p``), so ``R_pᵀ R_p' = R_{p'−p}``. If every
patch query of head ``h`` is ``a_h`` and every key ``b_h`` before the rotation, the logit of query ``p`` and key ``p'``
depends only on ``Δ = p' − p``: ``a_hᵀ R_Δ b_h``. With ``b_h = R_tᵀ a_h`` (``t`` the head's one-tap offset) it is
``a_hᵀ R_{Δ−t} a_h = Σ_j w_j cos(ω_j·(Δ − t))`` (``w_j = |a_{h,j}|²``), maximal exactly at ``Δ = t`` — every frequency's
cosine is 1 there, elsewhere they disagree. The weights ``w`` (``Σ w = 1``) maximise the worst margin
``M = min_{δ≠0} Σ_j w_j (1 − cos(ω_j·δ))`` over all displacements ``δ`` of the grid (a zero-sum game solved by
multiplicative weights). The gain ``γ`` sets the strength: by default (``mass_rule="mean"``) it is solved per head so
the *mean* content-free share of the target key is ``m`` (0.25); ``mass_rule="worst_case"`` instead takes
``γ²·scale·M = c = ln(m(n−1)/(1−m))``, which gives every interior query at least the share ``m`` of a softmax over
``n`` keys when content is ignored.

Where the constant ``a_h`` / ``b_h`` comes from: the pre-attention LayerNorm centres every token, so its output (with
weight 1) has *no* component along ``u = 1/√D`` — a content-free direction. ``norm1.bias`` gets ``+u``;
``W_q``, ``W_k`` keep their (timm) content part with ``u`` projected out and get the rank-1 part ``γ a_h uᵀ`` /
``γ b_h uᵀ``; ``W_v`` has ``u`` projected out (values do not see the constant). Learnable Q/K biases are zeroed (a
bias would add a second, undesigned constant). So the same construction covers ``qkv_bias``, EVA's ``q_bias`` + fixed
zero ``k_bias``, and no bias, with or without ``pos_embed`` (it never reads it). ``R_p`` is taken from the model itself:
the ``rope`` tensor each block's attention receives (captured from a forward) applied, with timm's own
``apply_rot_embed_cat``, to the identity — so any layout (interleaved / half, Cat / Mixed per head / DINOv3) is handled.

Not supported: blocks other than ``EvaBlock`` (post-norm), a ``norm1`` without centring (RMSNorm), ``qk_norm``,
grouped-query attention with fewer K heads, rope applied to a token count that is not the patch grid.
``mimetic``: refused with one line (its ``W_qᵀW_k ≈ αZ + βI`` was not derived for rotated Q/K).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import torch
from torch import nn

from impulsevit.init.api import InitResult, read_full, register, write_full_
from impulsevit.init.baselines import base_values, write_values
from impulsevit.init.capture import captured_attention, module_calls
from impulsevit.init.diagnostics import AttentionMaps, register_attention_maps
from impulsevit.init.impulse import impulse_offsets
from impulsevit.init.kinds import is_rope_vit
from impulsevit.init.options import OPEN, TargetMassOptions, as_dict

__all__ = ["is_rope_vit", "rope_rotations", "phase_weights", "rope_plan"]


def _grid(model: nn.Module) -> tuple[int, int]:
    return tuple(int(g) for g in model.patch_embed.grid_size)


def _captured_ropes(model: nn.Module) -> list[torch.Tensor]:
    """The ``rope`` tensor each block's attention receives in the model's own forward (eval mode)."""
    H, W = _grid(model)
    patch = model.patch_embed.patch_size
    images = torch.zeros(1, model.patch_embed.proj.in_channels, H * patch[0], W * patch[1])
    calls = module_calls(model, [blk.attn for blk in model.blocks], images, method="forward_features")
    return [c.kwargs["rope"] for c in calls]


def rope_rotations(rope: torch.Tensor, head_dim: int, half: bool) -> torch.Tensor:
    """``R_p`` for every patch position: ``(heads_or_1, N, d, d)`` float64, ``R_p x`` = timm's rotation of ``x`` at
    ``p``."""
    from timm.layers import apply_rot_embed_cat

    emb = rope.double()
    n = emb.shape[-2]
    eye = torch.eye(head_dim, dtype=torch.float64).reshape(head_dim, 1, 1, head_dim).expand(head_dim, 1, n, head_dim)
    out = apply_rot_embed_cat(eye, emb, half=half)  # (d_in, heads_or_1, N, d_out)
    return out.permute(1, 2, 3, 0).contiguous()


def _pairs(rot_step: torch.Tensor) -> list[tuple[int, int]]:
    """The 2-D planes the rotations act on, from one rotation matrix (its off-diagonal support)."""
    d = rot_step.shape[0]
    pairs, seen = [], set()
    for i in range(d):
        if i in seen:
            continue
        partner = [j for j in range(d) if j != i and abs(float(rot_step[i, j])) > 1e-9]
        j = partner[0] if partner else i  # a dimension no rotation touches: frequency 0
        pairs.append((i, j))
        seen.update((i, j))
    return pairs


def phase_weights(freqs: torch.Tensor, grid: tuple[int, int], iters: int = 500) -> tuple[torch.Tensor, float]:
    """Weights ``w ≥ 0``, ``Σ w = 1`` over rotary pairs maximising ``min_{δ≠0} Σ_j w_j (1 − cos(ω_j·δ))`` over all
    displacements ``|δy| ≤ 2(H−1)``, ``|δx| ≤ 2(W−1)`` (multiplicative weights on the zero-sum game).

    Args:
        freqs: ``(pairs, 2)`` angle per unit step down / right.

    Returns:
        ``w`` ``(pairs,)`` float64 and the margin ``M`` it reaches.
    """
    H, W = grid
    dy, dx = torch.meshgrid(torch.arange(-2 * (H - 1), 2 * H - 1), torch.arange(-2 * (W - 1), 2 * W - 1),
                            indexing="ij")
    deltas = torch.stack([dy.flatten(), dx.flatten()], 1).double()
    deltas = deltas[(deltas != 0).any(1)]
    gain = 1 - torch.cos(deltas @ freqs.double().T)  # (deltas, pairs), in [0, 2]
    w = torch.full((freqs.shape[0],), 1.0 / freqs.shape[0], dtype=torch.float64)
    best_w, best = w.clone(), float((gain @ w).min())
    dual = torch.full((deltas.shape[0],), 1.0 / deltas.shape[0], dtype=torch.float64)
    eta = math.sqrt(math.log(max(deltas.shape[0], 2)) / iters)
    for _ in range(iters):  # adversary puts weight on the worst displacements, we best-respond on average
        pay = gain @ w
        dual = dual * torch.exp(-eta * pay)
        dual = dual / dual.sum()
        response = dual @ gain  # (pairs,)
        w = w * torch.exp(eta * response)
        w = w / w.sum()
        margin = float((gain @ w).min())
        if margin > best:
            best_w, best = w.clone(), margin
    return best_w, best


def _offset_rotation(rot: torch.Tensor, grid: tuple[int, int], offset: tuple[int, int]) -> torch.Tensor:
    """``R_t = R_{p0}ᵀ R_{p0+t}`` at a position ``p0`` whose neighbour at ``t`` is on the grid."""
    H, W = grid
    dy, dx = offset
    r0, c0 = max(0, -dy), max(0, -dx)
    return rot[r0 * W + c0].T @ rot[(r0 + dy) * W + c0 + dx]


def rope_plan(rot: torch.Tensor, grid: tuple[int, int], offsets: list[tuple[int, int]], *, flip: bool = False
              ) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """Per head ``(a_h, b_h, M_h)``: unit-norm pre-rotation query / key constants and the margin of the weights.

    Args:
        rot: ``(heads_or_1, N, d, d)`` from :func:`rope_rotations`.
        flip: use ``b = R_t a`` (the phase sign flipped: peaks at ``−t``); for tests only.
    """
    H, W = grid
    plans = []
    solved: dict[bytes, tuple[torch.Tensor, float]] = {}  # heads sharing frequencies share the weights
    for head, offset in enumerate(offsets):
        r = rot[head if rot.shape[0] > 1 else 0]
        step_y, step_x = _offset_rotation(r, grid, (1, 0)), _offset_rotation(r, grid, (0, 1))
        pairs = _pairs(step_y + step_x - 2 * torch.eye(r.shape[-1], dtype=r.dtype))
        freqs = torch.tensor([[math.atan2(float(s[j, i]), float(s[i, i])) if i != j else 0.0
                               for s in (step_y, step_x)] for i, j in pairs], dtype=torch.float64)
        key = freqs.numpy().tobytes()
        if key not in solved:
            solved[key] = phase_weights(freqs, (H, W))
        w, margin = solved[key]
        a = torch.zeros(r.shape[-1], dtype=torch.float64)
        for (i, _), wj in zip(pairs, w):
            a[i] = math.sqrt(float(wj))
        rt = _offset_rotation(r, grid, offset)
        b = rt @ a if flip else rt.T @ a
        plans.append((a, b, margin))
    return plans


def _attention_parts(name: str, index: int, blk: nn.Module) -> dict[str, Any]:
    from timm.models.eva import EvaBlock

    if not isinstance(blk, EvaBlock):
        raise ValueError(f"{name}: block {index} is {type(blk).__name__}; the rotary impulse needs a pre-norm EvaBlock")
    if not isinstance(blk.norm1, nn.LayerNorm) or blk.norm1.bias is None:
        raise ValueError(f"{name}: block {index} norm1 is {type(blk.norm1).__name__}; the rotary impulse needs a "
                         "centring LayerNorm with a bias (its all-ones direction carries the constant)")
    attn = blk.attn
    for norm in ("q_norm", "k_norm"):
        if not isinstance(getattr(attn, norm, nn.Identity()), nn.Identity):
            raise ValueError(f"{name}: block {index} uses {norm} (qk_norm=True); not supported by the rotary impulse")
    heads = int(attn.num_heads)
    if getattr(attn, "qkv", None) is not None:
        width = attn.qkv.out_features // 3
        if attn.qkv.out_features != 3 * width:
            raise ValueError(f"{name}: block {index} qkv has {attn.qkv.out_features} rows (grouped-query attention); "
                             "not supported")
        weights = {"q": (attn.qkv.weight, slice(0, width)), "k": (attn.qkv.weight, slice(width, 2 * width)),
                   "v": (attn.qkv.weight, slice(2 * width, 3 * width))}
        biases = []
        if attn.qkv.bias is not None:
            biases.append((attn.qkv.bias, slice(0, 2 * width)))
    else:
        width = attn.q_proj.out_features
        if attn.k_proj.out_features != width:
            raise ValueError(f"{name}: block {index} has {attn.k_proj.out_features} key rows for {width} query rows "
                             "(grouped-query attention); not supported")
        weights = {p: (getattr(attn, f"{p}_proj").weight, slice(None)) for p in "qkv"}
        biases = [(getattr(attn, f"{p}_proj").bias, slice(None)) for p in "qk"
                  if getattr(attn, f"{p}_proj").bias is not None]
    if isinstance(getattr(attn, "q_bias", None), nn.Parameter):
        biases.append((attn.q_bias, slice(None)))
    if isinstance(getattr(attn, "k_bias", None), nn.Parameter):
        biases.append((attn.k_bias, slice(None)))
    head_dim = width // heads
    return {"attn": attn, "heads": heads, "head_dim": head_dim, "weights": weights, "biases": biases,
            "norm": blk.norm1, "scale": float(getattr(attn, "scale", head_dim**-0.5)),
            "half": bool(getattr(attn, "rotate_half", False))}


@dataclasses.dataclass(frozen=True)
class RopeImpulseOptions(TargetMassOptions):
    """``impulse`` on rotary ViTs: ``target_mass``, ``mass_rule``, ``kernel_size``, ``offsets``, ``flip_phase`` and
    ``base`` (see :func:`impulse_rope`)."""

    target_mass: float = 0.25
    flip_phase: bool = False
    mass_rule: Literal["worst_case", "mean"] = "mean"


def _content_free_mass(q: torch.Tensor, k: torch.Tensor, prefix_k: torch.Tensor, prefix: int, target: torch.Tensor,
                       gain2: float) -> float:
    """Mean softmax share of the target key over the queries that have one, with logits ``gain2 · q·k`` (float64)."""
    logits = gain2 * (q @ k.T)  # (N, N)
    if prefix:
        logits = torch.cat([logits, (gain2 * (q @ prefix_k)).unsqueeze(1).expand(-1, prefix)], 1)
    rows = (target >= 0).nonzero().squeeze(1)
    share = torch.softmax(logits[rows], -1).gather(1, target[rows].unsqueeze(1))
    return float(share.mean())


def calibrated_gain2(rot: torch.Tensor, grid: tuple[int, int], offset: tuple[int, int], a: torch.Tensor,
                     b: torch.Tensor, scale: float, prefix: int, mass: float) -> tuple[float, float]:
    """``γ²`` such that the mean content-free share of the target key over the queries that have one is ``mass``.

    The content-free logit of patch query ``p`` and key ``p'`` is ``scale·γ²·(R_p a)·(R_p' b)``; a prefix key is not
    rotated (``scale·γ²·(R_p a)·b``). The mean target share grows monotonically with ``γ²`` (each query's maximum is
    its target), so a bisection on ``log γ²`` finds it.

    Args:
        rot: ``(N, d, d)`` rotations of one head. a, b: ``(d,)`` its unit constants (:func:`rope_plan`).
        prefix: prefix (class / register) keys every query also sees.
        mass: wanted mean share, in (0, 1).

    Returns:
        ``(γ², mass reached)``: the largest reachable share when ``mass`` is above it (prefix keys that tie with the
        target), the uniform ``γ² = 0`` when ``mass`` is below ``1 / keys``.
    """
    H, W = grid
    q = torch.einsum("pij,j->pi", rot, a)
    k = torch.einsum("pij,j->pi", rot, b)
    dy, dx = offset
    target = torch.tensor([(r + dy) * W + c + dx if 0 <= r + dy < H and 0 <= c + dx < W else -1
                           for r in range(H) for c in range(W)])
    lo, hi = -12.0, 12.0
    if _content_free_mass(q, k, b, prefix, target, math.exp(lo) * scale) >= mass:
        return 0.0, _content_free_mass(q, k, b, prefix, target, 0.0)
    top = _content_free_mass(q, k, b, prefix, target, math.exp(hi) * scale)
    if top <= mass:
        return math.exp(hi), top
    for _ in range(40):
        mid = (lo + hi) / 2
        if _content_free_mass(q, k, b, prefix, target, math.exp(mid) * scale) < mass:
            lo = mid
        else:
            hi = mid
    return math.exp(hi), _content_free_mass(q, k, b, prefix, target, math.exp(hi) * scale)


@register("impulse", family="rope", matches=is_rope_vit, options=RopeImpulseOptions)
def impulse_rope(model: nn.Module, generator: torch.Generator, options: RopeImpulseOptions) -> InitResult:
    """Coherent-phase rotary impulse (see the module docstring).

    Options: ``target_mass`` 0.25 and ``mass_rule``: with ``"mean"`` (default) ``target_mass`` is the mean
    content-free share of the target key over the queries that have one, solved per head by
    :func:`calibrated_gain2` (the share realised on real images is then close to it over the whole range: 0.24 at
    0.25); with ``"worst_case"`` (the construction's first rule, kept as an option) ``target_mass`` is a lower bound,
    the share of an interior query when content is ignored AND every other key had the worst displacement's margin
    ``M`` (the share realised is far higher: 0.95 on real images at 0.75, 0.73 at 0.25). The default is measured
    (``docs/results.md``, "Like for like", paired seeds, base torch): ``mean`` 0.25 vs ``worst_case`` 0.75 is +6.2
    points on the RoPE-only ViT, +2.0 on DINOv3-style (5 seeds, interval crosses zero) and −0.25 on EVA-02 (a tie);
    ``kernel_size`` 3 | 5, ``offsets`` "fixed" | "random", ``flip_phase`` False (True builds the mirrored, wrong
    construction: a negative control for tests), ``base`` "torch" | "keep": what every other weight starts as —
    "torch" (default) first gives every module its PyTorch constructor init, as the ``torch`` method does and as the
    ViT family's ``base`` does (the paper's pipeline builds its ViTs with timm's ``weight_init='skip'``, i.e.
    constructor init, and changes only the attention); "keep" keeps the model's own init (timm's ``Eva`` always
    applies its truncated-normal init). The default is measured: on the RoPE-only, EVA-02 and DINOv3-style CPU
    studies (3 seeds each, ``docs/results.md``) "torch" trains about 10 points better than "keep" on every one of
    the three.
    """
    opts = options
    values, notes = base_values(model, generator, opts.base)
    write_values(model, values)
    m = float(opts.target_mass)
    name = type(model).__name__
    parts = [_attention_parts(name, i, blk) for i, blk in enumerate(model.blocks)]
    ropes = _captured_ropes(model)
    grid = _grid(model)
    n_patch = grid[0] * grid[1]
    if len(ropes) != len(parts) or any(r.shape[-2] != n_patch for r in ropes):
        raise ValueError(f"{name}: rope does not cover the {grid[0]}x{grid[1]} patch grid in every block")
    keys = n_patch + int(model.num_prefix_tokens)
    c = math.log(m * (keys - 1) / (1 - m))
    offsets, margins, reached = [], [], []
    cache: dict[tuple, list] = {}
    for index, (part, rope) in enumerate(zip(parts, ropes)):
        d, heads = part["head_dim"], part["heads"]
        head_offsets = impulse_offsets(heads, opts.kernel_size, opts.offsets, generator=generator)
        key = (rope.data_ptr(), tuple(rope.shape), tuple(head_offsets))
        if key not in cache or rope.dim() > 2:
            rot = rope_rotations(rope.squeeze(0) if rope.dim() == 4 else rope, d, part["half"])
            if rot.shape[0] not in (1, heads):
                raise ValueError(f"{name}: block {index} rope has {rot.shape[0]} head rotations for {heads} heads")
            cache[key] = rope_plan(rot, grid, head_offsets, flip=bool(opts.flip_phase))
        plans = cache[key]
        if opts.mass_rule == "mean":
            if (key, "mean") not in cache or rope.dim() > 2:
                rot = rope_rotations(rope.squeeze(0) if rope.dim() == 4 else rope, d, part["half"])
                cache[(key, "mean")] = [
                    calibrated_gain2(rot[h if rot.shape[0] > 1 else 0], grid, head_offsets[h], a, b, part["scale"],
                                     int(model.num_prefix_tokens), m) for h, (a, b, _) in enumerate(plans)]
            solved = cache[(key, "mean")]
            gains = [math.sqrt(g2) for g2, _ in solved]
            reached.extend(r for _, r in solved)
        else:
            gains = [math.sqrt(c / (part["scale"] * margin)) for _, _, margin in plans]
        dim = part["norm"].normalized_shape[0]
        u = torch.full((dim,), 1 / math.sqrt(dim), dtype=torch.float64)
        proj = torch.eye(dim, dtype=torch.float64) - torch.outer(u, u)
        writes = {}
        for which in "qkv":
            param, rows = part["weights"][which]
            full = writes.get(id(param), (param, read_full(param).detach().double().clone()))[1]
            full[rows] = full[rows] @ proj
            if which != "v":
                block = full[rows]
                for head, (a, b, _) in enumerate(plans):
                    vec = a if which == "q" else b
                    block[head * d:(head + 1) * d] += gains[head] * torch.outer(vec, u)
                full[rows] = block
            writes[id(param)] = (param, full)
        for param, full in writes.values():
            write_full_(param, full)
        for param, rows in part["biases"]:
            full = read_full(param).detach().double().clone()
            full[rows] = 0.0
            write_full_(param, full)
        bias = read_full(part["norm"].bias).detach().double()
        write_full_(part["norm"].bias, bias @ proj + u)
        offsets.append(head_offsets)
        margins.extend(p[2] for p in plans)
    notes.append(f"coherent rotary phases: c={c:.4f}, per-head frequency margin M min {min(margins):.4f} / max "
                 f"{max(margins):.4f} (gain² = c / (scale·M)); constant carried by norm1.bias along 1/√D")
    if reached:
        notes.append(f"mass_rule='mean': γ per head so the mean content-free target share is {m:g} (reached min "
                     f"{min(reached):.4f} / max {max(reached):.4f})")
    if opts.flip_phase:
        notes.append("flip_phase=True: phase sign flipped, each head peaks at the OPPOSITE offset (negative control)")
    return InitResult(options=as_dict(opts), offsets=offsets, notes=notes)


@register("mimetic", family="rope", matches=is_rope_vit, options=OPEN)
def mimetic_rope(model: nn.Module, generator: torch.Generator, options: dict[str, Any]) -> InitResult:
    """Refuses: mimetic's ``W_qᵀ W_k ≈ αZ + βI`` assumes unrotated Q/K (one-line ``ValueError``, whatever the
    options: the refusal is the answer)."""
    raise ValueError(f"{type(model).__name__} uses rotary position embeddings: mimetic's W_q^T W_k ~ aZ + bI is "
                     "defined for unrotated Q/K and is not derived for RoPE; use impulse, torch or timm")


@register_attention_maps(matches=is_rope_vit)
def _rope_maps(model: nn.Module, images: torch.Tensor | None) -> AttentionMaps:
    """``attention_maps`` for rotary ViTs: with images the model's own forward (prefix tokens first); without, the
    forward of an all-zero image with ``pos_embed`` (if any) — the content-free input the construction designs for."""
    grid = _grid(model)
    prefix = int(model.num_prefix_tokens)
    if images is None:
        patch = model.patch_embed.patch_size
        images = torch.zeros(1, model.patch_embed.proj.in_channels, grid[0] * patch[0], grid[1] * patch[1])
        maps = [mp.mean(0)[:, prefix:, prefix:] for mp in captured_attention(model, images, list(model.blocks))]
        maps = [mp / mp.sum(-1, keepdim=True) for mp in maps]
        return AttentionMaps(maps, grid, 0, "pseudo-input")
    maps = [mp.mean(0) for mp in captured_attention(model, images, list(model.blocks))]
    return AttentionMaps(maps, grid, prefix, "images")
