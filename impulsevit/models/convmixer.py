"""ConvMixer variants for CIFAR-size inputs, registered with timm's model registry.

The architecture is timm's own ``timm.models.convmixer.ConvMixer`` (it already takes ``dim``, ``depth``,
``kernel_size``, ``patch_size``; GELU, BatchNorm, depthwise ``padding="same"`` spatial conv inside a residual, then a
1×1 channel-mixing conv); only the configurations of the impulse papers (docs/method.md §4.4, §6.0) are added:

=============================  ====  =====  ======  =====
name                           dim   depth  kernel  patch
=============================  ====  =====  ======  =====
``convmixer_cifar_256_8_k3``   256   8      3       2
``convmixer_cifar_512_6_k3``   512   6      3       2
``convmixer_cifar_512_6_k5``   512   6      5       2
``convmixer_cifar``            any (kwargs; defaults 256 / 8 / 3 / 2)
=============================  ====  =====  ======  =====

``timm.create_model("convmixer_cifar_256_8_k3", num_classes=10)`` works after ``import impulsevit.models``. Default
config: 32×32 input, 10 classes, CIFAR-10 mean/std, crop_pct 1.0, no pretrained weights.

Extra kwarg ``spatial_trainable`` (default True): ``False`` builds the model with the depthwise spatial filters
(weight and bias) frozen (``requires_grad=False``). Freezing is also an option of the ConvMixer initializers
(``impulsevit.init.convmixer``); putting it in the model kwargs as well keeps it across a resume, where the
initializer does not run again. Weights: none in the registry (``pretrained=True`` alone is an error); a folder written
by ``impulsevit export`` loads with ``timm.create_model("local-dir:FOLDER", pretrained=True)`` (or ``hf-hub:ORG/NAME``).
Not supported: non-square kernels.
"""

from __future__ import annotations

from typing import Any

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.convmixer import ConvMixer
from torch import nn

__all__ = ["ConvMixer", "depthwise_convs", "set_spatial_trainable"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def depthwise_convs(model: nn.Module) -> list[tuple[str, nn.Conv2d]]:
    """``(name, conv)`` for every depthwise spatial conv (``groups == in == out channels``, kernel > 1), in order."""
    return [
        (n, m) for n, m in model.named_modules()
        if isinstance(m, nn.Conv2d) and m.groups == m.in_channels == m.out_channels and m.groups > 1
        and max(m.kernel_size) > 1
    ]


def set_spatial_trainable(model: nn.Module, trainable: bool) -> int:
    """Set ``requires_grad`` of every depthwise spatial conv's weight and bias; returns how many convs were set.

    A parameter with ``requires_grad=False`` gets no gradient, and torch optimizers (AdamW included, weight decay too)
    skip parameters whose ``grad`` is None, so freezing works even after the optimizer was built.
    """
    convs = depthwise_convs(model)
    for _, conv in convs:
        for p in (conv.weight, conv.bias):
            if p is not None:
                p.requires_grad_(trainable)
    return len(convs)


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return {
        "url": "", "num_classes": 10, "input_size": (3, 32, 32), "pool_size": None, "crop_pct": 1.0,
        "interpolation": "bicubic", "mean": CIFAR10_MEAN, "std": CIFAR10_STD, "classifier": "head",
        "first_conv": "stem.0", **kwargs,
    }


default_cfgs = generate_default_cfgs({
    "convmixer_cifar.untrained": _cfg(),
    "convmixer_cifar_256_8_k3.untrained": _cfg(),
    "convmixer_cifar_512_6_k3.untrained": _cfg(),
    "convmixer_cifar_512_6_k5.untrained": _cfg(),
})


_WEIGHT_SOURCES = ("file", "url", "hf_hub_id", "state_dict")


def _create(variant: str, pretrained: bool, spatial_trainable: bool = True, **kwargs: Any) -> ConvMixer:
    if pretrained:
        # weights come only from a source the caller names: timm's `local-dir:` / `hf-hub:` (an `impulsevit export`
        # folder) or a pretrained_cfg overlay with a file; the registry itself has none (timm would warn and go on
        # with random weights)
        cfgs = [c for c in (kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay")) if c]
        cfgs = [c if isinstance(c, dict) else getattr(c, "__dict__", {}) for c in cfgs]
        if not any(c.get(k) for c in cfgs for k in _WEIGHT_SOURCES):
            raise ValueError(f"{variant}: no pretrained weights exist for the CIFAR ConvMixer variants; load an "
                             f"exported model with timm.create_model('local-dir:FOLDER', pretrained=True)")
    kwargs.setdefault("num_classes", 10)
    model = build_model_with_cfg(ConvMixer, variant, pretrained, **kwargs)
    if not spatial_trainable:
        set_spatial_trainable(model, False)
    return model


@register_model
def convmixer_cifar(pretrained: bool = False, **kwargs: Any) -> ConvMixer:
    """ConvMixer with any ``dim`` / ``depth`` / ``kernel_size`` / ``patch_size`` (defaults 256 / 8 / 3 / 2)."""
    args = {"dim": 256, "depth": 8, "kernel_size": 3, "patch_size": 2, **kwargs}
    return _create("convmixer_cifar", pretrained, **args)


@register_model
def convmixer_cifar_256_8_k3(pretrained: bool = False, **kwargs: Any) -> ConvMixer:
    """ConvMixer-256/8, kernel 3, patch 2 (the impulse paper's ConvMixer-256 ablations on CIFAR-10)."""
    return _create("convmixer_cifar_256_8_k3", pretrained, **{"dim": 256, "depth": 8, "kernel_size": 3,
                                                               "patch_size": 2, **kwargs})


@register_model
def convmixer_cifar_512_6_k3(pretrained: bool = False, **kwargs: Any) -> ConvMixer:
    """ConvMixer-512/6, kernel 3, patch 2."""
    return _create("convmixer_cifar_512_6_k3", pretrained, **{"dim": 512, "depth": 6, "kernel_size": 3,
                                                               "patch_size": 2, **kwargs})


@register_model
def convmixer_cifar_512_6_k5(pretrained: bool = False, **kwargs: Any) -> ConvMixer:
    """ConvMixer-512/6, kernel 5, patch 2."""
    return _create("convmixer_cifar_512_6_k5", pretrained, **{"dim": 512, "depth": 6, "kernel_size": 5,
                                                               "patch_size": 2, **kwargs})
