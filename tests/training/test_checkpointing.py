"""``load_weights`` (impulsevit.training.checkpointing), the one way weights enter a model: a state dict that does not
fit is one line naming where it came from and the first tensors that differ, whatever the kind of difference; the
resume pre-check (``shapes_mismatch``) says it in the same words."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

from impulsevit.errors import ConfigError, state_dict_mismatch
from impulsevit.training.checkpointing import load_weights, shapes_mismatch


def _vit() -> nn.Module:
    return timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2,
                             num_classes=3)


def test_weights_that_fit_load_and_are_the_model_s():
    src, dst = _vit(), _vit()
    assert load_weights(dst, src.state_dict(), source="test") == ([], [])
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values(), strict=True))


def test_renamed_keys_name_the_source_and_the_first_missing_and_unexpected_tensors():
    state = {k.replace("blocks.1.attn.", "blocks.1.attention."): v for k, v in _vit().state_dict().items()}
    with pytest.raises(ConfigError) as info:
        load_weights(_vit(), state, source="checkpoint runs/a/last.ckpt")
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith("checkpoint runs/a/last.ckpt: the weights do not fit the model VisionTransformer: ")
    assert ("4 tensor(s) missing from the weights (first: blocks.1.attn.qkv.weight, blocks.1.attn.qkv.bias, "
            "blocks.1.attn.proj.weight, ...); 4 tensor(s) unexpected (first: blocks.1.attention.qkv.weight") in line
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_shape_mismatch_is_named_also_when_not_strict():
    state = _vit().state_dict()
    state["head.weight"] = torch.zeros(5, 16)
    state["extra"] = torch.zeros(1)
    with pytest.raises(ConfigError, match=r"^w: the weights do not fit the model VisionTransformer: 1 tensor\(s\) "
                                          r"differ in shape \(first: head.weight: \[5, 16\] in the weights, \[3, 16\] "
                                          r"in the model\); 1 tensor\(s\) unexpected \(first: extra\)"):
        load_weights(_vit(), state, source="w")
    del state["head.weight"]
    assert load_weights(_vit(), state, source="w", strict=False) == (["head.weight"], ["extra"])
    state["head.weight"] = torch.zeros(5, 16)
    with pytest.raises(ConfigError, match=r"differ in shape \(first: head.weight"):
        load_weights(_vit(), state, source="w", strict=False)


def test_other_errors_pass_unchanged():
    class Broken(nn.Linear):
        def load_state_dict(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        load_weights(Broken(2, 2), {}, source="w")
    assert state_dict_mismatch(RuntimeError("disk on fire")) is None


def test_image_classifier_resume_path_names_the_first_tensors():
    """``ImageClassifier.load_state_dict`` (what Lightning's restore and ``load_from_checkpoint`` call)."""
    from impulsevit.training.module import ImageClassifier

    module = ImageClassifier(backbone="vit_tiny_patch16_224", num_classes=3, img_size=16,
                             backbone_kwargs={"patch_size": 8, "embed_dim": 16, "depth": 1, "num_heads": 2})
    state = {k.replace("backbone.norm.", "backbone.final_norm."): v for k, v in module.state_dict().items()}
    with pytest.raises(ConfigError, match=r"^the checkpoint: the weights do not fit the model ImageClassifier: 2 "
                                          r"tensor\(s\) missing from the weights \(first: backbone.norm.weight, "
                                          r"backbone.norm.bias\); 2 tensor\(s\) unexpected"):
        module.load_state_dict(state)


def test_shapes_mismatch_orders_and_words_like_load_weights():
    model = {"a": (2,), "b": (3, 4), "c": (1,)}
    assert shapes_mismatch(model, dict(model)) is None
    assert shapes_mismatch(model, {"z": (1,), "b": (4, 3), "y": (2,)}) == (
        "1 tensor(s) differ in shape (first: b: [4, 3] in the weights, [3, 4] in the model); 2 tensor(s) missing "
        "from the weights (first: a, c); 2 tensor(s) unexpected (first: z, y)")
