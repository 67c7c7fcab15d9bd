"""Default ``impulse`` Q/K against an independent, from-the-formula computation of the released rule.

The reference below follows the released algorithm step by step in float64 with dense matrices — ``G = PᵀP``, its
top-``r`` eigen-inverse, ``P⁺ = G⁺_r Pᵀ``, the dense target ``T_i = a·S_i + b·E_i ⊙ (1 − S_i)``, ``B_i = P⁺ T_i P⁺ᵀ``,
an SVD of each ``B_i`` split into ``F = U√Σ``, ``G = Y√Σ``, each factor divided by its Frobenius norm and multiplied by
7 — and shares no code with the implementation (which solves in an ``r × r`` subspace). Only the target noise is taken
from the implementation's own draw (recorded, not altered), so both sides solve the same problem.

Both regimes are covered: ``N ≥ d`` (rank ``d``) and ``N < d`` (28 px images, 4 px patches: 49 tokens, head_dim 64,
solved at rank 49 — the regime where a non-released scale rule once erased the method's gain).
"""

from __future__ import annotations

import math

import pytest
import torch
from _vit_helpers import vit

import impulsevit.init as ii
from impulsevit.init import impulse as imp


def _reference_qk(pe_patch: torch.Tensor, grid: tuple[int, int], offsets, noise: torch.Tensor, head_dim: int):
    """Released rule, from the formulas: returns per head ``(W_q, W_k)`` products ``W_qᵀW_k`` (D×D), norms, logits."""
    x = pe_patch.double()
    p = (x - x.mean(1, keepdim=True)) / torch.sqrt(x.var(1, unbiased=False, keepdim=True) + 1e-5)  # LN0
    n, dim = p.shape
    h_grid, w_grid = grid
    g = p.T @ p
    lam, vec = torch.linalg.eigh(g)
    lam, vec = lam.flip(0), vec.flip(1)
    r = min(head_dim, int((lam > 1e-10 * lam[0]).sum()))  # numerical rank of P (eigenvalues are σ²)
    g_plus = vec[:, :r] @ torch.diag(1.0 / lam[:r]) @ vec[:, :r].T
    p_plus = g_plus @ p.T  # D × N
    out = []
    for i, (dy, dx) in enumerate(offsets):
        s = torch.zeros(n, n, dtype=torch.float64)
        for row in range(h_grid):
            for col in range(w_grid):
                rr, cc = row + dy, col + dx
                if 0 <= rr < h_grid and 0 <= cc < w_grid:
                    s[row * w_grid + col, rr * w_grid + cc] = 1.0
        t = 1000.0 * s + 3.0 * noise[i].double() * (1 - s)
        b = p_plus @ t @ p_plus.T
        u, sig, yt = torch.linalg.svd(b)
        f = u[:, :r] * sig[:r].sqrt()
        gk = yt[:r].T * sig[:r].sqrt()
        wq = 7.0 * (f / f.norm()).T  # r × D
        wk = 7.0 * (gk / gk.norm()).T
        logits = (p @ wq.T) @ (p @ wk.T).T / math.sqrt(head_dim)
        out.append((wq.T @ wk, logits))
    return r, p, out


@pytest.mark.parametrize(
    "img,patch,dim,heads,expect_rank",
    [
        (28, 4, 192, 3, 49),  # N = 49 < d = 64
        (32, 2, 128, 2, 64),  # N = 256 ≥ d = 64
    ],
)
def test_default_qk_equals_released_rule(monkeypatch, img, patch, dim, heads, expect_rank):
    drawn: list[torch.Tensor] = []
    real_draw = imp.draw_noise

    def record(*args, **kwargs):
        out = real_draw(*args, **kwargs)
        drawn.append(out.clone())
        return out

    monkeypatch.setattr(imp, "draw_noise", record)
    m = vit(img=img, patch=patch, dim=dim, heads=heads, depth=2)
    report = ii.initialize(m, "impulse", generator=3)  # default options
    assert report.options["rank"] == expect_rank and len(drawn) == 2
    grid = (img // patch, img // patch)
    pe = m.pos_embed.detach()[0, m.num_prefix_tokens :]
    d = dim // heads
    for layer in range(2):
        r, p, ref = _reference_qk(pe, grid, report.offsets[layer], drawn[layer], d)
        assert r == expect_rank
        w = m.blocks[layer].attn.qkv.weight.detach().double()
        for i, (prod_ref, logits_ref) in enumerate(ref):
            wq, wk = w[i * d : (i + 1) * d], w[dim + i * d : dim + (i + 1) * d]
            assert wq.norm().item() == pytest.approx(7.0, rel=1e-5)  # released Frobenius rule
            assert wk.norm().item() == pytest.approx(7.0, rel=1e-5)
            assert int((wq.abs().sum(1) > 0).sum()) == r  # rows beyond the rank stay zero
            torch.testing.assert_close(wq.T @ wk, prod_ref, rtol=1e-4, atol=1e-5 * prod_ref.abs().max().item())
            logits = (p @ wq.T) @ (p @ wk.T).T / math.sqrt(d)
            torch.testing.assert_close(logits, logits_ref, rtol=1e-4, atol=1e-4 * logits_ref.abs().max().item())
