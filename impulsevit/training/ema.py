"""The EMA copy of a backbone: timm ``ModelEmaV3``.

It is re-synchronised with the backbone right after the initializer ran (``ImageClassifier.on_initialized``), updated
after every optimizer step, saved in the checkpoint (``ema.module.*`` keys) and evaluated next to the raw model
(``val_ema/*``, ``test_ema/*``). Not supported with the ``fsdp2`` strategy (the copy would not be sharded).
"""

from __future__ import annotations

from timm.utils import ModelEmaV3
from torch import nn

__all__ = ["make_ema"]


def make_ema(backbone: nn.Module, decay: float | None, warmup: bool = False) -> ModelEmaV3 | None:
    """A frozen ``ModelEmaV3`` of ``backbone`` with ``decay`` per optimizer step (timm's warmup ramp when ``warmup``);
    ``None`` when ``decay`` is None.

    Raises:
        ValueError: ``decay`` is not in (0, 1) (names ``model.ema_decay``).
    """
    if decay is None:
        return None
    if not 0.0 < decay < 1.0:
        raise ValueError(f"model.ema_decay must be in (0, 1) or null, got {decay}")
    ema = ModelEmaV3(backbone, decay=decay, use_warmup=warmup)
    ema.requires_grad_(False)
    ema.train()  # never run in training; Lightning sets eval for validation. Avoids its eval-mode warning.
    return ema
