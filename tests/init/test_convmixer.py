"""ConvMixer: registered CIFAR variants, impulse / box / random spatial filters with the earlier release's scaling
(docs/method.md §4.4), and frozen vs trainable filters across a real AdamW step."""

import math

import pytest
import timm
import torch

import impulsevit.init as ii
import impulsevit.models  # noqa: F401  (registers convmixer_cifar_*)
from impulsevit.init.convmixer import convmixer_filter_summary, convmixer_filter_taps, spatial_convs


def make(kernel_size: int = 3, dim: int = 32, depth: int = 2, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("convmixer_cifar", dim=dim, depth=depth, kernel_size=kernel_size, **kwargs)


def test_registered_variants():
    assert {"convmixer_cifar", "convmixer_cifar_256_8_k3", "convmixer_cifar_512_6_k3",
            "convmixer_cifar_512_6_k5"} <= set(timm.list_models("convmixer_cifar*"))
    model = timm.create_model("convmixer_cifar_256_8_k3", num_classes=10)
    assert model.stem[0].kernel_size == (2, 2) and model.stem[0].stride == (2, 2)
    convs = spatial_convs(model)
    assert len(convs) == 8 and all(c.weight.shape == (256, 1, 3, 3) for _, c, _, _ in convs)
    assert model.pretrained_cfg["input_size"] == (3, 32, 32)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    for name, dim, depth, k in (("convmixer_cifar_512_6_k3", 512, 6, 3), ("convmixer_cifar_512_6_k5", 512, 6, 5)):
        m = timm.create_model(name, num_classes=100)
        convs = spatial_convs(m)
        assert len(convs) == depth and convs[0][1].weight.shape == (dim, 1, k, k) and m.head.out_features == 100
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("convmixer_cifar_256_8_k3", pretrained=True)


@pytest.mark.parametrize("k", [3, 5])
def test_impulse_filters_one_hot_with_scale(k):
    model = make(kernel_size=k, dim=64)
    report = ii.initialize(model, "impulse", generator=3)
    scale = math.sqrt(1.0 / k)
    assert report.family == "convmixer" and report.options["scale"] == pytest.approx(scale)
    pad = (k - 1) // 2
    for (_, conv, _, _), offsets in zip(spatial_convs(model), report.offsets):
        w = conv.weight.detach().view(64, k * k)
        assert torch.equal((w != 0).sum(1), torch.ones(64, dtype=torch.long))
        assert torch.allclose(w.sum(1), torch.full((64,), scale))
        pos = w.argmax(1)
        assert [(int(p) // k - pad, int(p) % k - pad) for p in pos] == offsets
        assert pos.unique().numel() >= min(k * k, 5)  # random position per channel, not one shared tap
        b = conv.bias.detach()
        assert b.abs().max() <= 1.0 / k and b.std() > 0.1 / k
    summary = convmixer_filter_summary(convmixer_filter_taps(model))
    assert all(s["one_hot"] == 1.0 and s["entropy"] == 0.0 for s in summary)


def test_impulse_offsets_shift_the_input():
    """The reported offset (dy, dx) means: output at (y, x) reads the input at (y + dy, x + dx)."""
    model = make(kernel_size=5, dim=16, depth=1)
    report = ii.initialize(model, "impulse", generator=1)
    conv = spatial_convs(model)[0][1]
    x = torch.randn(1, 16, 12, 12)
    with torch.no_grad():
        y = conv(x) - conv.bias.view(1, -1, 1, 1)
    scale = math.sqrt(1 / 5)
    for ch, (dy, dx) in enumerate(report.offsets[0]):
        assert torch.allclose(y[0, ch, 2:10, 2:10], scale * x[0, ch, 2 + dy:10 + dy, 2 + dx:10 + dx], atol=1e-6)


def test_box_filters_equal():
    model = make(kernel_size=3)
    report = ii.initialize(model, "box", generator=0)
    scale = math.sqrt(1.0 / 27)
    assert report.options == {"base": "torch", "trainable": None, "taps": 9, "scale": pytest.approx(scale)}
    for _, conv, _, _ in spatial_convs(model):
        assert torch.allclose(conv.weight, torch.full_like(conv.weight, scale))
    summary = convmixer_filter_summary(convmixer_filter_taps(model))
    assert all(s["distinct"] == 1.0 and s["one_hot"] == 0.0 for s in summary)
    ii.initialize(model, "box", taps=3)
    w = spatial_convs(model)[0][1].weight.detach().view(32, 9)
    assert torch.equal((w != 0).sum(1), torch.full((32,), 3))
    assert torch.allclose(w[w != 0], torch.full((96,), 1 / 3))
    with pytest.raises(ValueError, match=r"taps must be in \[1, 9\]"):
        ii.initialize(model, "box", taps=10)


def test_random_filters_uniform_and_deterministic():
    a, b = make(dim=128), make(dim=128)
    ii.initialize(a, "random", generator=7)
    ii.initialize(b, "random", generator=7)
    wa, wb = (spatial_convs(m)[0][1].weight.detach() for m in (a, b))
    assert torch.equal(wa, wb)
    assert wa.abs().max() <= 1 / 3 and wa.std() == pytest.approx((1 / 3) / math.sqrt(3), rel=0.1)
    ii.initialize(b, "random", generator=8)
    assert not torch.equal(wa, spatial_convs(b)[0][1].weight)


def _optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)


def _train_step(model, opt):
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


@pytest.mark.parametrize("method", ["impulse", "box", "random"])
def test_frozen_filters_do_not_change_trainable_ones_do(method):
    model = make().train()
    opt = _optimizer(model)  # built before the initializer runs, as in Lightning's on_fit_start order
    report = ii.initialize(model, method, generator=0, trainable=False)
    assert report.notes[-1].endswith("spatial filters frozen")
    convs = spatial_convs(model)
    frozen = [(c.weight.detach().clone(), c.bias.detach().clone()) for _, c, _, _ in convs]
    other = model.blocks[0][1].weight.detach().clone()  # 1x1 channel-mixing conv
    _train_step(model, opt)
    for (_, c, _, _), (w, b) in zip(convs, frozen):
        assert torch.equal(c.weight, w) and torch.equal(c.bias, b)
    assert not torch.equal(model.blocks[0][1].weight, other)

    ii.initialize(model, method, generator=0, trainable=True)
    before = [c.weight.detach().clone() for _, c, _, _ in convs]
    _train_step(model, opt)
    assert all(not torch.equal(c.weight, w) for (_, c, _, _), w in zip(convs, before))


def test_model_built_frozen_stays_frozen_by_default():
    model = make(spatial_trainable=False)
    report = ii.initialize(model, "impulse")
    assert report.options["trainable"] is None and report.notes[-1].endswith("frozen")
    assert all(not p.requires_grad for _, c, _, _ in spatial_convs(model) for p in c.parameters())
    assert all(p.requires_grad for n, p in model.named_parameters() if ".fn.0." not in n)


def test_errors_and_finiteness():
    model = make()
    with pytest.raises(TypeError, match="unknown option"):
        ii.initialize(model, "impulse", taps=3)
    with pytest.raises(TypeError, match=r"option 'trainable' of init method '\w+' \(convmixer\) must be bool \| None"):
        ii.initialize(model, "random", trainable="no")
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1)
    for method in ("box", "random"):
        with pytest.raises(ValueError, match=f"init method '{method}' cannot be applied to VisionTransformer"):
            ii.initialize(vit, method)
    for method in ("impulse", "box", "random"):
        ii.initialize(model, method, generator=2)
        assert all(torch.isfinite(p).all() for p in model.parameters())


def test_applicability_table_matches_registry():
    """Every cell of the table in impulsevit/init/FAMILIES.md: ✓ works, ✗ `msg` raises ValueError containing msg."""
    import pathlib
    import re

    from timm.models.mlp_mixer import MlpMixer
    from timm.models.swin_transformer import SwinTransformer

    builders = [
        lambda: timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=1),
        lambda: SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(2,), num_heads=(3,)),
        lambda: MlpMixer(img_size=32, patch_size=4, embed_dim=64, num_blocks=1, mlp_ratio=(4.0, 2.0)),
        lambda: make(dim=16, depth=1),
    ]
    text = (pathlib.Path(ii.__file__).parent / "FAMILIES.md").read_text()
    section = text.split("## Applicability", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"^\| `\w+` \|", line)]
    checked = set()
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        method = cells[0].strip("`")
        assert len(cells) == 5, line
        for build, cell in zip(builders, cells[1:]):
            model = build()
            if cell == "✓":
                ii.initialize(model, method, generator=0)
                assert all(torch.isfinite(p).all() for p in model.parameters())
            else:
                msg = re.fullmatch(r"✗ `(.+)`", cell).group(1)
                with pytest.raises(ValueError, match=re.escape(msg)):
                    ii.initialize(model, method, generator=0)
        checked.add(method)
    assert checked == {"impulse", "mimetic", "box", "random", "torch", "timm"}
