"""The timm backbone of a run: its ``timm.create_model`` keyword arguments and the input-size check.

The input size has one source: the data's ``image_size`` (the CLI links it to ``ImageClassifier(img_size=...)``). It is
passed to timm as ``img_size`` when the architecture is built for a fixed input size (timm's own
``pretrained_cfg.fixed_input_size``: ViT / DeiT, Swin, MLP-Mixer, ...); a backbone that takes any size (ResNet,
ConvMixer) is built without it. ``backbone_kwargs.img_size`` is still accepted when it equals the data's size (older
recipes and checkpoints); a different value is a :class:`~impulsevit.errors.ConfigError` naming both keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import timm
from timm.layers import PatchEmbed
from torch import nn

from impulsevit.errors import ConfigError

__all__ = ["TRAINING_ONLY_KWARGS", "check_image_size", "create_backbone", "takes_img_size", "timm_kwargs"]

TRAINING_ONLY_KWARGS = ("drop_rate", "drop_path_rate", "attn_drop_rate", "proj_drop_rate", "pos_drop_rate",
                        "patch_drop_rate", "weight_init")
"""Backbone keyword arguments that change only training (regularisation) or how the weights start, not what trained
weights compute: a resume may change them, and a pretrained source's are not compared."""


def takes_img_size(backbone: str) -> bool:
    """Whether timm builds ``backbone`` for a fixed input size (``pretrained_cfg.fixed_input_size``), i.e. takes
    ``img_size``. Unknown names: False (``timm.create_model`` names the problem)."""
    try:
        cfg = timm.models.get_pretrained_cfg(backbone)
    except (RuntimeError, ValueError):
        return False
    return bool(cfg is not None and cfg.fixed_input_size)


def timm_kwargs(backbone: str, backbone_kwargs: Mapping[str, Any] | None, num_classes: int | None = None,
                img_size: int | None = None) -> dict[str, Any]:
    """The ``timm.create_model(backbone, **kwargs)`` keyword arguments: ``backbone_kwargs``, ``num_classes`` when given
    and ``img_size`` (pixels, square) when given and ``backbone`` takes it (:func:`takes_img_size`).

    Raises:
        ConfigError: ``backbone_kwargs`` sets another ``img_size`` than ``img_size`` (names both keys).
    """
    kwargs = dict(backbone_kwargs or {})
    if img_size is not None:
        given = kwargs.get("img_size")
        if given is not None and given != img_size:
            raise ConfigError(f"model.backbone_kwargs.img_size: {given} differs from data.image_size: {img_size} "
                              "(the model's input size, linked to model.img_size); remove "
                              "model.backbone_kwargs.img_size, the data's image_size sets it")
        if takes_img_size(backbone):
            kwargs["img_size"] = int(img_size)
    if num_classes is not None:
        kwargs["num_classes"] = int(num_classes)
    return kwargs


def create_backbone(backbone: str, kwargs: Mapping[str, Any]) -> nn.Module:
    """``timm.create_model(backbone, **kwargs)`` on the current default device.

    Raises:
        ValueError: unknown model name or kwargs the model rejects (names the model and the kwargs).
    """
    try:
        return timm.create_model(backbone, **kwargs)
    except (RuntimeError, TypeError, ValueError, AssertionError) as e:
        raise ValueError(f"cannot build timm model {backbone!r} (model.backbone) with kwargs {dict(kwargs)}: "
                         f"{e}") from e


def _patch_embedding(model: nn.Module) -> nn.Module | None:
    """The model's patch embedding: its ``patch_embed`` (ViT, Swin, EVA, ...) or else its first timm ``PatchEmbed``
    (MLP-Mixer's ``stem``); None when it has none with a ``patch_size``."""
    pe = getattr(model, "patch_embed", None)
    if pe is None:
        pe = next((m for m in model.modules() if isinstance(m, PatchEmbed)), None)
    return pe if pe is not None and hasattr(pe, "patch_size") else None


def check_image_size(model: nn.Module, backbone: str, image_size: int | None) -> None:
    """Fail early when the data's image size does not fit a patch-based backbone.

    Raises:
        ValueError: ``image_size`` is not divisible by the backbone's patch size, or the backbone was built for a
            fixed ``img_size`` different from ``image_size`` (the message names the model, both sizes and the fix).
    """
    pe = _patch_embedding(model)
    if image_size is None or pe is None:
        return
    patch = tuple(pe.patch_size) if isinstance(pe.patch_size, tuple | list) else (pe.patch_size, pe.patch_size)
    if any(image_size % p for p in patch):
        raise ValueError(
            f"image size {image_size} (data.image_size) is not divisible by the patch size {patch[0]} of backbone "
            f"{backbone!r}; choose an image size that is a multiple of {patch[0]} or another patch_size"
        )
    built = getattr(pe, "img_size", None)
    if built is not None and getattr(pe, "strict_img_size", True) and not getattr(pe, "dynamic_img_pad", False):
        built = tuple(built) if isinstance(built, tuple | list) else (built, built)
        if built != (image_size, image_size):
            raise ValueError(
                f"backbone {backbone!r} was built for img_size {built[0]} but the data has image_size {image_size}; "
                f"set model.img_size: {image_size}"
            )
