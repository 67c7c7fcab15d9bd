"""Typed configuration blocks of a training recipe (``model.init``, ``model.optimizer``, ...).

Plain dataclasses, so LightningCLI / jsonargparse validates a recipe key by key: a misspelled key or a value of the
wrong type is an error naming the key. Each block checks its ranges in ``__post_init__`` (declared once, here) and
raises a one-line ``ValueError`` naming the key and what it expects (``model.optimizer.lr must be > 0, got -1.0``;
this module imports nothing of impulsevit, so the CLI raises it as a :class:`~impulsevit.errors.ConfigError`), before
any work. They are the shared contract between
``ImageClassifier`` and the CLI.

Example recipe fragment::

    model:
      init: {method: impulse, seed: 0, options: {gain_p: 18.0}}
      optimizer: {name: adamw, base_lr: 5.0e-4, base_batch_size: 512, lr_scaling: linear, weight_decay: 0.05}
      scheduler: {name: cosine, warmup_epochs: 5, warmup_lr: 1.0e-6, min_lr: 1.0e-5}
      mixup: {mixup_alpha: 0.8, cutmix_alpha: 1.0}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from impulsevit.blocks import as_config  # re-exported: the model's blocks and the data's share it

__all__ = ["InitConfig", "OptimizerConfig", "SchedulerConfig", "MixupConfig", "resolve_lr", "as_config"]


@dataclass
class InitConfig:
    """Which initializer runs at the start of fitting (see ``impulsevit.init.methods()``).

    Attributes:
        method: registered method name: ``impulse``, ``mimetic``, ``timm``, ``torch``, ``weight_selection``, ... or
            one a plugin module registers (``impulsevit --plugins MODULE``; ``impulsevit init list`` shows them all;
            an import path ``module:function`` is deprecated, removed in 0.3.0).
        seed: seed of the one ``torch.Generator`` every rank uses (independent of the data / dropout seed).
        options: method options, passed as keyword arguments; unknown ones are rejected by the method.
    """

    method: str = "impulse"
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimizerConfig:
    """Optimizer, built with timm's optimizer factory (``timm.optim.create_optimizer_v2``).

    Weight decay is never applied to biases, norm weights (any parameter with ndim <= 1) nor to the names the backbone
    lists in ``no_weight_decay()`` (ViT: ``pos_embed``, ``cls_token``, ...).

    Attributes:
        name: timm optimizer name (``adamw``, ``lamb``, ``sgd``, ...).
        lr: peak learning rate; when given, ``base_lr``/``base_batch_size``/``lr_scaling`` are ignored.
        base_lr: peak lr at ``base_batch_size``; the run's lr is ``base_lr * s`` with ``s = global_batch /
            base_batch_size`` (``linear``), ``sqrt(s)`` (``sqrt``) or ``1`` (``none``).
        base_batch_size: the global batch ``base_lr`` refers to (DeiT: 512).
        lr_scaling: how the lr follows the global batch.
        weight_decay: decoupled weight decay (AdamW) on the decayed group.
        eps / betas: Adam-family constants (ignored by optimizers that have none).
        layer_decay: if set, lr of block ``i`` is scaled by ``layer_decay ** (num_layers - i)`` (timm's grouping).
    """

    name: str = "adamw"
    lr: float | None = None
    base_lr: float = 5e-4
    base_batch_size: int = 512
    lr_scaling: Literal["linear", "sqrt", "none"] = "linear"
    weight_decay: float = 0.05
    eps: float = 1e-8
    betas: tuple[float, float] = (0.9, 0.999)
    layer_decay: float | None = None

    def __post_init__(self) -> None:
        _check_optimizer_name(self.name)
        if self.lr is not None:
            _positive(self.lr, "model.optimizer.lr")
        _positive(self.base_lr, "model.optimizer.base_lr")
        if int(self.base_batch_size) < 1:
            raise ValueError(f"model.optimizer.base_batch_size must be >= 1, got {self.base_batch_size}")
        if self.lr_scaling not in ("linear", "sqrt", "none"):
            raise ValueError(f"model.optimizer.lr_scaling must be 'linear', 'sqrt' or 'none', got {self.lr_scaling!r}")
        _at_least_zero(self.weight_decay, "model.optimizer.weight_decay")
        _positive(self.eps, "model.optimizer.eps")
        if len(tuple(self.betas)) != 2 or not all(0 <= float(b) < 1 for b in self.betas):
            raise ValueError(f"model.optimizer.betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ValueError(f"model.optimizer.layer_decay must be in (0, 1] or null, got {self.layer_decay}")


@dataclass
class SchedulerConfig:
    """Learning-rate schedule, stepped once per optimizer step (not per epoch).

    ``cosine``: linear warmup from ``warmup_lr`` to the peak lr over ``warmup_epochs``, then cosine decay reaching
    ``min_lr`` at the last optimizer step of the run (timm ``CosineLRScheduler``, ``t_in_epochs=False``; no cooldown
    epochs). ``constant``: the same warmup, then the peak lr. Fractional ``warmup_epochs`` are allowed.

    The schedule's length is the run's plan: ``epochs`` when given (the cosine then ends there whatever
    ``trainer.max_epochs`` says, e.g. when a job stops early), otherwise the trainer's ``max_epochs`` / ``max_steps``
    (Lightning's ``estimated_stepping_batches``). The plan is stored in checkpoints; a resume under another plan says
    so and rebuilds the schedule for the new plan from the current step (``ImageClassifier``).
    """

    name: Literal["cosine", "constant"] = "cosine"
    warmup_epochs: float = 5
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    epochs: float | None = None

    def __post_init__(self) -> None:
        if self.name not in ("cosine", "constant"):
            raise ValueError(f"model.scheduler.name must be 'cosine' or 'constant', got {self.name!r}")
        _at_least_zero(self.warmup_epochs, "model.scheduler.warmup_epochs")
        _at_least_zero(self.warmup_lr, "model.scheduler.warmup_lr")
        _at_least_zero(self.min_lr, "model.scheduler.min_lr")
        if self.epochs is not None:
            _positive(self.epochs, "model.scheduler.epochs")


@dataclass
class MixupConfig:
    """Mixup / CutMix on training batches (timm ``Mixup``); targets become soft, label smoothing is folded in.

    ``mode``: ``batch`` (one lambda per batch), ``pair`` or ``elem`` (timm's modes). Set both alphas to 0 to disable.
    """

    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"

    def __post_init__(self) -> None:
        _at_least_zero(self.mixup_alpha, "model.mixup.mixup_alpha")
        _at_least_zero(self.cutmix_alpha, "model.mixup.cutmix_alpha")
        for key in ("prob", "switch_prob"):
            if not 0 <= getattr(self, key) <= 1:
                raise ValueError(f"model.mixup.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.mode not in ("batch", "pair", "elem"):
            raise ValueError(f"model.mixup.mode must be 'batch', 'pair' or 'elem', got {self.mode!r}")


def _positive(value: float, key: str) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{key} must be > 0, got {value}")


def _at_least_zero(value: float, key: str) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{key} must be >= 0, got {value}")


def _check_optimizer_name(name: str) -> None:
    """``name`` is an optimizer timm's factory knows (``timm.optim.list_optimizers``); else one line with the closest
    names."""
    import difflib

    from timm.optim import get_optimizer_info, list_optimizers

    try:
        get_optimizer_info(str(name))
    except ValueError:
        known = list_optimizers()
        close = difflib.get_close_matches(str(name).lower(), known, n=3)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise ValueError(f"model.optimizer.name {name!r} is not a timm optimizer; {hint}(valid: "
                          f"timm.optim.list_optimizers(), e.g. adamw, sgd, lamb, lion)") from None


def resolve_lr(cfg: OptimizerConfig, global_batch: int | None) -> float:
    """The peak learning rate of a run: ``cfg.lr`` if set, else ``base_lr`` scaled by the global batch.

    Raises:
        ValueError: ``cfg.lr`` is unset and ``global_batch`` is unknown or not positive.
    """
    if cfg.lr is not None:
        return float(cfg.lr)
    if global_batch is None or global_batch <= 0:
        raise ValueError(
            f"model.optimizer.lr is not set and the global batch size is unknown ({global_batch!r}); either set "
            "model.optimizer.lr or use a datamodule with a `batch_size` so base_lr can be scaled"
        )
    ratio = global_batch / cfg.base_batch_size
    scale = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[cfg.lr_scaling]
    return float(cfg.base_lr * scale)
