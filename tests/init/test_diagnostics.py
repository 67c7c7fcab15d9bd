"""attention_maps / summarize / register_attention_maps."""

from __future__ import annotations

import math

import pytest
import torch
from _vit_helpers import vit
from torch import nn

import impulsevit.init as ii
from impulsevit.init import impulse as imp


def test_pseudo_input_maps_are_patch_only():
    m = vit(dim=128, heads=2, depth=3, reg_tokens=2)
    ii.initialize(m, "impulse", generator=0)
    maps = ii.attention_maps(m)
    assert maps.source == "pseudo-input" and maps.grid == (8, 8) and maps.num_prefix == 0
    assert len(maps) == 3 and maps[0].shape == (2, 64, 64)


def test_image_maps_reproduce_the_forward():
    """The captured maps, applied to the values, give exactly the attention module's output."""
    m = vit(dim=128, heads=2, depth=2)
    ii.initialize(m, "impulse", generator=0)
    m.train()
    images = torch.randn(1, 3, 32, 32)
    maps = ii.attention_maps(m, images)
    assert m.training and maps.source == "images" and maps[0].shape == (2, 65, 65) and maps.num_prefix == 1
    captured = {}
    attn = m.blocks[1].attn
    attn.register_forward_hook(lambda mod, args, out: captured.update(x=args[0], out=out))
    m.eval()
    with torch.no_grad():
        m(images)
    x = captured["x"]
    v = attn.qkv(x).reshape(1, 65, 3, 2, 64)[:, :, 2].transpose(1, 2)  # (1, h, T, d)
    out = attn.proj((maps[1].unsqueeze(0) @ v).transpose(1, 2).reshape(1, 65, 128))
    torch.testing.assert_close(out, captured["out"], rtol=1e-4, atol=1e-5)


def test_summarize_on_ideal_and_uniform_maps():
    h, w = 6, 5
    n = h * w
    offsets = [(0, 0), (0, 1), (-1, -1)]
    ideal = torch.zeros(3, n, n)
    for i, off in enumerate(offsets):
        idx = imp.shift_index(h, w, off)
        for q in range(n):
            if idx[q] >= 0:
                ideal[i, q, idx[q]] = 1.0
            else:
                ideal[i, q] = 1.0 / n
    uniform = torch.full((3, n, n), 1.0 / n)
    s = ii.summarize([ideal, uniform], [offsets], grid=(h, w))
    assert isinstance(s, ii.Summary) and len(s) == 6
    for rec, off in zip(s[:3], offsets):
        assert rec.offset == off and rec.hit_rate == 1.0 and rec.target_mass == 1.0
    assert s[0].entropy == 0.0 and s[0].distance == 0.0 and math.isnan(s[0].border_max)
    r, c = torch.arange(n) // w, torch.arange(n) % w
    dist = ((r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2).float().sqrt()
    border = c == w - 1  # (0, +1) has no target in the last column: uniform rows there
    expect = (1.0 * (~border).sum() + dist[border].mean(1).sum()) / n
    assert abs(s[1].distance - expect.item()) < 1e-5
    assert abs(s[2].border_max - 1.0 / n) < 1e-6
    for rec in s[3:]:
        assert abs(rec.entropy - math.log(n)) < 1e-5 and abs(rec.target_mass - 1.0 / n) < 1e-6
    assert "target_mass" in s.table() and len(str(s).splitlines()) == 7
    assert s.mean("hit_rate", offset=(0, 1)) == 0.5 * (1.0 + s[4].hit_rate)


def test_summarize_with_prefix_tokens_and_report_offsets():
    m = vit(dim=128, heads=2)
    report = ii.initialize(m, "impulse", generator=1)
    maps = ii.attention_maps(m, torch.randn(2, 3, 32, 32))
    s = ii.summarize(maps, report)
    assert len(s) == 4 and all(0.0 <= r.target_mass <= 1.0 for r in s)
    plain = ii.summarize(list(maps), report.offsets, grid=(8, 8), num_prefix=1)
    assert [r.target_mass for r in plain] == [r.target_mass for r in s]
    with pytest.raises(ValueError, match="expected 64 \\+ 0 prefix"):
        ii.summarize(list(maps), report.offsets, grid=(8, 8))
    with pytest.raises(ValueError, match="needs the token grid"):
        ii.summarize(list(maps), report.offsets)


def test_impulse_structure_survives_into_real_forward_of_first_layer():
    imgs = torch.randn(4, 3, 32, 32)
    a, b = vit(dim=128, heads=2, depth=1), vit(dim=128, heads=2, depth=1)
    ra = ii.initialize(a, "impulse", generator=0)
    ii.initialize(b, "torch", generator=0)
    sa = ii.summarize(ii.attention_maps(a, imgs), ra.offsets)
    sb = ii.summarize(ii.attention_maps(b, imgs), ra.offsets)
    assert sa.mean("target_mass") > 5 * sb.mean("target_mass")


def test_register_attention_maps_for_another_family():
    class Toy(nn.Module):
        pass

    @ii.register_attention_maps(matches=lambda mdl: isinstance(mdl, Toy))
    def _toy(model, images):
        return ii.AttentionMaps([torch.full((1, 4, 4), 0.25)], (2, 2), 0, "pseudo-input")

    maps = ii.attention_maps(Toy())
    assert maps.grid == (2, 2) and ii.summarize(maps)[0].entropy == pytest.approx(math.log(4))
    with pytest.raises(ValueError, match="no attention-map diagnostics registered for Linear"):
        ii.attention_maps(nn.Linear(2, 2))


def test_demo_prints_reports_and_summaries(capsys):
    from impulsevit.init.demo import main

    main(["--layers", "1", "--images", "1", "--img-size", "128"])
    out = capsys.readouterr().out
    assert "init=impulse" in out and "init=mimetic" in out
    assert out.count("target_mass") == 4 and "random-noise images" in out
