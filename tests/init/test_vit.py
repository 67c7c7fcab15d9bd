"""impulse / mimetic on timm ViTs: options, model variants, determinism, error paths, InitReport."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _vit_helpers import pseudo_logits, state_digest, vit
from timm.layers import build_sincos2d_pos_embed
from timm.models.deit import VisionTransformerDistilled

import impulsevit.init as ii
from impulsevit.init import impulse as imp


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(model, snap) -> bool:
    """Bit-identical (NaN-safe: a weight_init='skip' model may hold NaN garbage)."""
    raw = lambda t: t.contiguous().view(torch.uint8) if t.is_floating_point() else t
    return all(torch.equal(raw(v), raw(snap[k])) for k, v in model.state_dict().items())


@pytest.mark.parametrize("method", ["impulse", "mimetic"])
def test_same_seed_bit_identical_and_different_seed_differs(method):
    a, b, c = vit(), vit(), vit()
    ii.initialize(a, method, generator=11)
    ii.initialize(b, method, generator=torch.Generator().manual_seed(11))
    ii.initialize(c, method, generator=12)
    assert state_digest(a) == state_digest(b)
    wa, wc = a.blocks[0].attn.qkv.weight, c.blocks[0].attn.qkv.weight
    assert not torch.equal(wa, wc)


def test_same_seed_bit_identical_in_another_process():
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r});"
        "from _vit_helpers import vit, state_digest; import impulsevit.init as ii;"
        "m = vit(); ii.initialize(m, 'impulse', generator=5); print(state_digest(m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    m = vit()
    ii.initialize(m, "impulse", generator=5)
    assert out == state_digest(m)


@pytest.mark.parametrize("method", ["impulse", "mimetic", "torch", "timm"])
def test_global_rng_untouched(method):
    m = vit()
    torch.manual_seed(123)
    np.random.seed(123)
    t_state, n_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    ii.initialize(m, method, generator=0)
    assert torch.equal(torch.get_rng_state(), t_state)
    assert np.array_equal(np.random.get_state()[1], n_state)


def test_report_contents_and_table():
    m = vit(depth=3)
    r = ii.initialize(m, "impulse", generator=0, offsets="random", offsets_per_layer=True, replacement=False)
    assert r.method == "impulse" and r.family == "vit" and r.model == "VisionTransformer"
    assert len(r.offsets) == 3 and all(len(row) == 4 for row in r.offsets)
    assert r.options["gain_qk"] == 7.0 and r.options["grid"] == [8, 8] and r.seconds > 0
    text = str(r)
    assert "impulse" in text and "gain_pos" in text and text.count("\n") > 20
    assert all(len(set(row)) == 4 for row in r.offsets)  # without replacement, 4 heads ≤ 9 positions
    assert r.offsets[0] != r.offsets[1] or r.offsets[1] != r.offsets[2]


def test_random_offsets_seeded_with_replacement():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = imp.impulse_offsets(40, 3, "random", generator=g1)
    assert a == imp.impulse_offsets(40, 3, "random", generator=g2)
    assert len(set(a)) <= 9 and len(set(a)) >= 7  # duplicates by construction
    b = imp.impulse_offsets(18, 3, "random", generator=g1, replacement=False)
    assert sorted(b[:9]) == sorted(b[9:]) == sorted(imp.kernel_offsets(3))


def test_kernel_size_5_offsets_are_the_full_5x5_set():
    k5 = imp.kernel_offsets(5)
    assert len(k5) == 25 and set(k5) == {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}
    assert k5[:9] == imp.kernel_offsets(3)
    assert k5[9:13] == [(-2, 0), (0, 2), (2, 0), (0, -2)]
    m = vit(dim=1024, heads=16, depth=1, mlp_ratio=1.0)  # 8x8 tokens, head_dim 64
    r = ii.initialize(m, "impulse", generator=0, kernel_size=5)
    assert r.offsets[0] == k5[:16]
    s = ii.summarize(ii.attention_maps(m), r.offsets)
    assert all(x.hit_rate >= 0.9 for x in s), s.table()


def test_circular_boundary_wraps_border_queries():
    m = vit(dim=128, heads=2)
    r = ii.initialize(m, "impulse", generator=0, boundary="circular")
    amap = ii.attention_maps(m)[0][1]  # head 1: offset (-1, 0)
    wrapped = imp.shift_index(8, 8, (-1, 0), "circular")
    top_row = torch.arange(8)
    assert torch.equal(amap[top_row].argmax(-1), wrapped[top_row])
    assert r.options["boundary"] == "circular"


def test_gains_and_value_modes():
    m = vit(dim=64, heads=2)
    ii.initialize(m, "impulse", generator=0, gain_qk=3.0, gain_v=2.0)
    w = m.blocks[0].attn.qkv.weight.detach().double()
    assert abs(w[:32].norm().item() - 3.0) < 1e-5
    prod = w[128:].T @ m.blocks[0].attn.proj.weight.detach().double().T
    # γ_v² C: the diagonal mean of C is −0.4 + 0.4·mean(Z_ii), std 0.4/√(64·64) = 0.006 → 4σ band for γ_v² C
    assert abs(prod.diagonal().mean().item() + 4 * 0.4) < 4 * 4 * 0.4 / 64
    ref = vit(dim=64, heads=2)
    ii.initialize(ref, "impulse", generator=0, gain_qk=3.0)  # same draws, γ_v = 1
    wr = ref.blocks[0].attn.qkv.weight.detach().double()
    prod_ref = wr[128:].T @ ref.blocks[0].attn.proj.weight.detach().double().T
    assert torch.allclose(prod, 4 * prod_ref, atol=1e-5)  # exactly γ_v² times the γ_v = 1 product
    m2 = vit(dim=64, heads=2)
    ii.initialize(m2, "torch", generator=0)
    v_rows, proj = m2.blocks[0].attn.qkv.weight[128:].clone(), m2.blocks[0].attn.proj.weight.clone()
    ii.initialize(m2, "impulse", generator=0, value="default", base="keep")
    assert torch.equal(m2.blocks[0].attn.qkv.weight[128:], v_rows)
    assert torch.equal(m2.blocks[0].attn.proj.weight, proj)
    for method in ("impulse", "mimetic"):  # value='default' + base='torch': V rows / proj get PyTorch defaults
        m3 = vit(dim=64, heads=2)
        m3.blocks[0].attn.qkv.weight.data.fill_(float("nan"))
        m3.blocks[0].attn.proj.weight.data.fill_(float("nan"))
        ii.initialize(m3, method, generator=0, value="default")
        v3 = m3.blocks[0].attn.qkv.weight[128:]
        assert v3.isfinite().all() and v3.abs().max() <= 1 / 8 and m3.blocks[0].attn.proj.weight.isfinite().all()


def test_noise_scale_changes_only_noise():
    a, b = vit(), vit()
    ii.initialize(a, "impulse", generator=0, noise_scale=0.0)
    ii.initialize(b, "impulse", generator=0, noise_scale=3.0)
    assert not torch.equal(a.blocks[0].attn.qkv.weight, b.blocks[0].attn.qkv.weight)
    torch.testing.assert_close(a.pos_embed, b.pos_embed)


def test_class_token_free_vit():
    m = vit(dim=128, heads=2, class_token=False, global_pool="avg")
    assert m.pos_embed.shape[1] == 64
    r = ii.initialize(m, "impulse", generator=0)
    s = ii.summarize(ii.attention_maps(m), r.offsets)
    assert s[0].hit_rate == 1.0 and all(x.hit_rate >= 0.95 for x in s), s.table()
    assert m(torch.randn(2, 3, 32, 32)).isfinite().all()


@pytest.mark.parametrize(
    "kw,prefix",
    [({"reg_tokens": 2}, 3), ({"reg_tokens": 4, "no_embed_class": True}, 5), ({"no_embed_class": True}, 1)],
)
def test_register_tokens_and_no_embed_class(kw, prefix):
    m = vit(dim=128, heads=2, **kw)
    assert m.num_prefix_tokens == prefix
    before_prefix = None if kw.get("no_embed_class") else m.pos_embed.shape[1] - 64
    r = ii.initialize(m, "impulse", generator=0)
    if before_prefix is not None:
        assert before_prefix == prefix
    s = ii.summarize(ii.attention_maps(m), r.offsets)
    assert all(x.hit_rate >= 0.95 for x in s), s.table()
    maps = ii.attention_maps(m, torch.randn(2, 3, 32, 32))
    assert maps[0].shape == (2, 64 + prefix, 64 + prefix) and maps.patch_slice == slice(prefix, prefix + 64)
    assert m.cls_token.abs().max() == 0 and (m.reg_token is None or m.reg_token.abs().max() == 0)


def test_deit_distilled():
    m = VisionTransformerDistilled(img_size=32, patch_size=4, embed_dim=128, depth=2, num_heads=2, weight_init="skip")
    assert m.num_prefix_tokens == 2
    r = ii.initialize(m, "impulse", generator=0)
    assert m.dist_token.abs().max() == 0
    s = ii.summarize(ii.attention_maps(m), r.offsets)
    assert all(x.hit_rate >= 0.95 for x in s), s.table()


def test_non_square_grid():
    m = vit(img=(32, 48), patch=4, dim=128, heads=2)
    assert tuple(m.patch_embed.grid_size) == (8, 12)
    r = ii.initialize(m, "impulse", generator=0)
    assert r.options["grid"] == [8, 12]
    s = ii.summarize(ii.attention_maps(m), r.offsets)
    assert all(x.hit_rate >= 0.95 and x.target_mass > 0.5 for x in s), s.table()


@pytest.mark.parametrize("heads", [1, 2, 4, 8])
def test_any_head_count(heads):
    m = vit(dim=64 * heads, heads=heads, depth=1)  # 8x8 tokens, head_dim 64
    r = ii.initialize(m, "impulse", generator=0)
    assert len(r.offsets[0]) == heads
    s = ii.summarize(ii.attention_maps(m), r.offsets)
    assert all(x.hit_rate >= 0.95 for x in s), s.table()


def _sincos_vit(frozen: bool = True):
    m = vit(img=28, patch=2, dim=192, heads=3, depth=1, class_token=False, global_pool="avg", mlp_ratio=1.0)
    table = build_sincos2d_pos_embed([14, 14], dim=192).unsqueeze(0)
    m.pos_embed = torch.nn.Parameter(table, requires_grad=not frozen)
    return m, table


def test_sincos_pseudo_input_logit_rule_is_opt_in():
    m, table = _sincos_vit()
    r = ii.initialize(m, "impulse", generator=0, qk_normalize="logit")
    assert torch.equal(m.pos_embed.detach(), table)  # a frozen table is neither reset nor scaled
    assert r.options["rank"] < 64 and r.options["qk_normalize_used"] == "logit"
    assert any("rank-deficient" in n for n in r.notes)
    s = ii.summarize(ii.attention_maps(m), r.offsets)
    for x in s:  # chance level is 1/196
        assert x.hit_rate >= 0.9 and x.target_mass >= 0.3, s.table()
    lam = pseudo_logits(m)
    assert 5.0 < lam.max().item() < 40.0


def test_sincos_default_is_released_rule_and_says_it_collapses():
    """Default = the released Frobenius rule, also on a sin-cos table, where it gives ≈ uniform attention; the report
    says so and names the opt-in alternative."""
    m, _ = _sincos_vit()
    r = ii.initialize(m, "impulse", generator=0)
    assert r.options["qk_normalize_used"] == "frobenius"
    assert any("collapses" in n and "qk_normalize='logit'" in n for n in r.notes), r.notes
    assert pseudo_logits(m).abs().max().item() < 1.0
    s = ii.summarize(ii.attention_maps(m), [[(0, 0), (-1, 0), (0, 1)]])
    assert all(x.target_mass < 0.05 for x in s)


def test_head_dim_larger_than_tokens_solves_at_token_rank():
    m = vit(img=16, patch=4, dim=128, heads=2)  # 4x4 = 16 tokens, head_dim 64
    r = ii.initialize(m, "impulse", generator=0)
    assert r.options["rank"] == 16 and r.options["qk_normalize_used"] == "frobenius"
    assert any(n.startswith("rank 16 < head_dim 64: solved at rank 16") for n in r.notes), r.notes
    s = ii.summarize(ii.attention_maps(m), r.offsets)
    assert all(x.hit_rate == 1.0 for x in s), s.table()


def test_allow_rank_deficient_is_gone():
    with pytest.raises(TypeError, match="allow_rank_deficient"):
        ii.initialize(vit(), "impulse", generator=0, allow_rank_deficient=True)


def test_error_no_pos_embed_leaves_model_untouched():
    m = vit(pos_embed="none", class_token=False, global_pool="avg")
    snap = _snapshot(m)
    with pytest.raises(ValueError, match="VisionTransformer has no absolute position embedding"):
        ii.initialize(m, "impulse", generator=0)
    assert _same(m, snap)
    ii.initialize(m, "mimetic", generator=0)  # mimetic does not need it


def test_error_unknown_grid():
    m = vit()
    del m.patch_embed.grid_size
    snap = _snapshot(m)
    with pytest.raises(ValueError, match="VisionTransformer: unknown token grid"):
        ii.initialize(m, "impulse", generator=0)
    assert _same(m, snap)
    r = ii.initialize(m, "impulse", generator=0, grid=(8, 8))
    assert r.options["grid"] == [8, 8]


def test_error_qk_norm_and_no_attention():
    m = vit(qk_norm=True)
    with pytest.raises(ValueError, match="qk_norm"):
        ii.initialize(m, "impulse", generator=0)
    with pytest.raises(ValueError, match="cannot be applied to Sequential"):
        ii.initialize(torch.nn.Sequential(torch.nn.Linear(4, 4)), "impulse")


def test_error_options():
    m = vit()
    snap = _snapshot(m)
    with pytest.raises(TypeError, match="unknown option.*'gain_k'"):
        ii.initialize(m, "impulse", gain_k=3.0)
    with pytest.raises(ValueError, match="'boundary'.*'zero', 'circular'"):
        ii.initialize(m, "impulse", boundary="reflect")
    with pytest.raises(ValueError, match="kernel_size"):
        ii.initialize(m, "impulse", kernel_size=7)
    with pytest.raises(TypeError, match="gain_qk"):
        ii.initialize(m, "impulse", gain_qk="7")
    assert _same(m, snap)


def test_error_late_failure_leaves_model_bit_identical():
    m = vit()
    m.pos_embed.data.fill_(float("nan"))
    snap = _snapshot(m)
    with pytest.raises(ValueError, match="pos_embed is not finite"):
        ii.initialize(m, "impulse", generator=0, base="keep")
    assert _same(m, snap)


def test_mimetic_value_layout_released_writes_factors_untransposed():
    """Default ``value_layout='released'`` writes ``U S^{1/2}`` into the V rows and ``S^{1/2} Yᵀ`` into proj (no
    transposes): the realised row-vector map is ``x ↦ x (R L)ᵀ``, which keeps the trace of ``C``, not ``C`` itself."""
    a, b = vit(dim=64, heads=4, depth=1), vit(dim=64, heads=4, depth=1)
    ii.initialize(a, "mimetic", generator=4, value_layout="row")
    ii.initialize(b, "mimetic", generator=4)  # default: released
    qa, qb = a.blocks[0].attn.qkv.weight.detach(), b.blocks[0].attn.qkv.weight.detach()
    assert torch.equal(qa[:128], qb[:128])  # Q/K unchanged
    wv_a, wp_a = qa[128:], a.blocks[0].attn.proj.weight.detach()
    wv_b, wp_b = qb[128:], b.blocks[0].attn.proj.weight.detach()
    torch.testing.assert_close(wv_b, wv_a.T)
    torch.testing.assert_close(wp_b, wp_a.T)
    c_row = (wv_a.T @ wp_a.T).double()  # x ↦ x W_vᵀ W_pᵀ
    c_rel = (wv_b.T @ wp_b.T).double()
    assert torch.trace(c_row).item() == pytest.approx(torch.trace(c_rel).item(), rel=1e-4)
    assert (c_row - c_rel).abs().max().item() > 1e-2  # a different map


def _target_logit_spread(model, offsets):
    """Per block, the largest relative spread (std / mean over queries, per head) of the logits on the target keys
    on ``LN0`` of the pos_embed patch rows carried through the blocks before it by timm's own ``Block.forward``
    (eval mode; logits without bias, float64): what ``pseudo_input='propagated'`` designs for, computed independently
    of the handler. At full rank (49 tokens < head_dim 64) the solve fits ``c·T_i`` exactly, so every target logit of
    a head is the same ``1000·c``: the spread is rounding (~1e-8) where a block was solved for this input."""
    model.eval()
    x = model.pos_embed.detach()[:, model.num_prefix_tokens:]
    grid = tuple(model.patch_embed.grid_size)
    spreads = []
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            p = imp.layer_norm_rows(x[0].double())
            attn = block.attn
            w = attn.qkv.weight.detach().double()
            width = attn.num_heads * attn.head_dim
            q = (p @ w[:width].T).reshape(-1, attn.num_heads, attn.head_dim).transpose(0, 1)
            k = (p @ w[width:2 * width].T).reshape(-1, attn.num_heads, attn.head_dim).transpose(0, 1)
            logits = attn.scale * q @ k.transpose(-2, -1)
            worst = 0.0
            for head, offset in enumerate(offsets[layer]):
                target = imp.shift_index(*grid, offset)
                queries = torch.nonzero(target >= 0).squeeze(1)
                on_target = logits[head, queries, target[queries]]
                worst = max(worst, float(on_target.std() / on_target.mean()))
            spreads.append(worst)
            x = block(x)
    return spreads


@pytest.fixture(scope="module")
def default_and_propagated():
    out = {}
    for name in ("pos_embed", "propagated"):
        m = vit(img=28, patch=4, dim=192, depth=3, heads=3)  # ViT-Ti width: head_dim 64 > 49 tokens
        g = torch.Generator().manual_seed(3)
        report = ii.initialize(m, "impulse", generator=g, pseudo_input=name)
        out[name] = (m, report, g.get_state())
    return out


def test_propagated_pseudo_input_keeps_the_structure_through_the_blocks(default_and_propagated):
    """Each block is solved for the pseudo-input as the blocks before it have transformed it: on that input every
    block realises its designed logits exactly; the released solve (one pseudo-input for every block) does not from
    block 1 on (the control that makes the check discriminate)."""
    m, report, _ = default_and_propagated["propagated"]
    assert report.options["pseudo_input"] == "propagated"
    assert any("pseudo_input='propagated'" in n for n in report.notes)
    assert max(_target_logit_spread(m, report.offsets)) < 1e-5
    m0, report0, _ = default_and_propagated["pos_embed"]
    released = _target_logit_spread(m0, report0.offsets)
    assert released[0] < 1e-5 and min(released[1:]) > 1e-2


def test_propagated_pseudo_input_changes_only_the_qk_rows_of_blocks_after_the_first(default_and_propagated):
    """Same draws as the default (the generator ends in the same state), block 0 and every other tensor bit-identical:
    only the Q and K rows of blocks 1.. differ."""
    (m0, _, state0), (m1, _, state1) = default_and_propagated["pos_embed"], default_and_propagated["propagated"]
    assert torch.equal(state0, state1)
    a, b = m0.state_dict(), m1.state_dict()
    differ = sorted(k for k in a if not torch.equal(a[k], b[k]))
    assert differ == ["blocks.1.attn.qkv.weight", "blocks.2.attn.qkv.weight"]
    width = m0.blocks[0].attn.qkv.out_features // 3
    for name in differ:
        assert torch.equal(a[name][2 * width:], b[name][2 * width:])  # the V rows are the default's


def test_propagated_pseudo_input_is_a_pure_function_of_model_and_generator():
    """The same seed gives the same bits, whatever the thread count (the block forwards run on one intra-op thread)."""
    threads = torch.get_num_threads()
    digests = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            m = vit(img=28, patch=4, dim=96, depth=3, heads=2)
            ii.initialize(m, "impulse", generator=5, pseudo_input="propagated")
            digests.append(state_digest(m))
    finally:
        torch.set_num_threads(threads)
    assert digests[0] == digests[1]
    with pytest.raises(ValueError, match=r"'pseudo_input'.*\('pos_embed', 'propagated', 'calibration'\)"):
        ii.initialize(vit(), "impulse", pseudo_input="layer")
