"""split_logits / logit_terms: the attention logits on real images split into position and content terms."""

from __future__ import annotations

import pytest
import torch
from _real_images import real_images
from _vit_helpers import vit

import impulsevit.init as ii
from impulsevit.init.logit_terms import TERMS, logit_terms, split_logits


@pytest.fixture(scope="module")
def model_and_report():
    torch.manual_seed(0)
    m = vit(img=28, patch=4, dim=64, depth=3, heads=2)
    return m, ii.initialize(m, "impulse", generator=0)


@pytest.fixture(scope="module")
def images():
    return real_images(6, 28)


def _forward_logits(attn, u):
    """The scaled logits ``(B, h, T, T)`` from a captured norm1 output, as timm's Attention computes them."""
    b, t, _ = u.shape
    qkv = attn.qkv(u).reshape(b, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    return (qkv[0] * attn.scale) @ qkv[1].transpose(-2, -1)


def test_the_four_terms_add_up_to_the_forward_logits(model_and_report, images):
    m, _ = model_and_report
    splits = split_logits(m, images)
    maps = ii.attention_maps(m, images)
    assert len(splits) == 3
    with torch.no_grad():
        for layer, split in enumerate(splits):
            torch.testing.assert_close(split["u_p"] + split["u_c"], split["u"], rtol=0, atol=1e-5)
            total = sum(split[k] for k in TERMS)
            torch.testing.assert_close(total, _forward_logits(m.blocks[layer].attn, split["u"]), rtol=1e-4,
                                       atol=1e-4)
            # and the softmax of the sum is the attention the diagnostics read off the real forward
            torch.testing.assert_close(torch.softmax(total, -1).mean(0), maps[layer], rtol=1e-4, atol=1e-5)
            assert all(split[k].abs().max() > 1e-3 for k in TERMS)  # every term is really there on images


def test_content_terms_vanish_on_the_zero_image(model_and_report):
    m, _ = model_and_report
    for split in split_logits(m, torch.zeros(2, 3, 28, 28)):
        assert split["u_c"].abs().max() < 1e-5
        for k in TERMS[1:]:
            assert split[k].abs().max() < 1e-4, k
        assert split["pos_pos"].abs().max() > 1.0


def test_logit_terms_table(model_and_report, images):
    m, report = model_and_report
    table = logit_terms(m, images, report.offsets)
    assert [t.layer for t in table] == [0, 1, 2]
    summary = ii.summarize(ii.attention_maps(m, images), report)
    for t in table:
        assert min(getattr(t, k) for k in TERMS) > 0 and t.logits > 0 and 0 < t.pos_share
        expected = sum(s.target_mass for s in summary if s.layer == t.layer) / 2
        assert abs(t.mass - expected) < 1e-4  # the mass of the diagnostics' own summary
        assert 0 <= t.mass_pos <= 1 and 0 <= t.mass_zero <= 1
    assert table[0].mass_zero > 0.9  # block 0 sees its designed pseudo-input (plus biases) on the zero image
    assert "cont-cont" in table.table() and table.markdown().count("\n") == 4
    assert len(table.to_dict()) == 3


def test_logit_terms_refuses_a_model_without_a_layernorm_prenorm(model_and_report, images):
    m = vit(img=28, patch=4, dim=64, depth=1, heads=2)
    m.blocks[0].norm1 = torch.nn.Identity()
    with pytest.raises(ValueError, match=r"blocks.0.norm1 is Identity, not a LayerNorm"):
        split_logits(m, images)
    with pytest.raises(ValueError, match="offsets has 2 layers"):
        logit_terms(model_and_report[0], images, [[(0, 1), (1, 0)]] * 2)
