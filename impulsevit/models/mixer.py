"""``mixer_any``: timm's ``MlpMixer`` with every size argument open (timm's ``mixer_*`` entry points fix ``patch_size``
/ ``num_blocks`` / ``embed_dim``, so a small-image Mixer cannot be built from them). Defaults: the CPU small-image
shape of the project's recipes (28 px, 4 px patches → 7×7 tokens, width 192, 6 blocks, token MLP ratio 0.5 → S = 96 ≥
49 tokens). Built for one input size (``fixed_input_size``: the token-mixing MLPs are sized by the token count), so the
data's ``image_size`` reaches it as ``img_size`` (:func:`impulsevit.training.backbone.takes_img_size`). No pretrained
weights.
"""

from __future__ import annotations

from typing import Any

from timm.models import MlpMixer, build_model_with_cfg, generate_default_cfgs, register_model

default_cfgs = generate_default_cfgs({
    "mixer_any.untrained": {"url": "", "num_classes": 10, "input_size": (3, 28, 28), "pool_size": None,
                            "crop_pct": 1.0, "interpolation": "bicubic", "mean": (0.5, 0.5, 0.5),
                            "std": (0.5, 0.5, 0.5), "first_conv": "stem.proj", "classifier": "head",
                            "fixed_input_size": True},
})


@register_model
def mixer_any(pretrained: bool = False, **kwargs: Any) -> MlpMixer:
    """MLP-Mixer with any ``img_size`` / ``patch_size`` / ``embed_dim`` / ``num_blocks`` (defaults 28 / 4 / 192 / 6)."""
    if pretrained:
        raise ValueError("mixer_any: no pretrained weights exist")
    args = {"img_size": 28, "patch_size": 4, "embed_dim": 192, "num_blocks": 6, "num_classes": 10, **kwargs}
    return build_model_with_cfg(MlpMixer, "mixer_any", pretrained, **args)
