"""Swin impulse / mimetic initializers: the *real* attention of timm's forward (captured from its softmax) peaks on
each head's target neighbour, windows and shifted-window masks behave like zero padding, mimetic factors are exact."""

import math

import pytest
import torch
from timm.models.swin_transformer import SwinTransformer

import impulsevit.init as ii
from impulsevit.init.impulse import impulse_offsets, mimetic_qk_factors, value_proj_factors
from impulsevit.init.swin import swin_blocks, swin_summary, swin_window_attention

# small: 16x16 then 8x8 tokens, window 4 (shift 2 in odd blocks); real: 14x14 then 7x7 tokens, window 7 (shift 3)
CONFIGS = {
    "small_w4": dict(img_size=32, patch_size=2, window_size=4, embed_dim=36, depths=(2, 2), num_heads=(3, 9)),
    "real_w7": dict(img_size=56, patch_size=4, window_size=7, embed_dim=36, depths=(2, 2), num_heads=(3, 9)),
}


def make(name: str) -> SwinTransformer:
    torch.manual_seed(0)
    return SwinTransformer(num_classes=10, **CONFIGS[name]).eval()


def zero_qk(model: SwinTransformer) -> None:
    """Make every block's Q/K contribution exactly zero (q = k = 0), so logits = bias table + shift mask."""
    with torch.no_grad():
        for _, blk in swin_blocks(model):
            attn, d = blk.attn, blk.attn.qkv.out_features // 3
            attn.qkv.weight[: 2 * d].zero_()
            attn.qkv.bias[: 2 * d].zero_()


