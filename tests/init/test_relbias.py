"""Impulse for relative-bias attention (BEiT, relpos ViT, Swin v2, Swin v2-CR): the *model's own forward* on real
images (Fashion-MNIST when installed) puts every head's argmax on its one-tap offset for every interior query of every
image; a construction with the sign of the offset flipped fails the same check; mimetic refuses in one line."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from _real_images import real_images
from test_swin import check_block

import impulsevit.init as ii
from impulsevit.init import relbias
from impulsevit.init.capture import captured_attention
from impulsevit.init.impulse import shift_index

SMALL = dict(img_size=28, patch_size=4, embed_dim=48, depth=3, num_heads=3, num_classes=10)
VITS = {
    "beit_per_block": ("beit_base_patch16_224", {}),
    "beit_shared": ("beit_base_patch16_224", dict(use_rel_pos_bias=False, use_shared_rel_pos_bias=True)),
    "relpos_mlp": ("vit_relpos_small_patch16_224", {}),
    "relpos_mlp_cls": ("vit_relpos_small_patch16_224", dict(class_token=True, global_pool="token")),
    "relpos_mlp_swin": ("vit_relpos_small_patch16_224", dict(rel_pos_type="mlp_swin")),
    "relpos_table": ("vit_relpos_small_patch16_224", dict(rel_pos_type="bias")),
    "relpos_table_cls": ("vit_relpos_small_patch16_224", dict(rel_pos_type="bias", class_token=True,
                                                             global_pool="token")),
    "srelpos_shared": ("vit_srelpos_small_patch16_224", {}),
}
SWINS = {
    "swinv2": ("swinv2_tiny_window8_256", dict(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(2, 2),
                                               num_heads=(3, 6), num_classes=10)),
    "swinv2_cr": ("swinv2_cr_tiny_224", dict(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(2, 2),
                                             num_heads=(3, 6), num_classes=10)),
}


def build(name: str, kw: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **kw)


def vit_hits(model: torch.nn.Module, offsets: list[list[tuple[int, int]]], images: torch.Tensor) -> torch.Tensor:
    """Per layer and head, the share of (image, interior query) pairs whose argmax key is the target — from the
    attention probabilities of the model's own forward."""
    grid = tuple(model.patch_embed.grid_size)
    prefix = model.num_prefix_tokens
    maps = captured_attention(model, images)
    assert len(maps) == len(offsets)
    out = torch.zeros(len(maps), len(offsets[0]))
    for layer, (attn, offs) in enumerate(zip(maps, offsets)):
        for head, off in enumerate(offs):
            target = shift_index(grid[0], grid[1], off)
            margin = max(1, abs(off[0]), abs(off[1]))
            r, c = torch.arange(grid[0] * grid[1]) // grid[1], torch.arange(grid[0] * grid[1]) % grid[1]
            interior = ((r >= margin) & (r < grid[0] - margin) & (c >= margin) & (c < grid[1] - margin)).nonzero()[:, 0]
            top = attn[:, head, prefix + interior].argmax(-1)  # (B, interior)
            out[layer, head] = (top == prefix + target[interior]).float().mean()
    return out


@pytest.mark.parametrize("case", sorted(VITS))
def test_vit_argmax_is_target_on_real_images(case):
    name, extra = VITS[case]
    model = build(name, {**SMALL, **extra})
    report = ii.initialize(model, "impulse", generator=0)
    assert report.family == "relbias" and len(report.offsets) == 3
    assert report.offsets[0] == ii.impulse_offsets(3)
    hits = vit_hits(model, report.offsets, real_images(4, 28))
    assert torch.equal(hits, torch.ones_like(hits)), hits
    # the init report's mass on the real images (from the registered diagnostics) is near the designed 0.75
    summary = ii.summarize(ii.attention_maps(model, real_images(4, 28)), report)
    assert all(s.hit_rate == 1.0 for s in summary)
    assert 0.6 < summary.mean("target_mass") < 0.9


@pytest.mark.parametrize("case", ["beit_per_block", "relpos_mlp", "relpos_table", "srelpos_shared"])
def test_flipped_offset_sign_fails_the_check(case, monkeypatch):
    """The same construction with (dy, dx) → (−dy, −dx): the check above must reject it."""
    name, extra = VITS[case]
    model = build(name, {**SMALL, **extra})
    real_target_rows = relbias.target_rows
    monkeypatch.setattr(relbias, "target_rows",
                        lambda carrier, offsets: real_target_rows(carrier, [(-dy, -dx) for dy, dx in offsets]))
    report = ii.initialize(model, "impulse", generator=0)
    hits = vit_hits(model, report.offsets, real_images(4, 28))
    assert hits[:, 0].min() == 1.0  # the self head has no sign
    assert hits[:, 1:].max() == 0.0  # the shift heads peak on the opposite neighbour


