"""Optimizer, learning-rate plan and schedule of a run, and the schedule's rebuild when a resume changes the plan.

- optimizer: timm's ``create_optimizer_v2`` (AdamW by default) with weight decay filtered off biases / norms / the
  backbone's ``no_weight_decay()`` names, optional layer decay; ``fused=True`` for AdamW / Adam on CUDA. The lr is
  given directly or scaled from ``base_lr`` by the global batch (:func:`global_batch_size`:
  per-device batch x data-parallel replicas x ``accumulate_grad_batches``;
  :func:`impulsevit.training.config.resolve_lr`).
- plan (:func:`lr_plan`): the optimizer steps the cosine spans (``model.scheduler.epochs`` x steps per epoch when set,
  else ``trainer.estimated_stepping_batches``; no cooldown epochs, unlike timm's ``train.py``), the warmup steps,
  steps per epoch and epochs. The plan is stored in checkpoints; a resume whose plan differs (another
  ``max_epochs``, ``scheduler.epochs``, batch or world size) rebuilds the schedule for the new plan at the current
  step (:func:`plan_changed`, :func:`rebuild_scheduler`: a run extended from 100 to 300 epochs continues on a
  cosine over 300).
- schedule (:func:`build_scheduler`): timm ``CosineLRScheduler`` (or a warmup-then-constant ``StepLRScheduler``) with
  ``t_in_epochs=False``, stepped after every optimizer step.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from timm.optim import create_optimizer_v2, get_optimizer_info
from timm.scheduler import CosineLRScheduler, StepLRScheduler
from torch import nn

from impulsevit.training.config import OptimizerConfig, SchedulerConfig

__all__ = ["PLAN_KEYS", "build_optimizer", "build_scheduler", "describe_plan", "global_batch_size", "lr_plan",
           "plan_changed", "rebuild_scheduler"]

PLAN_KEYS = ("total_steps", "warmup_steps", "steps_per_epoch", "epochs")
"""The keys of a plan (:func:`lr_plan`), as stored in checkpoints under ``lr_plan``."""


def global_batch_size(trainer: L.Trainer, per_device: int | None) -> int | None:
    """``per_device`` (else the train dataloader's ``batch_size``) x data-parallel replicas x
    ``accumulate_grad_batches``; ``None`` if the batch is unknown."""
    if per_device is None:
        per_device = getattr(trainer.train_dataloader, "batch_size", None)
    if per_device is None:
        return None
    sampler_kwargs = getattr(trainer.strategy, "distributed_sampler_kwargs", None) or {}
    replicas = int(sampler_kwargs.get("num_replicas", trainer.world_size))
    return int(per_device) * replicas * int(trainer.accumulate_grad_batches)


def lr_plan(trainer: L.Trainer, cfg: SchedulerConfig) -> dict[str, Any]:
    """The schedule's plan for this run: ``total_steps`` (optimizer steps the cosine spans), ``warmup_steps``,
    ``steps_per_epoch`` and ``epochs`` (``cfg.epochs``, else the trainer's ``max_epochs``; None when the trainer
    counts steps). Reads the train dataloader's length (Lightning loads it on first use)."""
    estimated = max(1, int(trainer.estimated_stepping_batches))  # also loads the train dataloader
    batches = trainer.num_training_batches
    finite = math.isfinite(batches)
    steps_per_epoch = max(1, math.ceil(batches / trainer.accumulate_grad_batches)) if finite else estimated
    epochs: float | None = cfg.epochs
    if epochs is not None and finite:
        total_steps = max(1, math.ceil(epochs * steps_per_epoch))
    else:
        total_steps = estimated
        epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) and trainer.max_steps == -1 else None
    warmup = min(total_steps - 1, round(cfg.warmup_epochs * steps_per_epoch)) if cfg.warmup_epochs > 0 else 0
    return {"total_steps": total_steps, "warmup_steps": warmup, "steps_per_epoch": steps_per_epoch, "epochs": epochs}


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, plan: dict[str, Any]) -> Any:
    """The timm scheduler of ``cfg.name`` over ``plan`` (stepped per optimizer step with ``step_update``)."""
    total, warmup = plan["total_steps"], plan["warmup_steps"]
    if cfg.name == "cosine":
        return CosineLRScheduler(optimizer, t_initial=total, lr_min=cfg.min_lr, warmup_t=warmup,
                                 warmup_lr_init=cfg.warmup_lr, t_in_epochs=False)
    return StepLRScheduler(optimizer, decay_t=total + 1, decay_rate=1.0, warmup_t=warmup,
                           warmup_lr_init=cfg.warmup_lr, t_in_epochs=False)


def build_optimizer(backbone: nn.Module, cfg: OptimizerConfig, lr: float,
                    device: torch.device) -> torch.optim.Optimizer:
    """timm's optimizer ``cfg.name`` over ``backbone`` at peak ``lr`` (weight decay filtered as the module docstring
    says; ``fused=True`` for AdamW / Adam on a CUDA ``device``).

    Raises:
        ValueError: ``cfg.name`` is not a timm optimizer (names the key).
    """
    try:
        info = get_optimizer_info(cfg.name)
    except ValueError as e:
        raise ValueError(f"model.optimizer.name {cfg.name!r} is not a timm optimizer: {e}") from e
    extra: dict[str, Any] = {}
    if info.has_eps:
        extra["eps"] = cfg.eps
    if info.has_betas:
        extra["betas"] = tuple(cfg.betas)
    if device.type == "cuda" and cfg.name.lower() in ("adamw", "adam"):
        extra["fused"] = True  # torch's fused CUDA kernel (timm passes it through to torch.optim)
    return create_optimizer_v2(backbone, opt=cfg.name, lr=lr, weight_decay=cfg.weight_decay,
                               layer_decay=cfg.layer_decay, **extra)


def rebuild_scheduler(trainer: L.Trainer, cfg: SchedulerConfig, plan: dict[str, Any], step: int) -> None:
    """Replace the trainer's restored scheduler (whose state holds the old plan's length) by one for ``plan``, moved to
    optimizer step ``step``."""
    config = trainer.lr_scheduler_configs[0]
    config.scheduler = build_scheduler(trainer.optimizers[0], cfg, plan)
    config.scheduler.step_update(num_updates=step)


def plan_changed(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """Whether a checkpoint's plan ``old`` and this run's ``new`` differ in the schedule's length or warmup (False
    when either is unknown)."""
    if not old or not new:
        return False
    return any(old.get(k) != new.get(k) for k in ("total_steps", "warmup_steps"))


def describe_plan(plan: dict[str, Any]) -> str:
    """``"3 epochs x 4 steps = 12 steps, warmup 2"`` (without the epochs part when the trainer counts steps)."""
    ep = plan.get("epochs")
    span = f"{ep:g} epochs x {plan.get('steps_per_epoch')} steps = " if ep is not None else ""
    return f"{span}{plan['total_steps']} steps, warmup {plan['warmup_steps']}"
