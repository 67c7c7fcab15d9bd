"""docs/method.md §8: every property of the impulse / mimetic init as its own test, named after what it checks (the
docstring gives the property's number), with the thresholds given there.

Pseudo-input path (``P = LN0(pe)``, no qkv bias, no patch content) on real timm ViTs initialised through
``impulsevit.init.initialize``; geometry of ViT-Ti/S/B at 14×14 tokens (patch 2 on 28 px keeps the models small).
"""

from __future__ import annotations

import math

import pytest
import torch
from _vit_helpers import pseudo_logits, vit, vit_grid

import impulsevit.init as ii
from impulsevit.init import impulse as imp
from impulsevit.init.weight_selection import select_tensor, selection_indices

GEOMETRY = {"Ti": (192, 3), "S": (384, 6), "B": (768, 12)}


def _impulse(dim: int, heads: int, grid: int = 14, seed: int = 0, depth: int = 1, **opts):
    m = vit_grid(grid, dim, heads, depth)
    report = ii.initialize(m, "impulse", generator=seed, **opts)
    return m, report


def _dense_b(model, offsets, noise, rank):
    """The released formulation: G = PᵀP, rank-r inverse, P⁺ = G⁺Pᵀ, B_i = P⁺ T_i P⁺ᵀ (float64)."""
    rows = model.pos_embed.detach()[0, model.num_prefix_tokens :].double()
    p = imp.layer_norm_rows(rows)
    lam, v = torch.linalg.eigh(p.T @ p)
    lam, v = lam.flip(0)[:rank], v.flip(1)[:, :rank]
    pplus = v @ torch.diag(1 / lam) @ v.T @ p.T
    g = model.patch_embed.grid_size
    t = imp.target_logits(g[0], g[1], offsets, noise)
    return p, pplus @ t @ pplus.T, t


def test_offsets_follow_the_released_priority_order():
    """docs/method.md §8.1."""
    assert imp.impulse_offsets(3) == [(0, 0), (-1, 0), (0, 1)]
    assert imp.impulse_offsets(6)[3:] == [(0, -1), (1, 0), (-1, -1)]
    twelve = imp.impulse_offsets(12)
    assert len(set(twelve[:9])) == 9 and twelve[9:] == [(0, 0), (-1, 0), (0, 1)]
    m, report = _impulse(192, 12, grid=6, depth=3)
    assert report.offsets == [twelve] * 3


def test_target_has_one_zero_padded_impulse_per_row_and_bounded_noise():
    """docs/method.md §8.2."""
    h, w = 5, 7
    g = torch.Generator().manual_seed(0)
    offsets = [(0, 0), (-1, 0), (1, 1), (0, -1)]
    noise = imp.draw_noise(len(offsets), h * w, g)
    t = imp.target_logits(h, w, offsets, noise)
    for i, (dy, dx) in enumerate(offsets):
        on = t[i] == 1000.0
        assert int(on.sum()) == (h - abs(dy)) * (w - abs(dx))
        assert on.sum(0).max() <= 1 and on.sum(1).max() <= 1
        for r in range(h):
            for c in range(w):
                inside = 0 <= r + dy < h and 0 <= c + dx < w
                assert bool(on[r * w + c].any()) == inside
                if inside:
                    assert on[r * w + c, (r + dy) * w + c + dx]
        off = t[i][~on]
        assert off.abs().max() <= 6.0
    big = imp.draw_noise(4, 100, g) * 3.0
    assert abs(big.std().item() - 1.8) < 0.05 and big.abs().max() <= 6.0


def test_solve_reproduces_the_projected_target_at_full_rank():
    """docs/method.md §8.3."""
    dim, heads = GEOMETRY["Ti"]
    d = dim // heads
    m = vit_grid(14, dim, heads)
    g = torch.Generator().manual_seed(3)
    ii.initialize(m, "impulse", generator=g)
    # replay: same seed ⇒ same base draws, then the layer's noise
    m2 = vit_grid(14, dim, heads)
    g2 = torch.Generator().manual_seed(3)
    from impulsevit.init.baselines import torch_defaults

    torch_defaults(m2, g2)  # the base draws every tensor's seed (base_values), structured ones included
    noise = imp.draw_noise(heads, 196, g2)
    m2.pos_embed.data.copy_(m.pos_embed.data)
    p, b, t = _dense_b(m2, imp.impulse_offsets(heads), noise, d)
    u = torch.linalg.svd(p, full_matrices=False)[0][:, :d]
    proj = u @ u.T
    for i in range(heads):
        lhs, rhs = p @ b[i] @ p.T, proj @ t[i] @ proj
        assert (lhs - rhs).norm() / rhs.norm() <= 1e-8
        assert torch.linalg.matrix_rank(b[i]).item() == d
        # the batched subspace solve realises W_qᵀ W_k = γ² B / ‖B‖_*  (⇔ ‖F‖² = Σσ(B), property 4)
        w = m.blocks[0].attn.qkv.weight.detach().double()
        qk = w[i * d : (i + 1) * d].T @ w[dim + i * d : dim + (i + 1) * d]
        expect = 49.0 * b[i] / torch.linalg.svdvals(b[i]).sum()
        assert (qk - expect).norm() / expect.norm() < 1e-5