@pytest.mark.parametrize("case", sorted(SWINS))
def test_swinv2_argmax_is_target_per_window_on_real_images(case):
    name, kw = SWINS[case]
    model = build(name, kw)
    report = ii.initialize(model, "impulse", generator=0)
    assert report.family == "swinv2"
    assert any("residual max" in n for n in report.notes) and any("logit_scale set to ln(1.0)" in n
                                                                    for n in report.notes)
    for note in report.notes:
        if "residual max" in note:  # 16 hidden-feature rows... the fit is exact for 4x4 windows
            assert float(note.split("residual max ")[1].split(",")[0]) < 1e-6
    blocks = [m for m in model.modules() if type(m).__name__ in ("SwinTransformerV2Block", "SwinTransformerV2CrBlock")]
    images = real_images(2, 32)
    maps = captured_attention(model, images)
    assert len(maps) == len(blocks) == len(report.offsets) == 4
    shifted = 0
    for blk, attn, offs in zip(blocks, maps, report.offsets):
        resolution = tuple(getattr(blk, "input_resolution", None) or blk.feat_size)
        rec = {"attn": attn, "mask": blk.attn_mask, "resolution": resolution, "window": tuple(blk.window_size),
               "shift": tuple(blk.shift_size)}
        if any(rec["shift"]) and rec["mask"] is not None:
            shifted += 1
        # cosine logits with logit_scale 1 move a logit by at most ±1: worst-case target mass e^(c−2)/(e^(c−2)+15)
        # = 0.29 for c = 3.81 (4x4 window); the argmax must still be the target everywhere
        check_block(rec, offs, share=0.75, mass_tol=0.46)
    assert shifted >= 1
    mean_mass = ii.summarize(ii.attention_maps(model, images), report).mean("target_mass")
    assert 0.6 < mean_mass < 0.9


def test_swinv2_cpb_least_squares_and_sigmoid_target():
    """The realised 16·sigmoid bias of every window attention is c above the flat level at the target (margin = c)."""
    name, kw = SWINS["swinv2"]
    model = build(name, kw)
    report = ii.initialize(model, "impulse", generator=0)
    c = math.log(0.75 * 15 / 0.25)
    for users, carrier in relbias.bias_carriers(model):
        bias = relbias.carrier_bias(carrier)  # (heads, n, n)
        offs = report.offsets[users[0]]
        for head, off in enumerate(offs):
            target = shift_index(*carrier.window, off)
            has = target >= 0
            tgt = bias[head, has.nonzero()[:, 0], target[has]]
            assert torch.allclose(tgt - 16 * 0.01, torch.full_like(tgt, c), atol=1e-3)
        assert float(carrier.logit_scale.detach().abs().max()) == 0.0


def test_relpos_mlp_residual_is_reported_and_bigger_window_keeps_argmax():
    """RelPosMlp at 14x14 tokens: 729 relative positions, 128 hidden units — an approximate fit whose residual the
    report states; the target still wins every query."""
    model = build("vit_relpos_small_patch16_224", dict(img_size=56, patch_size=4, embed_dim=48, depth=1, num_heads=3))
    report = ii.initialize(model, "impulse", generator=0)
    note = next(n for n in report.notes if "residual max" in n)
    assert float(note.split("residual max ")[1].split(",")[0]) > 1e-3
    assert float(note.split("worst target margin ")[1]) > 0
    hits = vit_hits(model, report.offsets, real_images(2, 56))
    assert torch.equal(hits, torch.ones_like(hits))


def test_mimetic_refuses_in_one_line_and_options_validated():
    for case in ("beit_per_block", "relpos_mlp"):
        model = build(VITS[case][0], {**SMALL, **VITS[case][1]})
        with pytest.raises(ValueError, match="init method 'mimetic' cannot be applied to") as err:
            ii.initialize(model, "mimetic")
        assert "\n" not in str(err.value)
    model = build(VITS["relpos_mlp"][0], SMALL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="option 'target_mass' of init method 'impulse' .* must be in"):
        ii.initialize(model, "impulse", target_mass=1.5)
    with pytest.raises(TypeError, match="unknown option"):
        ii.initialize(model, "impulse", gain_qk=3)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_beit_without_relative_bias_stays_a_vit():
    model = build("beit_base_patch16_224", {**SMALL, "use_rel_pos_bias": False, "use_abs_pos_emb": True})
    assert not relbias.is_relbias_vit(model)