def geometry(rec: dict, offset: tuple[int, int]):
    """For every (window, query) of one block: the key index of the head's legal target (or -1), and a bool matrix of
    the keys that sit at the query's window offset only because of the cyclic roll (wrapped: their original positions
    are not neighbours). Computed from image coordinates, independent of timm's relative-position convention."""
    (h, w), (wh, ww), (sy, sx) = rec["resolution"], rec["window"], rec["shift"]
    assert h % wh == 0 and w % ww == 0, "test configs avoid padded windows"
    dy, dx = offset
    n_win_x = w // ww
    n_win = (h // wh) * n_win_x
    target = torch.full((n_win, wh * ww), -1, dtype=torch.long)
    wrapped = torch.zeros(n_win, wh * ww, wh * ww, dtype=torch.bool)
    for y in range(h):  # rolled coordinates: rolled (y, x) holds original ((y + sy) % h, (x + sx) % w)
        for x in range(w):
            ky, kx = y + dy, x + dx  # the key at the head's offset in the rolled grid
            if not (0 <= ky < h and 0 <= kx < w) or (ky // wh, kx // ww) != (y // wh, x // ww):
                continue  # outside the image or the window: no target (zero padding)
            win, q, k = (y // wh) * n_win_x + x // ww, (y % wh) * ww + x % ww, (ky % wh) * ww + kx % ww
            oy, ox = (y + sy) % h, (x + sx) % w
            if ((ky + sy) % h, (kx + sx) % w) == (oy + dy, ox + dx):
                target[win, q] = k
            else:
                wrapped[win, q, k] = True
    return target, wrapped


def check_block(rec: dict, offsets, share: float, mass_tol: float) -> dict:
    attn = rec["attn"]  # (B*nW, heads, n, n)
    mask = rec["mask"]
    (h, w), (wh, ww) = rec["resolution"], rec["window"]
    n_win = (h // wh) * (w // ww)
    attn = attn.view(-1, n_win, *attn.shape[1:])  # (B, nW, heads, n, n)
    assert torch.allclose(attn.sum(-1), torch.ones(()), atol=1e-5)
    stats = {"targets": 0, "no_target": 0, "wrapped": 0, "min_mass": 1.0}
    for hd, off in enumerate(offsets):
        target, wrapped = geometry(rec, off)
        a = attn[:, :, hd]  # (B, nW, n, n)
        has = target >= 0
        if mask is not None:  # a legal target is never masked: the window border, not the mask, removes neighbours
            masked = mask != 0
            assert not masked.gather(2, target.clamp_min(0).unsqueeze(-1)).squeeze(-1)[has].any()
        top = a.argmax(-1)  # (B, nW, n)
        tmass = a.gather(-1, target.clamp_min(0).expand_as(top).unsqueeze(-1)).squeeze(-1)
        assert (top == target)[:, has].all(), f"head {hd} offset {off}: argmax is not the target neighbour"
        assert (tmass[:, has] >= share - mass_tol).all(), f"head {hd}: target mass {tmass[:, has].min():.4f} < {share}"
        # zero padding: no mass on the wrapped (rolled-in) neighbour, and no argmax on a masked key
        assert float((a * wrapped).max()) < 1e-6
        stats["wrapped"] += int(wrapped.sum())
        if mask is not None:
            assert not masked.expand(top.shape[0], -1, -1, -1).gather(-1, top.unsqueeze(-1)).any()
        stats["targets"] += int(has.sum())
        stats["no_target"] += int((~has).sum())
        if has.any():
            stats["min_mass"] = min(stats["min_mass"], float(tmass[:, has].min()))
            # queries with no target are diffuse (flat bias row): they never reach the target share
            assert (a.max(-1).values[:, ~has] < share).all()
    return stats


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_zero_qk_attention_peaks_on_target(name):
    model = make(name)
    report = ii.initialize(model, "impulse", generator=0)
    assert report.family == "swin" and report.options["target_mass"] == 0.75
    zero_qk(model)
    size = model.patch_embed.img_size
    records = swin_window_attention(model, torch.randn(2, 3, size[0], size[1]))
    assert records[1]["shift"] != (0, 0) and records[1]["mask"] is not None  # shifted windows are exercised
    total = 0
    for rec, offs in zip(records, report.offsets):
        assert offs == impulse_offsets(rec["attn"].shape[1])
        stats = check_block(rec, offs, share=0.75, mass_tol=1e-5)
        total += stats["targets"]
        assert stats["no_target"] > 0  # window borders exist in every block
        assert (stats["wrapped"] > 0) == (rec["mask"] is not None)  # shifted blocks have rolled-in neighbours
        # every query with a target (full or masked window) gets at least the configured share, full windows exactly
        assert stats["min_mass"] == pytest.approx(0.75, abs=1e-5)
    assert total > 1000


@pytest.mark.parametrize("base", ["keep", "torch"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_default_qk_attention_peaks_on_target(name, base):
    """timm's own Q/K init (trunc-normal 0.02, ``base='keep'``) or PyTorch's constructor init (``base='torch'``, larger
    Q/K: content logits of order 1) plus random images: argmax still the target for every query that has one; the
    worst query keeps most of the designed 0.75 on timm's Q/K and over a third on PyTorch's."""
    model = make(name)
    report = ii.initialize(model, "impulse", generator=0, base=base)
    size = model.patch_embed.img_size
    records = swin_window_attention(model, torch.randn(2, 3, size[0], size[1]))
    tol = 0.03 if base == "keep" else 0.45
    worst = min(check_block(rec, offs, share=0.75, mass_tol=tol)["min_mass"]
                for rec, offs in zip(records, report.offsets))
    assert worst > (0.72 if base == "keep" else 0.3)


def test_bias_table_values_and_7x7_share():
    model = make("real_w7")
    report = ii.initialize(model, "impulse", generator=0, target_mass=0.9)
    c = math.log(0.9 * 48 / 0.1)
    assert any(f"bias c={c:.4f}" in note for note in report.notes)
    for _, blk in swin_blocks(model):
        table = blk.attn.relative_position_bias_table.detach()
        assert table.shape == (169, blk.attn.num_heads)
        assert torch.equal((table != 0).sum(0), torch.ones(blk.attn.num_heads, dtype=torch.long))
        assert torch.allclose(table.max(0).values, torch.tensor(c, dtype=table.dtype))
    summary = swin_summary(model)
    for row in summary:
        for head in row:
            assert head["hit_rate"] == 1.0
            assert head["target_mass"] == pytest.approx(0.9, abs=1e-5)


def test_fixed_bias_option_and_validation_leaves_model_unchanged():
    model = make("small_w4")
    ii.initialize(model, "impulse", bias=2.0)
    assert all(float(b.attn.relative_position_bias_table.detach().max()) == 2.0 for _, b in swin_blocks(model))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="option 'target_mass' of init method 'impulse' .* must be in"):
        ii.initialize(model, "impulse", target_mass=1.0)
    with pytest.raises(TypeError, match="unknown option"):
        ii.initialize(model, "impulse", gain=3)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_mimetic_swin_factors_exact():
    model = make("small_w4")
    report = ii.initialize(model, "mimetic", generator=5, base="keep")
    assert report.family == "swin"
    g = torch.Generator().manual_seed(5)
    for _, blk in swin_blocks(model):
        attn = blk.attn
        dim, h = attn.qkv.in_features, attn.num_heads
        d = dim // h
        wq, wk, a = mimetic_qk_factors(dim, h, d, g, 0.7, 0.7)
        wv, wo, cmat = value_proj_factors(dim, g, 0.4, 0.4)
        w = attn.qkv.weight.detach().double()
        for i in range(h):
            q, k = w[i * d:(i + 1) * d], w[dim + i * d:dim + (i + 1) * d]
            # W_q^T W_k is the best rank-d approximation of A_i = 0.7 Z + 0.7 I
            s_model = torch.linalg.svdvals(q.T @ k)[:d]
            s_target = torch.linalg.svdvals(a[i])[:d]
            assert torch.allclose(s_model, s_target, rtol=1e-4, atol=1e-5)
            assert torch.allclose(q, wq[i], atol=1e-6) and torch.allclose(k, wk[i], atol=1e-6)
        x = torch.randn(5, dim, dtype=torch.float64)
        out = (x @ w[2 * dim:].T) @ attn.proj.weight.detach().double().T
        assert torch.allclose(out, x @ cmat, atol=1e-5)
        assert float(cmat.diagonal().mean()) == pytest.approx(-0.4, abs=0.05)


def test_mimetic_rejects_uneven_heads_before_writing():
    torch.manual_seed(0)
    model = SwinTransformer(num_classes=10, img_size=32, patch_size=2, window_size=4, embed_dim=32, depths=(2,),
                            num_heads=(3,))  # 32 / 3 heads -> heads*head_dim = 30 != 32
    before = model.layers[0].blocks[0].attn.qkv.weight.detach().clone()
    with pytest.raises(ValueError, match=r"SwinTransformer: block 'layers.0.blocks.0' has heads·head_dim=30 != dim=32"):
        ii.initialize(model, "mimetic")
    assert torch.equal(before, model.layers[0].blocks[0].attn.qkv.weight)
    ii.initialize(model, "mimetic", value="default")  # Q/K only is fine


def test_swin_v2_goes_to_its_own_adapter_and_other_methods_rejected():
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    v2 = SwinTransformerV2(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(2,), num_heads=(3,))
    assert ii.initialize(v2, "impulse").family == "swinv2"  # tests/init/test_relbias.py checks its attention
    with pytest.raises(ValueError, match="cannot be applied to SwinTransformer"):
        ii.initialize(make("small_w4"), "box")


def test_all_parameters_finite_after_init():
    for method in ("impulse", "mimetic"):
        model = make("small_w4")
        ii.initialize(model, method, generator=1)
        assert all(torch.isfinite(p).all() for p in model.parameters())
        assert torch.isfinite(model(torch.randn(1, 3, 32, 32))).all()


def test_registered_diagnostics_attention_maps_and_summarize():
    model = make("small_w4")
    report = ii.initialize(model, "impulse", generator=0)
    maps = ii.attention_maps(model)
    assert maps.grid == (4, 4) and maps.source == "pseudo-input" and len(maps) == 4
    summary = ii.summarize(maps, report)
    shift_heads = [s for s in summary if s.offset != (0, 0)]
    assert all(s.hit_rate == 1.0 and s.target_mass == pytest.approx(0.75, abs=1e-5) for s in summary)
    # queries without an in-window neighbour are flat: max prob = 1/16 (zero padding, nothing wrapped)
    assert all(s.border_max == pytest.approx(1 / 16, abs=1e-6) for s in shift_heads)
    real = ii.summarize(ii.attention_maps(model, torch.randn(2, 3, 32, 32)), report)
    assert all(s.hit_rate == 1.0 for s in real)
    # different windows per block (stage resolution below the window) -> clear error
    torch.manual_seed(0)
    mixed = SwinTransformer(num_classes=10, img_size=32, patch_size=4, window_size=4, embed_dim=24, depths=(2, 2, 2),
                            num_heads=(3, 3, 3))  # resolutions 8, 4, 2 -> windows 4, 4, 2
    with pytest.raises(ValueError, match="different windows"):
        ii.attention_maps(mixed)
    ii.initialize(mixed, "impulse")
    assert [row[1]["hit_rate"] for row in swin_summary(mixed)] == [1.0] * 6


def test_kernel5_and_random_offsets():
    model = make("real_w7")
    report = ii.initialize(model, "impulse", kernel_size=5)
    assert report.offsets[2] == ii.kernel_offsets(5)[:9]
    for row in swin_summary(model):
        assert all(h["hit_rate"] == 1.0 for h in row)
    a = ii.initialize(make("small_w4"), "impulse", offsets="random", generator=3).offsets
    b = ii.initialize(make("small_w4"), "impulse", offsets="random", generator=3).offsets
    c = ii.initialize(make("small_w4"), "impulse", offsets="random", generator=4).offsets
    assert a == b and a != c
