"""impulse's ``pseudo_input='calibration'``: each block's Q/K solved for its normed tokens on real training images.

What is checked: the solve is the released one when the "batch" is the pseudo-input itself (so it departs from the
released algorithm only in what it solves for); on held-out Fashion-MNIST images the calibrated start keeps most of
each head's attention on its offset in every block, where the released start loses it with depth (measured with
timm's own forward, not the handler's); the result is a pure function of model, generator and images; bad input is
one line before any write. Through ``impulsevit fit``: tests/e2e/test_calibration_fit.py.
"""

from __future__ import annotations

import pytest
import torch
from _vit_helpers import state_digest, vit

import impulsevit.init as ii
from impulsevit.init import impulse as imp
from impulsevit.init.diagnostics import attention_maps, summarize


def _fashion(split: str, n: int) -> torch.Tensor:
    """The first ``n`` Fashion-MNIST images of ``split`` (Debian's copy), 3 channels, normalised as the datamodule."""
    from impulsevit.data.sources.formats import read_fashion_mnist
    from impulsevit.data.sources.registry import get_dataset

    info = get_dataset("fashion_mnist")
    x = torch.tensor(read_fashion_mnist(None, split).images[:n]).float().reshape(-1, 1, 28, 28) / 255
    return (x.repeat(1, 3, 1, 1) - info.mean[0]) / info.std[0]


def test_on_one_pseudo_input_the_calibrated_solve_is_the_released_solve():
    """``rows = P[None]``, no ridge: the same ``W_qᵀW_k`` per head, the same factor norms and target logits as
    :func:`solve_qk` — the construction departs from the released one only in the rows it is solved for."""
    g = torch.Generator().manual_seed(0)
    h = w = 8
    p = imp.layer_norm_rows(torch.randn(h * w, 192, generator=g, dtype=torch.float64))
    offsets = [(0, 0), (1, 0), (0, -1)]
    noise = imp.draw_noise(3, h * w, g)
    ref = imp.solve_qk(imp.factor_pseudo_input(p, 64), h, w, offsets, noise, 64)
    cal = imp.solve_qk_calibrated(p[None], h, w, offsets, noise, 64, ridge=0.0)
    for i in range(3):
        product = ref.wq[i].T @ ref.wk[i]
        torch.testing.assert_close(cal.wq[i].T @ cal.wk[i], product, rtol=0, atol=1e-12 * product.abs().max())
        torch.testing.assert_close(cal.wq[i].norm(), ref.wq[i].norm())
    torch.testing.assert_close(cal.target_logit, ref.target_logit)
    ridged = imp.solve_qk_calibrated(p[None], h, w, offsets, noise, 64, ridge=1.0)  # the control: a ridge changes it
    assert (ridged.wq[1].T @ ridged.wk[1] - ref.wq[1].T @ ref.wk[1]).abs().max() > 1e-3 * ref.wq[1].norm() ** 2


@pytest.fixture(scope="module")
def profiles():
    """Mean target mass per block on 128 held-out test images: released vs calibrated on 64 training images, at the
    option's default ridge (0.1) and at 1.0."""
    calibration, held_out = _fashion("train", 64), _fashion("test", 128)
    out = {}
    for name, options, images in (("released", {}, None), ("calibration", {"pseudo_input": "calibration"},
                                                            calibration),
                                  ("ridge1", {"pseudo_input": "calibration", "calibration_ridge": 1.0}, calibration)):
        m = vit(img=28, patch=4, dim=192, depth=4, heads=3)  # ViT-Ti width on a 7 x 7 grid
        report = ii.initialize(m, "impulse", generator=3, calibration=images, **options)
        summary = summarize(attention_maps(m, held_out), report.offsets)
        out[name] = [sum(s.target_mass for s in summary if s.layer == b) / 3 for b in range(4)]
        out[name + "_report"] = report
    return out


def test_calibrated_start_keeps_the_offset_through_depth_on_held_out_images(profiles):
    """On images the solve never saw: >= 0.5 of the attention on the offset in every block at the default ridge
    (0.57-0.73 here) and >= 0.8 at ridge 1.0; the released start (the control, the same draws) falls below 0.3 by
    the last block."""
    assert min(profiles["calibration"]) >= 0.5, profiles["calibration"]
    assert min(profiles["ridge1"]) >= 0.8, profiles["ridge1"]
    assert profiles["released"][-1] < 0.3, profiles["released"]
    assert profiles["calibration"][-1] > profiles["released"][-1] + 0.2


def test_the_report_names_the_calibration_batch(profiles):
    report = profiles["calibration_report"]
    images = _fashion("train", 64)
    import hashlib

    assert report.options["calibration"] == {
        "images": 64, "shape": [64, 3, 28, 28],
        "sha256": hashlib.sha256(images.float().contiguous().numpy().tobytes()).hexdigest()}
    assert report.options["pseudo_input"] == "calibration"
    assert any("pseudo_input='calibration'" in n for n in report.notes)
    assert "calibration" not in profiles["released_report"].options


def test_a_pure_function_of_model_generator_and_images():
    """The same images and seed give the same bits whatever the thread count; other images give other Q/K (the
    solve reads them) and the same everything else (the draws are the released ones, in its order)."""
    images = _fashion("train", 16)
    threads = torch.get_num_threads()
    models = []
    try:
        for n, batch in ((1, images), (2, images), (2, _fashion("train", 32)[16:])):
            torch.set_num_threads(n)
            m = vit(img=28, patch=4, dim=96, depth=2, heads=2)
            ii.initialize(m, "impulse", generator=5, calibration=batch, pseudo_input="calibration",
                          calibration_images=16)
            models.append(m)
    finally:
        torch.set_num_threads(threads)
    assert state_digest(models[0]) == state_digest(models[1])
    a, b = models[1].state_dict(), models[2].state_dict()
    assert sorted(k for k in a if not torch.equal(a[k], b[k])) == ["blocks.0.attn.qkv.weight",
                                                                  "blocks.1.attn.qkv.weight"]
    width = models[1].blocks[0].attn.qkv.out_features // 3
    assert torch.equal(a["blocks.0.attn.qkv.weight"][2 * width:], b["blocks.0.attn.qkv.weight"][2 * width:])


@pytest.mark.parametrize(("options", "images", "message"), [
    ({"pseudo_input": "calibration"}, None, "needs a calibration batch of 64 images"),
    ({"pseudo_input": "calibration", "calibration_images": 8}, torch.zeros(4, 3, 28, 28),
     r"expected at least 8 images \(n, C, H, W\), got shape \(4, 3, 28, 28\)"),
    ({"pseudo_input": "calibration", "calibration_images": 2}, torch.full((2, 3, 28, 28), float("nan")),
     "not all finite"),
    ({}, torch.zeros(2, 3, 28, 28), "takes no calibration batch with these options"),
    ({"pseudo_input": "calibration", "calibration_images": 0}, None, "calibration_images must be >= 1"),
])
def test_bad_calibration_input_is_one_line_and_writes_nothing(options, images, message):
    m = vit(img=28, patch=4, dim=96, depth=2, heads=2)
    before = state_digest(m)
    with pytest.raises(ValueError, match=message) as err:
        ii.initialize(m, "impulse", generator=0, calibration=images, **options)
    assert "\n" not in str(err.value)
    assert state_digest(m) == before
