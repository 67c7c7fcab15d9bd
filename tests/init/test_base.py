"""The one ``base`` option (``impulsevit.init.baselines.base_values``) in every family: with ``base='torch'`` a
structured init and the ``torch`` method agree bit for bit, for the same seed, on every tensor the structure does not
set (the paired comparison differs only in the structure); ``base='keep'`` leaves those tensors as the model was
built; the init report names the base in one line."""

import pytest
import timm
import torch

import impulsevit.init as ii
import impulsevit.models  # noqa: F401  (registers mixer_any / convmixer_cifar with timm)


def _vit():
    return timm.create_model("vit_tiny_patch16_224", img_size=28, patch_size=4, embed_dim=48, depth=2, num_heads=3,
                             num_classes=10)


def _rope():
    return timm.create_model("vit_base_patch16_rope_reg1_gap_256", img_size=28, patch_size=4, embed_dim=48, depth=2,
                             num_heads=3, num_classes=10)


def _beit():
    return timm.create_model("beit_base_patch16_224", img_size=28, patch_size=4, embed_dim=48, depth=2, num_heads=3,
                             num_classes=10)


def _swin():
    return timm.create_model("swin_tiny_patch4_window7_224", img_size=28, patch_size=2, window_size=7, embed_dim=24,
                             depths=(2, 2), num_heads=(3, 6), num_classes=10)


def _swinv2():
    return timm.create_model("swinv2_tiny_window8_256", img_size=32, patch_size=4, window_size=4, embed_dim=24,
                             depths=(2,), num_heads=(3,), num_classes=10)


def _mixer():
    return timm.create_model("mixer_any", img_size=28, patch_size=4, embed_dim=128, num_blocks=2, num_classes=10)


def _convmixer():
    return timm.create_model("convmixer_cifar", dim=16, depth=2, kernel_size=3)


# (builder, method, options, what the structure writes: a tensor name matches if it contains one of these)
FAMILIES = {
    "vit": (_vit, "impulse", {}, ("attn.qkv.weight", "attn.proj.weight", "pos_embed")),
    "vit-mimetic": (_vit, "mimetic", {}, ("attn.qkv.weight", "attn.proj.weight")),
    "vit-propagated": (_vit, "impulse", {"pseudo_input": "propagated"},
                       ("attn.qkv.weight", "attn.proj.weight", "pos_embed")),
    "rope": (_rope, "impulse", {}, ("attn.qkv.", "attn.q_proj.", "attn.k_proj.", "attn.v_proj.", "attn.q_bias",
                                    "attn.k_bias", "norm1.bias")),
    "relbias": (_beit, "impulse", {}, ("relative_position_bias_table",)),
    "swin": (_swin, "impulse", {}, ("relative_position_bias_table",)),
    "swin-mimetic": (_swin, "mimetic", {}, ("attn.qkv.weight", "attn.proj.weight")),
    "swinv2": (_swinv2, "impulse", {}, ("cpb_mlp.", "logit_scale")),
    "mixer": (_mixer, "impulse", {"layout": "one_tap"}, ("mlp_tokens.fc1.", "mlp_tokens.fc2.")),
    "mixer-factored": (_mixer, "impulse", {"layout": "factored"}, ("mlp_tokens.fc1.", "mlp_tokens.fc2.")),
    "convmixer": (_convmixer, "impulse", {}, (".0.fn.0.",)),
}


def _tensors(model):
    out = {n: p.detach().clone() for n, p in model.named_parameters()}
    out.update({n: b.detach().clone() for n, b in model.named_buffers()})
    return out


def _build(builder):
    torch.manual_seed(123)  # the model as built: the same for every call
    return builder()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_torch_base_agrees_with_the_torch_method_outside_the_structure(family):
    builder, method, options, structured = FAMILIES[family]
    reference = _build(builder)
    ii.initialize(reference, "torch", generator=7)
    model = _build(builder)
    report = ii.initialize(model, method, generator=7, **options)
    assert report.options["base"] == "torch"
    assert sum(note.startswith("base: torch") for note in report.notes) == 1
    ref, got = _tensors(reference), _tensors(model)
    differ = sorted(n for n in ref if not torch.equal(ref[n], got[n]))
    assert differ, "the structure changed nothing"
    outside = [n for n in differ if not any(s in n for s in structured)]
    assert outside == [], f"{family}: tensors outside the structure differ from the torch method: {outside[:5]}"
    untouched = [n for n in ref if not any(s in n for s in structured)]
    assert len(untouched) > 5  # the check is not vacuous


@pytest.mark.parametrize("family", ["vit", "vit-propagated", "rope", "swin", "mixer", "convmixer"])
def test_keep_base_leaves_the_model_init_outside_the_structure(family):
    builder, method, options, structured = FAMILIES[family]
    built = _tensors(_build(builder))
    model = _build(builder)
    report = ii.initialize(model, method, generator=7, base="keep", **options)
    assert report.notes[0].startswith("base: keep")
    got = _tensors(model)
    outside = [n for n in built if not any(s in n for s in structured) and not torch.equal(built[n], got[n])]
    assert outside == []


def test_a_different_seed_changes_the_torch_base():
    """Negative control: the agreement above is not an artefact of both inits ignoring the generator."""
    builder, method, options, _ = FAMILIES["swin"]
    reference = _build(builder)
    ii.initialize(reference, "torch", generator=7)
    model = _build(builder)
    ii.initialize(model, method, generator=8, **options)
    assert not torch.equal(reference.head.fc.weight, model.head.fc.weight)
