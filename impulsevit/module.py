"""``ImageClassifier``: a LightningModule around any ``timm.create_model`` backbone, with the DeiT training essentials.

What it does (and where the machinery comes from):

- backbone: ``timm.create_model(backbone, num_classes=..., **backbone_kwargs)``, built in ``__init__`` so
  ``load_from_checkpoint`` needs no trainer; under the ``fsdp2`` strategy ``configure_model`` applies FSDP2
  ``fully_shard`` to each block and then to the backbone.
- init: the ``impulsevit.callbacks.Initializer`` is added by ``configure_callbacks`` from ``init`` (so the initializer
  is data in the recipe) and runs once at ``on_fit_start``, never on a resumed run.
- optimizer: timm's ``create_optimizer_v2`` (AdamW by default) with weight decay filtered off biases / norms / the
  backbone's ``no_weight_decay()`` names, optional layer decay; lr given directly or scaled from ``base_lr`` by the
  global batch (per-device batch x data-parallel replicas x ``accumulate_grad_batches``).
- schedule: timm ``CosineLRScheduler`` (or a warmup-then-constant ``StepLRScheduler``) with ``t_in_epochs=False``,
  stepped after every optimizer step; the cosine reaches ``min_lr`` at the end of the run's plan
  (:meth:`ImageClassifier.lr_plan`: ``model.scheduler.epochs`` x steps per epoch when set, else
  ``trainer.estimated_stepping_batches``; no cooldown epochs, unlike timm's ``train.py`` which runs
  ``epochs + cooldown``). The plan is stored in checkpoints (``lr_plan``); a resume whose plan differs (another
  ``max_epochs``, ``scheduler.epochs``, batch or world size) prints one line and rebuilds the schedule for the new plan
  at the current step (a run extended from 100 to 300 epochs continues on a cosine over 300).
- loss: timm ``Mixup``/CutMix + ``SoftTargetCrossEntropy`` when ``mixup`` is set (label smoothing folded into the soft
  targets), otherwise cross-entropy with ``label_smoothing``; 2-D (soft) targets from the datamodule are accepted.
- EMA: timm ``ModelEmaV3`` of the backbone (``ema_decay``), re-synchronised with the backbone right after the
  initializer ran, updated after every optimizer step, saved in the checkpoint (``ema.module.*`` keys) and evaluated
  next to the raw model (``val_ema/*``, ``test_ema/*``). Not supported with ``fsdp2`` (clear error).
- metrics: torchmetrics top-1 / top-5 for train (top-1 against the dominant class of the mixed target), val and test.

Speed switches (standard in timm's ``train.py`` / DeiT on GPUs; each is a no-op on CPU unless stated):

- ``compile: true``: ``torch.compile`` of the backbone in place (``nn.Module.compile``: parameter names and checkpoints
  unchanged), applied in ``configure_model`` after FSDP2 sharding; also on CPU (inductor needs a C compiler).
  ``compile: {mode: max-autotune}`` (any ``torch.compile`` keyword arguments) compiles with those. A steady-state
  training run compiles two graphs — training, and validation (eval mode, no grad) — with no graph break, and no
  more after an epoch boundary or a resume (``tests/test_compile.py``).
- AdamW / Adam are built with ``fused=True`` on CUDA (one kernel per step instead of a loop over tensors).
- ``torch.set_float32_matmul_precision("high")`` on CUDA (TF32 tensor cores for the fp32 matmuls left under bf16
  autocast); the process-wide setting is changed in ``setup``.
- Under ``fsdp2`` with ``bf16-mixed`` precision, ``fully_shard`` gets ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``: bf16 all-gathers and compute, fp32 gradient reduce-scatter and fp32 master weights.
- DDP gradient compression is the ``ddp_bf16`` strategy (``impulsevit.strategies``).

The training step reads nothing back to the host: the loss goes to the loggers at ``log_every_n_steps`` and to the
progress bar (``loss``) only at those steps; the train accuracy is updated without torchmetrics' argument checks
(which read the device).

Gradient clipping, accumulation and precision are ``Trainer`` flags (``gradient_clip_val``, ``accumulate_grad_batches``,
``precision``; use ``impulsevit.strategies.default_precision()``: ``bf16-mixed`` on GPU, ``32-true`` on CPU).
Batches are ``(images float (B, 3, S, S), labels int64 (B,) or soft targets float (B, num_classes))``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import lightning as L
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import ModelParallelStrategy
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2, get_optimizer_info
from timm.scheduler import CosineLRScheduler, StepLRScheduler
from timm.utils import ModelEmaV3
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from impulsevit import strategies as _strategies  # noqa: F401  (registers the `fsdp2` strategy name)
from impulsevit.config import (
    InitConfig,
    MixupConfig,
    OptimizerConfig,
    SchedulerConfig,
    as_config,
    check_init_method,
    resolve_lr,
)
from impulsevit.lightning_private import is_log_step

__all__ = ["ImageClassifier", "check_image_size"]


def check_image_size(model: nn.Module, backbone: str, image_size: int | None) -> None:
    """Fail early when the data's image size does not fit a patch-based backbone.

    Raises:
        ValueError: ``image_size`` is not divisible by the backbone's patch size, or the backbone was built for a
            fixed ``img_size`` different from ``image_size`` (the message names the model, both sizes and the fix).
    """
    pe = getattr(model, "patch_embed", None)
    if image_size is None or pe is None or not hasattr(pe, "patch_size"):
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
                f"set model.backbone_kwargs.img_size: {image_size}"
            )


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """The submodules that get their own FSDP2 unit: the children of ``blocks`` / ``layers`` / ``stages``."""
    for name in ("blocks", "layers", "stages"):
        seq = getattr(model, name, None)
        if isinstance(seq, nn.Sequential | nn.ModuleList):
            return list(seq)
    return []


class ImageClassifier(L.LightningModule):
    """Image classification with a timm backbone; see the module docstring for the recipe essentials.

    Args:
        backbone: any ``timm.list_models()`` name (or a model registered with timm by ``impulsevit.models``).
        backbone_kwargs: extra ``timm.create_model`` kwargs (``img_size``, ``patch_size``, ``drop_path_rate``,
            ``weight_init: skip`` ...).
        num_classes: classifier outputs; ``None`` keeps the backbone's default (the CLI links ``data.num_classes``).
        init: the initializer run at the start of fitting (``InitConfig``); ``None`` = ``impulse`` with seed 0.
        optimizer / scheduler: see ``OptimizerConfig`` / ``SchedulerConfig``.
        mixup: mixup / cutmix settings; ``None`` disables them.
        label_smoothing: smoothing of the training targets (folded into the mixup targets when mixup is on).
        ema_decay: EMA decay per optimizer step; ``None`` disables the EMA.
        ema_warmup: use timm's EMA warmup (decay ramps up over the first steps).
        log_attention: log the initial attention maps and per-head summary to TensorBoard (Initializer).
        attention_every_n_epochs: record attention locality on a probe batch every this many epochs (and at init and
            the end; ``impulsevit.callbacks.AttentionEvolution``); ``None`` turns it off.
        compile: ``torch.compile`` the backbone (inductor; see the module docstring); a mapping gives
            ``torch.compile``'s keyword arguments (``mode``, ``backend``, ``fullgraph``, ...).

    Not supported: EMA together with the ``fsdp2`` strategy; Lightning's FSDP1 ``FSDPStrategy`` (use ``fsdp2``).
    """

    def __init__(
        self,
        backbone: str = "vit_tiny_patch16_224",
        backbone_kwargs: dict[str, Any] | None = None,
        num_classes: int | None = None,
        init: InitConfig | None = None,
        optimizer: OptimizerConfig | None = None,
        scheduler: SchedulerConfig | None = None,
        mixup: MixupConfig | None = None,
        label_smoothing: float = 0.1,
        ema_decay: float | None = None,
        ema_warmup: bool = False,
        log_attention: bool = True,
        attention_every_n_epochs: int | None = 1,
        compile: bool | dict[str, Any] = False,
    ) -> None:
        super().__init__()
        self.init_cfg: InitConfig = as_config(InitConfig, init, "init")
        check_init_method(self.init_cfg.method, self.init_cfg.options)
        self.optimizer_cfg: OptimizerConfig = as_config(OptimizerConfig, optimizer, "optimizer")
        self.scheduler_cfg: SchedulerConfig = as_config(SchedulerConfig, scheduler, "scheduler")
        self.mixup_cfg: MixupConfig | None = None if mixup is None else as_config(MixupConfig, mixup, "mixup")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"model.label_smoothing must be in [0, 1), got {label_smoothing}")
        if ema_decay is not None and not 0.0 < ema_decay < 1.0:
            raise ValueError(f"model.ema_decay must be in (0, 1) or null, got {ema_decay}")
        # Plain dicts in the checkpoint (loadable with weights_only=True, readable in hparams.yaml / TensorBoard).
        self.save_hyperparameters({
            "backbone": backbone,
            "backbone_kwargs": dict(backbone_kwargs or {}),
            "num_classes": num_classes,
            "init": dataclasses.asdict(self.init_cfg),
            "optimizer": {**dataclasses.asdict(self.optimizer_cfg), "betas": list(self.optimizer_cfg.betas)},
            "scheduler": dataclasses.asdict(self.scheduler_cfg),
            "mixup": None if self.mixup_cfg is None else dataclasses.asdict(self.mixup_cfg),
            "label_smoothing": label_smoothing,
            "ema_decay": ema_decay,
            "ema_warmup": ema_warmup,
            "log_attention": log_attention,
            "attention_every_n_epochs": attention_every_n_epochs,
            "compile": dict(compile) if isinstance(compile, dict) else bool(compile),
        })
        self.backbone = self.build_backbone()
        self.num_classes = int(self.backbone.num_classes)
        self.label_smoothing = float(label_smoothing)

        self.ema: ModelEmaV3 | None = None
        if ema_decay is not None:
            self.ema = ModelEmaV3(self.backbone, decay=ema_decay, use_warmup=ema_warmup)
            self.ema.requires_grad_(False)
            self.ema.train()  # never run in training; Lightning sets eval for validation. Avoids its eval-mode warning.

        self.mixup_fn: Mixup | None = None
        m = self.mixup_cfg
        if m is not None and (m.mixup_alpha > 0 or m.cutmix_alpha > 0) and m.prob > 0:
            self.mixup_fn = Mixup(
                mixup_alpha=m.mixup_alpha, cutmix_alpha=m.cutmix_alpha, prob=m.prob, switch_prob=m.switch_prob,
                mode=m.mode, label_smoothing=self.label_smoothing, num_classes=self.num_classes,
            )
        self.soft_loss = SoftTargetCrossEntropy()

        k5 = min(5, self.num_classes)
        def accs(prefix: str, top5: bool = True) -> MetricCollection:
            # train: no argument validation (it reads the targets back to the host every step)
            ms = {"acc1": MulticlassAccuracy(self.num_classes, top_k=1, average="micro", validate_args=top5)}
            if top5:
                ms["acc5"] = MulticlassAccuracy(self.num_classes, top_k=k5, average="micro")
            return MetricCollection(ms, prefix=f"{prefix}/")

        # keys are stage names with a `_` suffix: ModuleDict keys may not shadow nn.Module.train
        self.metrics = nn.ModuleDict({
            f"{stage}_": accs(stage, top5=stage != "train")
            for stage in ("train", "val", "test", *(("val_ema", "test_ema") if self.ema is not None else ()))
        })
        self.resolved: dict[str, Any] = {}  # lr / global batch / steps, filled by configure_optimizers

    # ------------------------------------------------------------------ structure
    def build_backbone(self) -> nn.Module:
        """A fresh ``timm.create_model(backbone, num_classes=..., **backbone_kwargs)`` (on the current default device).

        Raises:
            ValueError: unknown model name or kwargs the model rejects (names the model and the kwargs).
        """
        name = self.hparams.backbone
        kwargs = dict(self.hparams.backbone_kwargs)
        if self.hparams.num_classes is not None:
            kwargs["num_classes"] = int(self.hparams.num_classes)
        try:
            return timm.create_model(name, **kwargs)
        except (RuntimeError, TypeError, ValueError, AssertionError) as e:
            raise ValueError(f"cannot build timm model {name!r} (model.backbone) with kwargs {kwargs}: {e}") from e

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of the raw (non-EMA) backbone for images ``(B, 3, S, S)``."""
        return self.backbone(images)

    def configure_callbacks(self) -> list[L.Callback]:
        """:func:`impulsevit.callbacks.standard_callbacks` for this model's ``init``, minus the kinds the trainer
        already has (a user-configured one is kept): the same set for a plain ``Trainer`` and for ``impulsevit fit``."""
        from impulsevit.callbacks import standard_callbacks

        trainer = self._trainer
        cfg = self.init_cfg
        return standard_callbacks(
            init_method=cfg.method, init_seed=cfg.seed, init_options=cfg.options,
            log_attention=self.hparams.log_attention,
            attention_every_n_epochs=self.hparams.get("attention_every_n_epochs", 1),
            existing=list(trainer.callbacks) if trainer is not None else [],
            has_logger=bool(trainer.loggers) if trainer is not None else False,
        )

    def configure_model(self) -> None:
        """Under the ``fsdp2`` strategy (``ModelParallelStrategy``): FSDP2 ``fully_shard`` per block, then the backbone.

        Idempotent (Lightning calls it for every stage). Raises ``ValueError`` when EMA is requested with FSDP2.
        """
        trainer = self._trainer
        if trainer is None:
            return
        if isinstance(trainer.strategy, ModelParallelStrategy):
            self._shard(trainer)
        options = self.hparams.get("compile")
        if options and not getattr(self.backbone, "_compiled_call_impl", None):
            self.backbone.compile(**(options if isinstance(options, dict) else {}))

    def _shard(self, trainer: L.Trainer) -> None:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        if self.ema is not None:
            raise ValueError(
                f"model.ema_decay={self.hparams.ema_decay} is not supported with the {type(trainer.strategy).__name__} "
                "(fsdp2) strategy: the EMA copy would not be sharded. Use strategy ddp, or set model.ema_decay: null"
            )
        if isinstance(self.backbone, FSDPModule):
            return
        mesh = self.device_mesh["data_parallel"] if self.device_mesh is not None else None
        policy = MixedPrecisionPolicy()
        if str(trainer.precision).startswith("bf16"):
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for unit in _shard_units(self.backbone):
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        fully_shard(self.backbone, mesh=mesh, mp_policy=policy)

    def setup(self, stage: str) -> None:
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(self.trainer.strategy, FSDPStrategy):
            raise ValueError(
                "Lightning's FSDPStrategy (FSDP1) is not supported: its flat parameters cannot be initialized per "
                "tensor at on_fit_start. Use trainer.strategy: fsdp2"
            )
        if self.trainer.strategy.root_device.type == "cuda":
            torch.set_float32_matmul_precision("high")
        dm = self.trainer.datamodule
        check_image_size(self.backbone, self.hparams.backbone, getattr(dm, "image_size", None))
        dm_classes = getattr(dm, "num_classes", None)
        if dm_classes is not None and int(dm_classes) != self.num_classes:
            raise ValueError(
                f"backbone {self.hparams.backbone!r} has {self.num_classes} outputs but the data has {dm_classes} "
                f"classes; set model.num_classes: {dm_classes}"
            )

    def on_initialized(self, report: Any) -> None:
        """Called by the ``Initializer`` callback right after the init was applied: take the EMA copy now."""
        if self.ema is not None:
            self.ema.set(self.backbone)

    # ------------------------------------------------------------------ steps
    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if targets.ndim == 2:
            return self.soft_loss(logits, targets)
        return F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing if self.training else 0.0)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, targets = batch
        if self.mixup_fn is not None and targets.ndim == 1:
            if images.shape[0] % 2:
                raise ValueError(f"mixup/cutmix needs an even batch size, got {images.shape[0]} (use drop_last)")
            images, targets = self.mixup_fn(images, targets)
        logits = self.backbone(images)
        loss = self._loss(logits, targets)
        hard = targets.argmax(dim=-1) if targets.ndim == 2 else targets
        self.metrics["train_"].update(logits.detach(), hard)
        self.log("train/loss", loss, on_step=True, on_epoch=False)  # read by the loggers at log steps only
        self.log_dict(self.metrics["train_"], on_step=False, on_epoch=True)
        return loss

    def _eval_step(self, stage: str, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, targets = batch
        logits = self.backbone(images)
        self.log(f"{stage}/loss", F.cross_entropy(logits, targets), on_epoch=True, sync_dist=True,
                 prog_bar=stage == "val")
        self.metrics[f"{stage}_"].update(logits, targets)
        self.log_dict(self.metrics[f"{stage}_"], on_epoch=True, prog_bar=stage == "val")
        if self.ema is not None:
            ema_logits = self.ema.module(images)
            self.log(f"{stage}_ema/loss", F.cross_entropy(ema_logits, targets), on_epoch=True, sync_dist=True)
            self.metrics[f"{stage}_ema_"].update(ema_logits, targets)
            self.log_dict(self.metrics[f"{stage}_ema_"], on_epoch=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._eval_step("test", batch)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Class probabilities ``(B, num_classes)`` (EMA weights when an EMA exists)."""
        images = batch[0] if isinstance(batch, list | tuple) else batch
        net = self.ema.module if self.ema is not None else self.backbone
        return net(images).softmax(dim=-1)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning converts every prog_bar value with .item() after every batch, also the steps that did not log it:
        # the loss goes into the progress bar's dict as a Python float, read at log steps only
        if is_log_step(self.trainer) and isinstance(outputs, dict) and "loss" in outputs:
            self.trainer.progress_bar_metrics["loss"] = round(float(outputs["loss"].detach()), 4)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        if self.ema is not None:
            self.ema.update(self.backbone, step=self.global_step)

    # ------------------------------------------------------------------ optimization
    def global_batch_size(self) -> int | None:
        """Per-device batch x data-parallel replicas x ``accumulate_grad_batches``; ``None`` if the batch is unknown."""
        trainer = self.trainer
        per_device = getattr(trainer.datamodule, "batch_size", None)
        if per_device is None:
            per_device = getattr(trainer.train_dataloader, "batch_size", None)
        if per_device is None:
            return None
        sampler_kwargs = getattr(trainer.strategy, "distributed_sampler_kwargs", None) or {}
        replicas = int(sampler_kwargs.get("num_replicas", trainer.world_size))
        return int(per_device) * replicas * int(trainer.accumulate_grad_batches)

    def lr_plan(self) -> dict[str, Any]:
        """The schedule's plan for this run: ``total_steps`` (optimizer steps the cosine spans), ``warmup_steps``,
        ``steps_per_epoch`` and ``epochs`` (``model.scheduler.epochs``, else the trainer's ``max_epochs``; None when
        the trainer counts steps). Reads the train dataloader's length (Lightning loads it on first use)."""
        trainer = self.trainer
        estimated = max(1, int(trainer.estimated_stepping_batches))  # also loads the train dataloader
        batches = trainer.num_training_batches
        finite = math.isfinite(batches)
        steps_per_epoch = max(1, math.ceil(batches / trainer.accumulate_grad_batches)) if finite else estimated
        s = self.scheduler_cfg
        epochs: float | None = s.epochs
        if epochs is not None and finite:
            total_steps = max(1, math.ceil(epochs * steps_per_epoch))
        else:
            total_steps = estimated
            epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) and trainer.max_steps == -1 else None
        warmup = min(total_steps - 1, round(s.warmup_epochs * steps_per_epoch)) if s.warmup_epochs > 0 else 0
        return {"total_steps": total_steps, "warmup_steps": warmup, "steps_per_epoch": steps_per_epoch,
                "epochs": epochs}

    def _build_scheduler(self, optimizer: torch.optim.Optimizer, plan: dict[str, Any]) -> Any:
        s = self.scheduler_cfg
        total, warmup = plan["total_steps"], plan["warmup_steps"]
        if s.name == "cosine":
            return CosineLRScheduler(optimizer, t_initial=total, lr_min=s.min_lr, warmup_t=warmup,
                                     warmup_lr_init=s.warmup_lr, t_in_epochs=False)
        return StepLRScheduler(optimizer, decay_t=total + 1, decay_rate=1.0, warmup_t=warmup,
                               warmup_lr_init=s.warmup_lr, t_in_epochs=False)

    def configure_optimizers(self) -> dict[str, Any]:
        plan = self.lr_plan()
        global_batch = self.global_batch_size()
        cfg = self.optimizer_cfg
        lr = resolve_lr(cfg, global_batch)
        try:
            info = get_optimizer_info(cfg.name)
        except ValueError as e:
            raise ValueError(f"model.optimizer.name {cfg.name!r} is not a timm optimizer: {e}") from e
        extra: dict[str, Any] = {}
        if info.has_eps:
            extra["eps"] = cfg.eps
        if info.has_betas:
            extra["betas"] = tuple(cfg.betas)
        if self.device.type == "cuda" and cfg.name.lower() in ("adamw", "adam"):
            extra["fused"] = True  # torch's fused CUDA kernel (timm passes it through to torch.optim)
        optimizer = create_optimizer_v2(
            self.backbone, opt=cfg.name, lr=lr, weight_decay=cfg.weight_decay, layer_decay=cfg.layer_decay, **extra
        )
        scheduler = self._build_scheduler(optimizer, plan)
        self.resolved = {"lr": lr, "global_batch_size": global_batch, **plan}
        # "name": the tag Lightning's LearningRateMonitor logs the lr under (lr/pg<i> with several param groups)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1, "name": "lr"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.resolved:
            checkpoint["lr_plan"] = {k: self.resolved[k] for k in ("total_steps", "warmup_steps", "steps_per_epoch",
                                                                   "epochs") if k in self.resolved}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._checkpoint_plan = checkpoint.get("lr_plan")

    def _follow_plan_after_resume(self) -> None:
        """After a resume: if the checkpoint's plan differs from this run's, say so in one line and replace the
        restored scheduler (whose state holds the old length) by one for the new plan, at the current step."""
        old = getattr(self, "_checkpoint_plan", None)
        self._checkpoint_plan = None
        if not old or not self.resolved:
            return
        keys = ("total_steps", "warmup_steps")
        if all(old.get(k) == self.resolved.get(k) for k in keys):
            return
        trainer = self.trainer
        config = trainer.lr_scheduler_configs[0]
        config.scheduler = self._build_scheduler(trainer.optimizers[0], self.resolved)
        config.scheduler.step_update(num_updates=self.global_step)

        def desc(p: dict[str, Any]) -> str:
            ep = p.get("epochs")
            span = f"{ep:g} epochs x {p.get('steps_per_epoch')} steps = " if ep is not None else ""
            return f"{span}{p['total_steps']} steps, warmup {p['warmup_steps']}"

        if trainer.is_global_zero:
            print(f"[impulsevit] lr schedule: the plan changed on resume (checkpoint: {desc(old)}; now: "
                  f"{desc(self.resolved)}); rebuilt the {self.scheduler_cfg.name} schedule for the new plan from step "
                  f"{self.global_step}", file=sys.stderr, flush=True)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        # Lightning calls this after each optimizer step with global_step already counting it.
        scheduler.step_update(num_updates=self.global_step)

    def on_train_start(self) -> None:
        self._follow_plan_after_resume()

    def on_fit_start(self) -> None:
        # Runs after the callbacks' on_fit_start (the Initializer) and before Lightning logs the hparams.
        if self.logger is not None and self.resolved:
            self.logger.log_hyperparams({"resolved": dict(self.resolved)})

