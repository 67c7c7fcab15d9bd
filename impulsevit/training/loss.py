"""The training objective: timm ``Mixup`` / CutMix on the batch and the loss on hard or soft targets.

With mixup on, the targets become soft (label smoothing folded in) and the loss is timm's ``SoftTargetCrossEntropy``;
otherwise cross-entropy with ``label_smoothing`` (training only). 2-D (soft) targets from the datamodule are accepted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy

from impulsevit.training.config import MixupConfig

__all__ = ["classification_loss", "make_mixup", "soft_cross_entropy"]

soft_cross_entropy = SoftTargetCrossEntropy()
"""timm's cross-entropy against soft targets ``(B, num_classes)`` (stateless)."""


def make_mixup(cfg: MixupConfig | None, label_smoothing: float, num_classes: int) -> Mixup | None:
    """timm ``Mixup`` for ``cfg`` (``None`` when ``cfg`` is None or turns both mixup and CutMix off)."""
    if cfg is None or not (cfg.mixup_alpha > 0 or cfg.cutmix_alpha > 0) or cfg.prob <= 0:
        return None
    return Mixup(mixup_alpha=cfg.mixup_alpha, cutmix_alpha=cfg.cutmix_alpha, prob=cfg.prob,
                 switch_prob=cfg.switch_prob, mode=cfg.mode, label_smoothing=label_smoothing,
                 num_classes=num_classes)


def classification_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean loss of ``logits`` ``(B, C)`` against class indices ``(B,)`` (cross-entropy with ``label_smoothing``) or
    soft targets ``(B, C)`` (soft-target cross-entropy; smoothing is already in the targets)."""
    if targets.ndim == 2:
        return soft_cross_entropy(logits, targets)
    return F.cross_entropy(logits, targets, label_smoothing=label_smoothing)