def test_qk_factors_have_frobenius_norm_gain_qk_in_every_head_and_layer():
    """docs/method.md §8.4."""
    m, _ = _impulse(192, 3, grid=8, depth=3)
    for blk in m.blocks:
        w = blk.attn.qkv.weight.detach().double()
        for i in range(3):
            assert abs(w[i * 64 : (i + 1) * 64].norm().item() - 7.0) < 1e-5
            assert abs(w[192 + i * 64 : 192 + (i + 1) * 64].norm().item() - 7.0) < 1e-5


def test_pseudo_input_logits_match_the_closed_form():
    """docs/method.md §8.5."""
    g = torch.Generator().manual_seed(1)
    pe = 0.36 * torch.randn(196, 192, generator=g, dtype=torch.float64)
    p = imp.layer_norm_rows(pe)
    pi = imp.factor_pseudo_input(p, 64)
    offs = imp.impulse_offsets(3)
    noise = imp.draw_noise(3, 196, g)
    sol = imp.solve_qk(pi, 14, 14, offs, noise, 64)
    lam = (p @ sol.wq.transpose(1, 2)) @ (p @ sol.wk.transpose(1, 2)).transpose(1, 2) / 8.0
    t = imp.target_logits(14, 14, offs, noise)
    proj = pi.u @ pi.u.T
    for i in range(3):
        ptp = proj @ t[i] @ proj
        # Σσ(B_i): nuclear norm of M_i (same singular values as B_i = V M Vᵀ)
        m_i = torch.diag(1 / pi.s) @ pi.u.T @ t[i] @ pi.u @ torch.diag(1 / pi.s)
        expect = 49.0 / (8.0 * torch.linalg.svdvals(m_i).sum()) * ptp
        torch.testing.assert_close(lam[i], expect, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(lam[i], sol.scale[i] * ptp, rtol=1e-9, atol=1e-9)


def test_pos_embed_scale_changes_neither_logits_nor_qk():
    """docs/method.md §8.6."""
    g = torch.Generator().manual_seed(2)
    pe = 0.02 * torch.randn(64, 96, generator=g, dtype=torch.float64)
    noise = imp.draw_noise(3, 64, g)
    lams = []
    for c in (1.0, 18.0, 500.0):
        p = imp.layer_norm_rows(c * pe, eps=0.0)
        sol = imp.solve_qk(imp.factor_pseudo_input(p, 32), 8, 8, imp.impulse_offsets(3), noise, 32)
        lams.append((p @ sol.wq.transpose(1, 2)) @ (p @ sol.wk.transpose(1, 2)).transpose(1, 2))
    torch.testing.assert_close(lams[0], lams[1], rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(lams[0], lams[2], rtol=1e-8, atol=1e-8)
    a, _ = _impulse(96, 3, grid=8, seed=5, gain_pos=18.0)
    b, _ = _impulse(96, 3, grid=8, seed=5, gain_pos=4.0)
    torch.testing.assert_close(a.pos_embed * (4.0 / 18.0), b.pos_embed, rtol=1e-6, atol=0)
    for name, pa in a.named_parameters():
        if name == "blocks.0.attn.qkv.weight":  # Q/K: equal up to the LN ε (the factors' gauge aside)
            wa, wb = pa.detach().double(), b.get_parameter(name).detach().double()
            for i in range(3):
                qa = wa[i * 32 : (i + 1) * 32].T @ wa[96 + i * 32 : 96 + (i + 1) * 32]
                qb = wb[i * 32 : (i + 1) * 32].T @ wb[96 + i * 32 : 96 + (i + 1) * 32]
                assert ((qa - qb).norm() / qa.norm()).item() < 2e-3
            assert torch.equal(wa[192:], wb[192:])
        elif name != "pos_embed":
            assert torch.equal(pa, b.get_parameter(name)), name


def test_attention_rows_sum_to_one():
    """docs/method.md §8.7."""
    m, _ = _impulse(192, 3, grid=14, depth=2)
    for amap in ii.attention_maps(m):
        assert amap.dtype == torch.float32
        assert (amap.sum(-1) - 1).abs().max().item() < 1e-6
    imgs = ii.attention_maps(m, torch.randn(2, 3, 28, 28))
    for amap in imgs:
        assert (amap.sum(-1) - 1).abs().max().item() < 1e-6


@pytest.mark.parametrize("geom", ["Ti", "S", "B"])
def test_identity_head_attends_to_itself(geom):
    """docs/method.md §8.8."""
    dim, heads = GEOMETRY[geom]
    m, report = _impulse(dim, heads, seed=7)
    amap = ii.attention_maps(m)[0][0]
    assert report.offsets[0][0] == (0, 0)
    assert torch.equal(amap.argmax(-1), torch.arange(196))
    assert amap.diagonal().mean().item() >= 0.99
    lam = pseudo_logits(m)[0]
    assert torch.linalg.eigvalsh((lam + lam.T) / 2).min().item() > -1e-8 * lam.abs().max().item()


@pytest.mark.parametrize(
    "geom,hit_min,mass_lo,mass_hi", [("Ti", 0.97, 0.70, 0.85), ("S", 0.98, 0.94, 1.0), ("B", 0.98, 0.97, 1.0)]
)
def test_shift_heads_hit_their_neighbour_on_a_14x14_grid(geom, hit_min, mass_lo, mass_hi):
    """docs/method.md §8.9."""
    dim, heads = GEOMETRY[geom]
    # thresholds on the mean over a model's shift heads; single heads may miss one more token (1/144 = 0.007)
    for seed in (0, 1):
        m, report = _impulse(dim, heads, seed=seed)
        shifts = [s for s in ii.summarize(ii.attention_maps(m), report.offsets) if s.offset != (0, 0)]
        assert sum(s.hit_rate for s in shifts) / len(shifts) >= hit_min, shifts
        assert mass_lo <= sum(s.target_mass for s in shifts) / len(shifts) <= mass_hi, shifts
        for s in shifts:
            assert s.hit_rate >= hit_min - 0.02 and mass_lo - 0.03 <= s.target_mass <= mass_hi, s


def test_shift_heads_on_16x16_and_8x8_grids():
    """docs/method.md §8.9."""
    m, report = _impulse(192, 3, grid=16)
    for s in ii.summarize(ii.attention_maps(m), report.offsets)[1:]:
        assert s.hit_rate >= 0.90 and 0.35 <= s.target_mass <= 0.65, s
    m, report = _impulse(192, 3, grid=8)
    for s in ii.summarize(ii.attention_maps(m), report.offsets):
        assert s.hit_rate == 1.0 and s.target_mass >= 0.97, s


def test_border_queries_without_a_target_are_diffuse_not_wrapped():
    """docs/method.md §8.10."""
    m, report = _impulse(192, 3, seed=4)
    amap = ii.attention_maps(m)[0]
    summary = ii.summarize([amap], report.offsets, grid=(14, 14))
    for head, s in enumerate(summary[1:], start=1):
        assert s.border_max < 0.3, s
        idx = imp.shift_index(14, 14, s.offset, "zero")
        wrapped = imp.shift_index(14, 14, s.offset, "circular")
        border = torch.nonzero(idx < 0).squeeze(1)
        assert amap[head, border, wrapped[border]].mean().item() < 0.05


def test_opposite_offsets_give_transposed_logits():
    """docs/method.md §8.11."""
    m, report = _impulse(384, 6, seed=2)
    offs = report.offsets[0]
    lam = pseudo_logits(m)
    right, left = offs.index((0, 1)), offs.index((0, -1))
    rel = (lam[left] - lam[right].T).norm() / lam[right].norm()
    assert rel.item() < 0.1
    g = torch.Generator().manual_seed(0)
    p = imp.layer_norm_rows(torch.randn(64, 96, generator=g, dtype=torch.float64))
    noise = imp.draw_noise(2, 64, g)
    sol = imp.solve_qk(imp.factor_pseudo_input(p, 32), 8, 8, [(0, 1), (0, -1)], noise, 32, noise_scale=0.0)
    lam0 = (p @ sol.wq.transpose(1, 2)) @ (p @ sol.wk.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(lam0[1], lam0[0].T, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("geom,lo,hi", [("Ti", 11.0, 18.0), ("S", 18.0, 30.0), ("B", 32.0, 52.0)])
def test_peak_logit_grows_with_width(geom, lo, hi):
    """docs/method.md §8.12."""
    dim, heads = GEOMETRY[geom]
    m, _ = _impulse(dim, heads, seed=1)
    assert lo <= pseudo_logits(m).max().item() <= hi


def test_value_proj_realise_x_c_in_row_convention():
    """docs/method.md §8.13."""
    g = torch.Generator().manual_seed(0)
    wv, wp, c = imp.value_proj_factors(192, g)
    x = torch.randn(5, 192, dtype=torch.float64)
    torch.testing.assert_close((x @ wv.T) @ wp.T, x @ c, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(wp @ wv, c.T, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.linalg.svdvals(wv), torch.linalg.svdvals(c).sqrt())
    torch.testing.assert_close(torch.linalg.svdvals(wp), torch.linalg.svdvals(c).sqrt())
    m, _ = _impulse(384, 6, grid=8, depth=2)
    for blk in m.blocks:
        wv = blk.attn.qkv.weight.detach().double()[2 * 384 :]
        prod = wv.T @ blk.attn.proj.weight.detach().double().T  # row convention: x ↦ x C
        assert abs(prod.diagonal().mean().item() + 0.4) < 0.01
        off = prod[~torch.eye(384, dtype=torch.bool)]
        assert abs(off.std().item() / (0.4 / math.sqrt(384)) - 1) < 0.1


def test_mimetic_qk_is_the_best_rank_d_approximation():
    """docs/method.md §8.14."""
    g = torch.Generator().manual_seed(0)
    wq, wk, a = imp.mimetic_qk_factors(192, 3, 64, g)
    for i in range(3):
        got = torch.linalg.svdvals(wq[i].T @ wk[i])[:64]
        torch.testing.assert_close(got, torch.linalg.svdvals(a[i])[:64], rtol=1e-10, atol=1e-10)
        u, s, vh = torch.linalg.svd(a[i])
        torch.testing.assert_close(wq[i].T @ wk[i], (u[:, :64] * s[:64]) @ vh[:64], rtol=1e-9, atol=1e-9)
    m = vit_grid(4, 192, 3, depth=2)
    ii.initialize(m, "mimetic", generator=0)
    for blk in m.blocks:
        w = blk.attn.qkv.weight.detach().double()
        for i in range(3):
            qk = w[i * 64 : (i + 1) * 64].T @ w[192 + i * 64 : 192 + (i + 1) * 64]
            assert torch.linalg.matrix_rank(qk, rtol=1e-5).item() == 64
            assert 0.33 < qk.diagonal().mean().item() < 0.45  # docs/method.md §5.1: ≈ 0.39 at D = 192


def test_weight_selection_takes_uniform_indices_and_skips_head():
    """docs/method.md §8.15."""
    assert torch.equal(selection_indices(1152, 576), torch.arange(576) * 2)
    assert torch.equal(selection_indices(10, 4), torch.tensor([0, 3, 6, 9]))
    assert torch.equal(selection_indices(7, 3), torch.round(torch.linspace(0, 6, 3, dtype=torch.float64)).long())
    t = torch.arange(12 * 7, dtype=torch.float32).reshape(12, 7)
    sel = select_tensor(t, (4, 3))
    assert torch.equal(sel, t[torch.arange(4) * 3][:, torch.tensor([0, 3, 6])])
    teacher, student = vit(dim=96, heads=6, depth=3), vit(dim=48, heads=3, depth=2)
    ii.initialize(teacher, "torch", generator=0)
    ii.initialize(student, "torch", generator=1)
    head_before = student.head.weight.clone()
    ii.initialize(student, "weight_selection", teacher=teacher)
    torch.testing.assert_close(student.blocks[1].attn.qkv.weight, teacher.blocks[1].attn.qkv.weight[::2, ::2])
    assert torch.equal(student.head.weight, head_before)


def test_solve_touches_only_qk_rows_and_excludes_the_prefix_row():
    """docs/method.md §8.16."""
    m = vit(dim=64, heads=4, depth=3)
    ii.initialize(m, "torch", generator=0)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    ii.initialize(m, "impulse", generator=1, base="keep", value="default")
    after = m.state_dict()
    for k in before:
        if k.endswith("qkv.weight"):
            assert torch.equal(before[k][128:], after[k][128:]), k
            assert not torch.equal(before[k][:128], after[k][:128]), k
        elif k == "pos_embed":
            torch.testing.assert_close(after[k], before[k] * 18.0)
        else:
            assert torch.equal(before[k], after[k]), k
    # the cls row of pos_embed is not part of P: changing it does not change Q/K
    a, b = vit(dim=64, heads=4), vit(dim=64, heads=4)
    ii.initialize(a, "torch", generator=0)
    b.load_state_dict(a.state_dict())
    b.pos_embed.data[0, 0] += 5.0
    ii.initialize(a, "impulse", generator=2, base="keep")
    ii.initialize(b, "impulse", generator=2, base="keep")
    torch.testing.assert_close(a.blocks[1].attn.qkv.weight, b.blocks[1].attn.qkv.weight)
