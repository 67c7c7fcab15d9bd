"""The math of impulse (structured) initialization: offsets, target logits, pseudo-input, Q/K solve, V/proj factors.

Pure functions, tensors in and tensors out; nothing here knows about ``nn.Module``. The model adapter is
:mod:`impulsevit.init.vit`; the spec is ``docs/method.md`` §2 (released algorithm) and §3 (older variants).

Conventions (``docs/method.md`` §1): a token grid of ``height × width`` patch tokens in row-major order, token
``t(r, c) = r·width + c``; an offset ``(dy, dx)`` makes the query at ``(r, c)`` attend to the key at
``(r + dy, c + dx)`` (``dy > 0`` = down, ``dx > 0`` = right). Weights are ``out × in`` (timm / ``nn.Linear``),
tokens are row vectors.

The Q/K solve uses the rank-``r`` subspace formulation: with ``P = U Σ Vᵀ`` (top ``r``), the released per-head
``B_i = P⁺ T_i P⁺ᵀ`` equals ``V_r M_i V_rᵀ`` with the ``r × r`` matrix ``M_i = Σ_r⁻¹ U_rᵀ T_i U_r Σ_r⁻¹``, so one
batched ``r × r`` SVD per layer replaces one ``D × D`` SVD per head, and ``T_i U_r`` is computed from the shift as a
row gather plus the dense noise product — ``T_i`` is never materialised.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import torch

from impulsevit.init.rng import numpy_stream, truncated_normal

__all__ = [
    "PRIORITY_3X3",
    "kernel_offsets",
    "impulse_offsets",
    "shift_index",
    "impulse_indicator",
    "draw_noise",
    "target_logits",
    "layer_norm_rows",
    "PseudoInput",
    "factor_pseudo_input",
    "QKSolution",
    "solve_qk",
    "solve_qk_calibrated",
    "balanced_factors",
    "draw_value_matrix",
    "value_proj_from",
    "value_proj_factors",
    "mimetic_qk_factors",
    "draw_mimetic_qk_targets",
]

Offset = tuple[int, int]
Boundary = Literal["zero", "circular"]

PRIORITY_3X3: tuple[int, ...] = (4, 1, 5, 3, 7, 0, 2, 6, 8)
"""Released order of 3×3 kernel positions (row-major, 4 = centre): self, up, right, left, down, up-left, up-right,
down-left, down-right (``docs/method.md`` §2.1)."""


def kernel_offsets(kernel_size: int = 3) -> list[Offset]:
    """All ``kernel_size²`` offsets in priority order.

    ``kernel_size = 3`` gives the released order (``PRIORITY_3X3``). ``kernel_size = 5`` starts with those 9 and then
    the 16 offsets of the outer ring, ordered by Euclidean distance (the four axis offsets at distance 2, then the
    eight knight moves, then the four corners), within a distance clockwise from "up" — so every 5×5 position occurs
    exactly once (the released code's index arithmetic for k = 5 is wrong, ``docs/method.md`` §2.1).

    Raises:
        ValueError: ``kernel_size`` not 3 or 5.
    """
    if kernel_size not in (3, 5):
        raise ValueError(f"kernel_size must be 3 or 5, got {kernel_size!r}")
    inner = [(m // 3 - 1, m % 3 - 1) for m in PRIORITY_3X3]
    if kernel_size == 3:
        return inner
    ring = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3) if max(abs(dy), abs(dx)) == 2]
    # clockwise angle from "up" (dy = -1 is up): atan2(dx, -dy) in [0, 2π)
    ring.sort(key=lambda o: (o[0] ** 2 + o[1] ** 2, math.atan2(o[1], -o[0]) % (2 * math.pi)))
    return inner + ring


def impulse_offsets(
    num_heads: int,
    kernel_size: int = 3,
    mode: Literal["fixed", "random"] = "fixed",
    *,
    generator: torch.Generator | None = None,
    replacement: bool = True,
) -> list[Offset]:
    """One ``(dy, dx)`` offset per head.

    Args:
        num_heads: ``h ≥ 1``.
        kernel_size: 3 or 5.
        mode: ``fixed`` — head ``i`` gets ``kernel_offsets(k)[i mod k²]`` (released, ``docs/method.md`` §2.1);
            ``random`` — drawn from ``generator``: with replacement ``randint(k²)`` per head (the earlier release,
            ``docs/method.md`` §3), without replacement a fresh ``randperm(k²)`` per block of ``k²`` heads (so all
            positions appear before any repeats).
        generator: required for ``random``; unused for ``fixed``.
        replacement: only for ``random``.

    Returns:
        ``num_heads`` offsets.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    table = kernel_offsets(kernel_size)
    num_positions = len(table)
    if mode == "fixed":
        return [table[i % num_positions] for i in range(num_heads)]
    if mode != "random":
        raise ValueError(f"offset mode must be 'fixed' or 'random', got {mode!r}")
    if generator is None:
        raise ValueError("random offsets need a torch.Generator")
    if replacement:
        positions = torch.randint(0, num_positions, (num_heads,), generator=generator).tolist()
    else:
        blocks = [torch.randperm(num_positions, generator=generator) for _ in range(-(-num_heads // num_positions))]
        positions = torch.cat(blocks)[:num_heads].tolist()
    return [table[j] for j in positions]


def shift_index(height: int, width: int, offset: Offset, boundary: Boundary = "zero") -> torch.Tensor:
    """For every query token, the index of its target key token, or ``-1`` when the neighbour is off the grid.

    Returns:
        ``LongTensor (N,)``, ``N = height·width``. With ``boundary='circular'`` every entry is valid (wrap-around,
        block-circulant target); with ``'zero'`` (released) border queries whose neighbour is outside get ``-1``.
    """
    dy, dx = offset
    r = torch.arange(height).view(-1, 1).expand(height, width)
    c = torch.arange(width).view(1, -1).expand(height, width)
    target_r, target_c = r + dy, c + dx
    if boundary == "circular":
        return ((target_r % height) * width + target_c % width).reshape(-1)
    if boundary != "zero":
        raise ValueError(f"boundary must be 'zero' or 'circular', got {boundary!r}")
    inside = (target_r >= 0) & (target_r < height) & (target_c >= 0) & (target_c < width)
    return torch.where(inside, target_r * width + target_c, torch.full_like(target_r, -1)).reshape(-1)


def impulse_indicator(height: int, width: int, offset: Offset, boundary: Boundary = "zero") -> torch.Tensor:
    """The 0/1 impulse matrix ``S`` (``N × N``, float64): ``S[q, shift_index(q)] = 1`` for valid queries."""
    idx = shift_index(height, width, offset, boundary)
    n = height * width
    s = torch.zeros(n, n, dtype=torch.float64)
    valid = torch.nonzero(idx >= 0).squeeze(1)
    s[valid, idx[valid]] = 1.0
    return s


def draw_noise(num_heads: int, num_tokens: int, generator: torch.Generator, std: float = 0.6, clip: float = 2.0):
    """The target noise ``E``: ``(num_heads, N, N)`` float32, i.i.d. truncated normal (mean 0, ``std``, cut at the
    absolute interval ``[−clip, clip]``), drawn in one call (one seed from ``generator``, see
    :func:`impulsevit.init.rng.truncated_normal`) so the order is layer-major, then head, then row."""
    return truncated_normal((num_heads, num_tokens, num_tokens), generator, std=std, clip=clip)


def target_logits(
    height: int,
    width: int,
    offsets: Sequence[Offset],
    noise: torch.Tensor,
    *,
    on_value: float = 1000.0,
    noise_scale: float = 3.0,
    boundary: Boundary = "zero",
) -> torch.Tensor:
    """Dense target logits ``T_i = a·S_i + b·E_i ⊙ (1 − S_i)`` (``docs/method.md`` §2.2), ``(h, N, N)`` float64.

    Only for tests and reference formulations; :func:`solve_qk` never builds it.
    """
    t = noise_scale * noise.to(torch.float64)
    for i, off in enumerate(offsets):
        s = impulse_indicator(height, width, off, boundary)
        t[i] = on_value * s + t[i] * (1 - s)
    return t


def layer_norm_rows(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``LN0``: each row standardised over the last axis (population variance, ``eps`` inside the root), no affine —
    ``torch.nn.functional.layer_norm`` without weight and bias, in ``x``'s dtype (float64 for the pseudo-input).

    Shapes: ``(..., D) -> (..., D)``."""
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps)


@dataclasses.dataclass(frozen=True)
class PseudoInput:
    """Top-``rank`` SVD of the pseudo-input ``P ≈ U diag(s) Vᵀ`` (float64).

    Attributes:
        u: ``(N, rank)`` left singular vectors (token space).
        s: ``(rank,)`` singular values, descending.
        v: ``(D, rank)`` right singular vectors (feature space).
        rank: the rank used, ``min(head_dim, numerical rank)``.
        numerical_rank: number of singular values above ``rtol · s_max``.
        spectrum: all singular values of ``P``.
    """

    u: torch.Tensor
    s: torch.Tensor
    v: torch.Tensor
    rank: int
    numerical_rank: int
    spectrum: torch.Tensor


def factor_pseudo_input(p: torch.Tensor, head_dim: int, rtol: float = 1e-5) -> PseudoInput:
    """SVD of the (already layer-normed) pseudo-input ``P`` (``N × D``) truncated at ``min(head_dim, numerical rank)``.

    The released code always uses rank ``head_dim`` (its ``P⁺`` inverts whatever is there); truncating at the
    numerical rank (singular values ``> rtol · s_max``) is the fix for rank-deficient pseudo-inputs (sin-cos tables,
    ``N < head_dim``); the caller decides whether that is allowed.
    """
    p = p.to(torch.float64)
    if p.shape[0] < p.shape[1]:  # LAPACK is faster on tall matrices: P = (Pᵀ)ᵀ
        v_full, s, uh = torch.linalg.svd(p.T, full_matrices=False)
        u, vh = uh.T, v_full.T
    else:
        u, s, vh = torch.linalg.svd(p, full_matrices=False)
    numerical = int((s > rtol * s[0]).sum()) if s.numel() else 0
    r = min(head_dim, numerical)
    if r < 1:
        raise ValueError("pseudo-input has rank 0 (all-constant position embedding?)")
    return PseudoInput(u=u[:, :r], s=s[:r], v=vh[:r].T, rank=r, numerical_rank=numerical, spectrum=s)


@dataclasses.dataclass
class QKSolution:
    """Result of :func:`solve_qk` for one layer.

    Attributes:
        wq, wk: ``(h, head_dim, D)`` (``dtype`` of :func:`solve_qk`) — head ``i``'s rows of ``qkv.weight`` (Q block,
            K block). Rows beyond the solve rank are zero.
        scale: ``(h,)`` the factor ``c_i`` in ``Λ_i = c_i · Π_r T_i Π_r`` (logits on the pseudo-input, incl. ``1/√d``).
        target_logit: ``(h,)`` mean of ``Λ_i`` over the head's target entries (nan for a head with none).
    """

    wq: torch.Tensor
    wk: torch.Tensor
    scale: torch.Tensor
    target_logit: torch.Tensor


def _target_pairs(
    height: int, width: int, offsets: Sequence[Offset], boundary: Boundary
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per head: the indices of the queries whose target is on the grid, and of their target keys (LongTensors)."""
    queries, targets = [], []
    for offset in offsets:
        target_of = shift_index(height, width, offset, boundary)
        valid = torch.nonzero(target_of >= 0).squeeze(1)
        queries.append(valid)
        targets.append(target_of[valid])
    return queries, targets


def solve_qk(
    pseudo: PseudoInput,
    height: int,
    width: int,
    offsets: Sequence[Offset],
    noise: torch.Tensor,
    head_dim: int,
    *,
    on_value: float = 1000.0,
    noise_scale: float = 3.0,
    boundary: Boundary = "zero",
    gain: float = 7.0,
    normalize: Literal["frobenius", "logit"] = "frobenius",
    target_logit: float = 5.0,
    dtype: torch.dtype = torch.float64,
) -> QKSolution:
    """Closed-form Q/K of one layer, all heads batched (``docs/method.md`` §2.4, subspace formulation).

    Args:
        pseudo: the factored pseudo-input (:func:`factor_pseudo_input`), ``N = height·width`` rows.
        offsets: ``h`` offsets.
        noise: ``(h, N, N)`` the draw of :func:`draw_noise` for this layer.
        head_dim: ``d``; the logit scale ``1/√d`` is the model's.
        on_value, noise_scale: ``a`` and ``b`` of the target (``docs/method.md`` §2.2).
        gain: ``γ_q``; with ``normalize='frobenius'`` (released) ``‖W_q^{(i)}‖_F = ‖W_k^{(i)}‖_F = γ_q``.
        normalize: ``'logit'`` instead sets both factors to equal norm so that the mean logit on the head's target
            entries (over valid queries, on the pseudo-input) equals ``target_logit`` — the scale rule for
            rank-deficient pseudo-inputs, where the Frobenius rule collapses the logits to ≈ 0.
        dtype: of ``wq`` / ``wk`` and of the two large products (noise ``E_i U_r`` and the expansion ``… V_rᵀ`` to
            ``D`` columns); ``float32`` when the weights are stored in float32 anyway (relative error ~1e-7). The
            ``r × r`` solve and the impulse part of the target are float64 always.

    Returns:
        :class:`QKSolution`. Heads whose target has no valid query (impossible for k ≤ grid size) fall back to the
        Frobenius rule.
    """
    h = len(offsets)
    n = height * width
    if pseudo.u.shape[0] != n:
        raise ValueError(f"pseudo-input has {pseudo.u.shape[0]} rows, grid {height}x{width} has {n} tokens")
    if tuple(noise.shape) != (h, n, n):
        raise ValueError(f"noise must be (h, N, N) = ({h}, {n}, {n}), got {tuple(noise.shape)}")
    u, s, v, r = pseudo.u, pseudo.s, pseudo.v, pseudo.rank
    queries, targets = _target_pairs(height, width, offsets, boundary)
    e = noise.to(dtype)
    # X_i = U_rᵀ T_i U_r with T_i = a S_i + b (E_i − E_i ⊙ S_i)
    u_cast = u.to(dtype)
    x = noise_scale * torch.matmul(u_cast.T, torch.matmul(e, u_cast)).double()  # (h, r, r)
    for i in range(h):
        query, target = queries[i], targets[i]
        if query.numel() == 0:
            continue
        u_query, u_target = u[query], u[target]  # (m, r)
        replaced = e[i, query, target].double()  # (m,) noise entries that S replaces
        x[i] += u_query.T @ ((on_value - noise_scale * replaced).unsqueeze(1) * u_target)
    inv_s = 1.0 / s
    m = inv_s.view(1, -1, 1) * x * inv_s.view(1, 1, -1)  # M_i = Σ⁻¹ X_i Σ⁻¹
    a, mu, ct = torch.linalg.svd(m)  # (h, r, r), (h, r), (h, r, r)
    a, ct = _fix_signs(a, ct)
    root = mu.sqrt()
    nuclear = mu.sum(1)  # ‖F_i‖² = ‖G_i‖² = Σ μ
    # target entries of Π T Π: U_r[q] X U_r[t]ᵀ  (Λ_i = c_i Π T_i Π)
    target_mean = torch.full((h,), float("nan"), dtype=torch.float64)
    for i in range(h):
        if queries[i].numel():
            target_mean[i] = ((u[queries[i]] @ x[i]) * u[targets[i]]).sum(1).mean()
    sqrt_d = math.sqrt(head_dim)
    if normalize == "frobenius":
        coef = torch.full((h,), gain, dtype=torch.float64) / nuclear.sqrt()  # applied to each factor
    elif normalize == "logit":
        # Λ_i = coef² / √d · Π T Π  ⇒ coef² = target_logit · √d / target_mean_i
        ok = torch.isfinite(target_mean) & (target_mean > 0)
        coef = torch.where(ok, (target_logit * sqrt_d / target_mean.clamp_min(1e-300)).sqrt(), gain / nuclear.sqrt())
    else:
        raise ValueError(f"normalize must be 'frobenius' or 'logit', got {normalize!r}")
    # W_q^(i) = c_i (V_r A_i diag(√μ_i))ᵀ = (c_i diag(√μ_i) A_iᵀ) V_rᵀ, W_k^(i) likewise with C_i (= ctᵀ)
    w = coef.view(-1, 1, 1) * root.unsqueeze(2)  # (h, r, 1)
    factors = torch.cat([w * a.transpose(1, 2), w * ct]).to(dtype)  # (2h, r, r)
    wqk = torch.matmul(factors, v.T.to(dtype))  # (2h, r, D), one product for both
    wq_r, wk_r = wqk[:h], wqk[h:]
    if r < head_dim:  # rows beyond the solve rank stay zero
        pad = (0, 0, 0, head_dim - r)
        wq_r, wk_r = torch.nn.functional.pad(wq_r, pad), torch.nn.functional.pad(wk_r, pad)
    scale = coef**2 / sqrt_d
    return QKSolution(wq=wq_r, wk=wk_r, scale=scale, target_logit=scale * target_mean)


def _inverse_root(gram: torch.Tensor, ridge: float, rtol: float) -> torch.Tensor:
    """``(G + λI)^{-1/2}`` of a symmetric PSD ``gram`` (``D × D``, float64) with ``λ = ridge · mean eigenvalue``;
    directions with an eigenvalue ``<= rtol · max`` are dropped (a pseudo-inverse root: a rank-deficient ``G``
    keeps its null space out of the solve)."""
    evals, q = torch.linalg.eigh(gram)
    top = evals.max().clamp_min(0)
    keep = evals > rtol * top
    inv = torch.where(keep, 1.0 / (evals.clamp_min(0) + ridge * evals.clamp_min(0).mean()).sqrt(),
                      torch.zeros_like(evals))
    return (q * inv) @ q.T


def solve_qk_calibrated(
    rows: torch.Tensor,
    height: int,
    width: int,
    offsets: Sequence[Offset],
    noise: torch.Tensor,
    head_dim: int,
    *,
    on_value: float = 1000.0,
    noise_scale: float = 3.0,
    boundary: Boundary = "zero",
    gain: float = 7.0,
    normalize: Literal["frobenius", "logit"] = "frobenius",
    target_logit: float = 5.0,
    ridge: float = 0.1,
    rtol: float = 1e-5,
    dtype: torch.dtype = torch.float64,
) -> QKSolution:
    """Q/K of one layer solved for a batch of real inputs instead of one pseudo-input (the content-aware solve of
    ``pseudo_input='calibration'``; not the released algorithm).

    With ``X_b`` the block's normed patch tokens on calibration image ``b`` (``N × D``), each head's
    ``B_i = W_qᵀ W_k`` minimises ``Σ_b ‖X_b B_i X_bᵀ − T_i‖²`` over rank-``d`` matrices, under the approximation that
    every image has the same Gram matrix ``X_bᵀ X_b = G / n`` (``G = Σ_b X_bᵀ X_b``): with ``R = G^{-1/2}`` the
    solution is ``R [K_i]_d R``, ``K_i = R (Σ_b X_bᵀ T_i X_b) R`` and ``[·]_d`` its best rank-``d`` part. On one
    input ``X = P`` with ``ridge = 0`` this is the released ``P⁺ T_i P⁺ᵀ`` (tested), so the construction differs from
    the released one only in what it is solved for. ``B_i`` is then split into balanced factors and scaled as
    :func:`solve_qk` does (``normalize``), with the mean target logit measured on the calibration rows.

    Args:
        rows: ``(n, N, D)`` the normed tokens (``N = height·width`` patch tokens) of ``n`` images.
        ridge: ``λ / mean eigenvalue of G`` added to ``G`` before the inverse root: keeps directions the images
            barely use from taking the weight budget.
        rtol: eigenvalues of ``G`` at or below ``rtol · max`` are dropped (pseudo-inverse).
        Others: as :func:`solve_qk`.

    Returns:
        :class:`QKSolution` (``dtype``); ``scale`` is ``coef² / √d`` of the balanced factors, ``target_logit`` the
        mean logit of the head's target entries over the calibration images.

    Cost: ``O(h·n·N·D·(N + D) + h·D³)`` per layer, float64 on the CPU.
    """
    if rows.dim() != 3:
        raise ValueError(f"rows must be (n, N, D), got {tuple(rows.shape)}")
    h, n = len(offsets), height * width
    if rows.shape[1] != n:
        raise ValueError(f"rows have {rows.shape[1]} tokens, grid {height}x{width} has {n}")
    if tuple(noise.shape) != (h, n, n):
        raise ValueError(f"noise must be (h, N, N) = ({h}, {n}, {n}), got {tuple(noise.shape)}")
    x = rows.to(torch.float64)
    d = head_dim
    root = _inverse_root(torch.einsum("bnd,bne->de", x, x), ridge, rtol)  # R = G^{-1/2}, (D, D)
    queries, targets = _target_pairs(height, width, offsets, boundary)
    e = noise.to(torch.float64)
    xr = x @ root  # (n, N, D): the whitened rows, X_b R
    flat = xr.reshape(-1, xr.shape[-1])  # (n·N, D)
    k = torch.empty(h, x.shape[-1], x.shape[-1], dtype=torch.float64)
    for i in range(h):  # one head at a time: (n, N, D) temporaries, not (h, n, N, D)
        k[i] = flat.T @ (noise_scale * torch.matmul(e[i], xr)).reshape(-1, flat.shape[1])  # R Σ_b X_bᵀ (b E_i) X_b R
        query, target = queries[i], targets[i]
        if query.numel():
            weight = on_value - noise_scale * e[i, query, target]  # the impulse entries replace the noise there
            k[i] += xr[:, query].reshape(-1, flat.shape[1]).T @ (weight.repeat(x.shape[0]).unsqueeze(1)
                                                                 * xr[:, target].reshape(-1, flat.shape[1]))
    a, mu, ct = torch.linalg.svd(k)  # (h, D, D), descending
    r = max(1, min(d, int((mu > rtol * mu[:, :1]).sum(1).max())))
    left = root @ (a[:, :, :r] * mu[:, None, :r].sqrt())  # (h, D, r): B_i = left rightᵀ
    right = root @ (ct[:, :r].transpose(1, 2) * mu[:, None, :r].sqrt())
    # balanced factors of left rightᵀ: QR of both, SVD of the r × r core
    ql, rl = torch.linalg.qr(left)
    qr_, rr = torch.linalg.qr(right)
    core_u, core_s, core_vh = torch.linalg.svd(rl @ rr.transpose(1, 2))
    u, vh = _fix_signs(ql @ core_u, core_vh @ qr_.transpose(1, 2))  # (h, D, r), (h, r, D)
    half = core_s.sqrt().unsqueeze(2)  # (h, r, 1)
    wq0, wk0 = half * u.transpose(1, 2), half * vh  # B_i = wq0ᵀ wk0, ‖wq0‖_F² = ‖wk0‖_F² = Σ s
    target_mean = torch.full((h,), float("nan"), dtype=torch.float64)
    for i in range(h):
        if queries[i].numel():
            qv = x[:, queries[i]] @ wq0[i].T  # (n, m, r)
            kv = x[:, targets[i]] @ wk0[i].T
            target_mean[i] = (qv * kv).sum(-1).mean()
    sqrt_d = math.sqrt(d)
    nuclear = core_s.sum(1)
    if normalize == "frobenius":
        coef = torch.full((h,), gain, dtype=torch.float64) / nuclear.sqrt()
    elif normalize == "logit":
        ok = torch.isfinite(target_mean) & (target_mean > 0)
        coef = torch.where(ok, (target_logit * sqrt_d / target_mean.clamp_min(1e-300)).sqrt(), gain / nuclear.sqrt())
    else:
        raise ValueError(f"normalize must be 'frobenius' or 'logit', got {normalize!r}")
    wq, wk = (coef.view(-1, 1, 1) * wq0).to(dtype), (coef.view(-1, 1, 1) * wk0).to(dtype)
    if r < d:
        pad = (0, 0, 0, d - r)
        wq, wk = torch.nn.functional.pad(wq, pad), torch.nn.functional.pad(wk, pad)
    scale = coef**2 / sqrt_d
    return QKSolution(wq=wq, wk=wk, scale=scale, target_logit=scale * target_mean)


def _fix_signs(u: torch.Tensor, vh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SVD sign convention: flip each singular pair so the largest-magnitude entry of ``u[..., :, j]`` is positive
    (the product ``u diag(s) vh`` is unchanged; the factors no longer depend on the LAPACK build's sign choice)."""
    sign = _pivot_signs(u.transpose(-2, -1))  # (..., k, 1): one sign per column of u
    return u * sign.transpose(-2, -1), vh * sign


def _pivot_signs(rows: torch.Tensor) -> torch.Tensor:
    """``±1`` per row of ``rows`` (``(..., k, n)``): the sign of the row's largest-magnitude entry, ``(..., k, 1)``.
    The reduction runs along the last axis; pass a transposed view when the vectors are columns."""
    rows = rows.contiguous()
    pivot = rows.gather(-1, rows.abs().argmax(-1, keepdim=True))
    return torch.where(pivot < 0, -1.0, 1.0).to(rows.dtype)


def balanced_factors(
    c: torch.Tensor, rank: int | None = None, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Balanced split of ``C = U S Yᵀ`` (``c``: ``(..., D, D)``): ``(L, R) = (U_k S_k^{1/2}, S_k^{1/2} Y_kᵀ)``.

    ``L R`` is the best rank-``k`` approximation of ``C`` (``k = rank``, default ``D``: ``L R = C``) and both factors
    have singular values ``√s`` — the released SVD split. Computed from the symmetric eigenproblem ``CᵀC = Y S² Yᵀ``
    (about 2× cheaper than an SVD) with ``L = C Y_k S_k^{-1/2}``; ``L R = C Y_k Y_kᵀ`` is exact up to the
    orthogonality of ``Y``, whatever the conditioning of ``C``. Signs: each pair is flipped so that the
    largest-magnitude entry of ``U``'s column is positive. Computed and returned in ``dtype``.
    """
    c = c.to(dtype)
    evals, y = torch.linalg.eigh(c.transpose(-2, -1) @ c)  # ascending
    k = c.shape[-1] if rank is None else rank
    yt = y.flip(-1)[..., :k].transpose(-2, -1)  # (..., k, D): rows are right singular vectors, descending
    s = evals.flip(-1)[..., :k].clamp_min(0).sqrt()
    lt = yt @ c.transpose(-2, -1)  # (U S)ᵀ, rows contiguous for the sign pivot
    sign = _pivot_signs(lt)  # (..., k, 1)
    root = s.sqrt().unsqueeze(-1)  # (..., k, 1)
    inv_root = torch.where(root > 0, 1.0 / root, torch.zeros_like(root))
    return (lt * (sign * inv_root)).transpose(-2, -1), yt * (sign * root)


def draw_value_matrix(dim: int, generator: torch.Generator, alpha: float = 0.4, beta: float = 0.4) -> torch.Tensor:
    """``C = αZ − βI`` with ``Z ~ U(±√3/√D)`` i.i.d. (``D × D``, float64) — the random part of
    :func:`value_proj_factors`, drawn from ``generator``."""
    c = alpha * _uniform_unit_variance((dim, dim), dim, generator)
    c.diagonal().sub_(beta)
    return c


def value_proj_from(c: torch.Tensor, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_v, w_proj)`` for a drawn ``C`` (``D × D``): the balanced split ``C = L R`` as ``(Lᵀ, Rᵀ)`` in ``dtype``,
    so ``(x w_vᵀ) w_projᵀ = x C`` for every row ``x``. Pure (no randomness): safe to run in a worker thread."""
    lf, rf = balanced_factors(c, dtype=dtype)
    return lf.T.contiguous(), rf.T.contiguous()


def _uniform_unit_variance(shape: tuple[int, ...], dim: int, generator: torch.Generator) -> torch.Tensor:
    """``U(±√3/√dim)`` i.i.d. (variance ``1/dim``), float64, from one :func:`~impulsevit.init.rng.numpy_stream`."""
    bound = math.sqrt(3.0 / dim)
    z = torch.from_numpy(numpy_stream(generator).random(shape))  # [0, 1)
    return z.mul_(2.0 * bound).sub_(bound)


def value_proj_factors(
    dim: int, generator: torch.Generator, alpha: float = 0.4, beta: float = 0.4, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mimetic value/projection of one layer (``docs/method.md`` §2.5 / §5.1 step 2), done right in row convention.

    Draws ``Z ~ U(±√3/√D)`` (``D × D``), ``C = αZ − βI``, and returns ``(w_v, w_proj, C)`` with ``w_v = Lᵀ`` (the V
    rows of ``qkv.weight``, ``D × D``) and ``w_proj = Rᵀ`` (``proj.weight``) for the balanced split ``C = L R``, so
    every token row ``x`` maps to ``(x w_vᵀ) w_projᵀ = x L R = x C``. ``Z`` is drawn in float64; the factorisation
    runs in ``dtype`` and all three are returned in it (float32: ``L R = C`` to float32 precision, at half the cost).
    """
    c = draw_value_matrix(dim, generator, alpha, beta).to(dtype)
    wv, wp = value_proj_from(c, dtype)
    return wv, wp, c


def mimetic_qk_factors(
    dim: int, num_heads: int, head_dim: int, generator: torch.Generator, alpha: float = 0.7, beta: float = 0.7
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mimetic Q/K of one layer (``docs/method.md`` §5.1): per head ``A_i = αZ_i + βI`` (``Z_i ~ U(±√3/√D)``), and
    ``W_q^{(i)} = (U S^{1/2})[:, :d]ᵀ``, ``W_k^{(i)} = (S^{1/2} Yᵀ)[:d]``, so ``W_q^{(i)ᵀ} W_k^{(i)}`` is the best
    rank-``d`` approximation of ``A_i``.

    Returns:
        ``(wq, wk, a)``: ``(h, d, D)``, ``(h, d, D)`` and the targets ``(h, D, D)``, float64.
    """
    a = draw_mimetic_qk_targets(dim, num_heads, generator, alpha, beta)
    lf, rf = balanced_factors(a, rank=head_dim)
    return lf.transpose(1, 2).contiguous(), rf.contiguous(), a


def draw_mimetic_qk_targets(
    dim: int, num_heads: int, generator: torch.Generator, alpha: float = 0.7, beta: float = 0.7
) -> torch.Tensor:
    """The random part of :func:`mimetic_qk_factors`: ``A_i = αZ_i + βI``, ``(h, D, D)`` float64."""
    a = alpha * _uniform_unit_variance((num_heads, dim, dim), dim, generator)
    a.diagonal(dim1=-2, dim2=-1).add_(beta)
    return a
