"""``ImageClassifier``: a LightningModule around any ``timm.create_model`` backbone, with the DeiT training essentials.

The class holds the Lightning hooks; each concern is a small module of its own that it delegates to:

- backbone (:mod:`impulsevit.training.backbone`): ``timm.create_model(backbone, num_classes=..., img_size=...,
  **backbone_kwargs)``, built in ``__init__`` so ``load_from_checkpoint`` needs no trainer. The input size has one
  source, the data's ``image_size``: the CLI links it to ``img_size``, passed to timm for architectures built for a
  fixed size.
- init: the ``impulsevit.callbacks.Initializer`` is added by ``configure_callbacks`` from ``init`` (so the initializer
  is data in the recipe) and runs once at ``on_fit_start``, never on a resumed run. ``init.method`` is checked once at
  construction (:func:`impulsevit.init.check_init_method`). With ``pretrained`` the run starts from weights instead
  (:mod:`impulsevit.training.pretrained`; the init method recorded is ``from weights``) and ``freeze_backbone``
  trains the classifier only.
- optimizer, lr plan and schedule, and the schedule's rebuild when a resume changes the plan
  (:mod:`impulsevit.training.optim`). The plan is stored in checkpoints (``lr_plan``); a resume whose plan differs
  prints one line and rebuilds the schedule for the new plan at the current step.
- loss: timm ``Mixup``/CutMix + soft-target cross-entropy, or cross-entropy with ``label_smoothing``
  (:mod:`impulsevit.training.loss`).
- EMA: timm ``ModelEmaV3`` of the backbone (:mod:`impulsevit.training.ema`), evaluated next to the raw model
  (``val_ema/*``, ``test_ema/*``). Not supported with ``fsdp2`` (clear error).
- metrics: torchmetrics top-1 / top-5 for train (top-1 against the dominant class of the mixed target), val and test
  (:mod:`impulsevit.training.metrics`).
- placement (:mod:`impulsevit.training.sharding`): FSDP2 ``fully_shard`` per block under the ``fsdp2`` strategy, then
  ``torch.compile`` when ``compile`` is set, in ``configure_model``.
- the data's size and class count are read from the trainer through :func:`impulsevit.training.datainfo.data_info`.

Speed switches (standard in timm's ``train.py`` / DeiT on GPUs; each is a no-op on CPU unless stated):

- ``compile: true``: ``torch.compile`` of the backbone in place (``nn.Module.compile``: parameter names and checkpoints
  unchanged), applied in ``configure_model`` after FSDP2 sharding; also on CPU (inductor needs a C compiler).
  ``compile: {mode: max-autotune}`` (any ``torch.compile`` keyword arguments) compiles with those. A steady-state
  training run compiles two graphs — training, and validation (eval mode, no grad) — with no graph break, and no
  more after an epoch boundary or a resume (``tests/training/test_compile.py``).
- AdamW / Adam are built with ``fused=True`` on CUDA (one kernel per step instead of a loop over tensors).
- ``torch.set_float32_matmul_precision("high")`` on CUDA (TF32 tensor cores for the fp32 matmuls left under bf16
  autocast); the process-wide setting is changed in ``setup``.
- Under ``fsdp2`` with ``bf16-mixed`` precision, ``fully_shard`` gets ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``: bf16 all-gathers and compute, fp32 gradient reduce-scatter and fp32 master weights.
- DDP gradient compression is the ``ddp_bf16`` strategy (``impulsevit.training.strategies``).

The training step reads nothing back to the host: the loss goes to the loggers at ``log_every_n_steps`` and to the
progress bar (``loss``) only at those steps; the train accuracy is updated without torchmetrics' argument checks
(which read the device).

Gradient clipping, accumulation and precision are ``Trainer`` flags (``gradient_clip_val``, ``accumulate_grad_batches``,
``precision``; use ``impulsevit.training.strategies.default_precision()``: ``bf16-mixed`` on GPU, ``32-true`` on CPU).
Batches are ``(images float (B, 3, S, S), labels int64 (B,) or soft targets float (B, num_classes))``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import ModelParallelStrategy
from timm.data import Mixup
from timm.utils import ModelEmaV3
from torch import nn

from impulsevit._compat.lightning import is_log_step
from impulsevit.errors import ConfigError
from impulsevit.init import InitReport, check_init_method
from impulsevit.training import optim
from impulsevit.training import strategies as _strategies  # noqa: F401  (registers the `fsdp2` strategy name)
from impulsevit.training.backbone import check_image_size, create_backbone, timm_kwargs
from impulsevit.training.checkpointing import weights_mismatch
from impulsevit.training.config import (
    InitConfig,
    MixupConfig,
    OptimizerConfig,
    SchedulerConfig,
    as_config,
    resolve_lr,
)
from impulsevit.training.datainfo import data_info
from impulsevit.training.ema import make_ema
from impulsevit.training.loss import classification_loss, make_mixup
from impulsevit.training.metrics import accuracy_metrics
from impulsevit.training.pretrained import freeze_backbone as freeze_backbone_params
from impulsevit.training.pretrained import load_into, read_state_dict, reinit_parts, reinit_targets, resolve_source
from impulsevit.training.sharding import compile_backbone, shard_backbone

__all__ = ["ImageClassifier", "check_image_size"]


class ImageClassifier(L.LightningModule):
    """Image classification with a timm backbone; see the module docstring for the recipe essentials.

    Args:
        backbone: any ``timm.list_models()`` name (or a model registered with timm by ``impulsevit.models``).
        backbone_kwargs: extra ``timm.create_model`` kwargs (``patch_size``, ``drop_path_rate``, ``weight_init: skip``
            ...); the input size is ``img_size``, not a key here (one equal to ``img_size`` is accepted).
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
        pretrained: start from these weights instead of running ``init`` (timm's name for it): an impulsevit
            checkpoint, an exported folder (``local-dir:PATH`` or the path), ``hf-hub:ORG/NAME``, a timm pretrained
            tag ``ARCH.TAG``, or a ``.safetensors`` / ``.pth`` file (:mod:`impulsevit.training.pretrained`: a new
            head when the class count differs, position embeddings resampled to ``img_size``; the architecture the
            source records, if any, must match the backbone's, e.g. its ``num_heads``). Loaded once, at the
            start of a fresh fit (:meth:`load_weights`; ``impulsevit fit`` loads and checks it before the run
            directory is made); a resumed run keeps its checkpoint's weights and does not read the source again.
        reinit: with ``pretrained``, module names or globs of the backbone (``["head"]``, ``["blocks.11", "head"]``)
            put back at PyTorch's constructor init after loading (the ``torch`` method's values for ``init.seed``;
            :func:`impulsevit.training.pretrained.reinit_parts`); checked against the model when it is built.
        freeze_backbone: train the classifier only (every other parameter has ``requires_grad=False`` and is left
            out of the optimizer): a linear probe through ``fit``.
        compile: ``torch.compile`` the backbone (inductor; see the module docstring); a mapping gives
            ``torch.compile``'s keyword arguments (``mode``, ``backend``, ``fullgraph``, ...).
        img_size: the input size in pixels (square; the CLI links ``data.image_size``), passed to timm for
            architectures built for a fixed size (:mod:`impulsevit.training.backbone`); ``None``: the backbone's
            default, and the data's size is checked against it at ``setup``.

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
        img_size: int | None = None,
        pretrained: str | None = None,
        freeze_backbone: bool = False,
        reinit: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.init_cfg: InitConfig = as_config(InitConfig, init, "init")
        check_init_method(self.init_cfg.method, self.init_cfg.options)
        self.optimizer_cfg: OptimizerConfig = as_config(OptimizerConfig, optimizer, "optimizer")
        self.scheduler_cfg: SchedulerConfig = as_config(SchedulerConfig, scheduler, "scheduler")
        self.mixup_cfg: MixupConfig | None = None if mixup is None else as_config(MixupConfig, mixup, "mixup")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"model.label_smoothing must be in [0, 1), got {label_smoothing}")
        # Plain dicts in the checkpoint (loadable with weights_only=True, readable in hparams.yaml / TensorBoard).
        self.save_hyperparameters({
            "backbone": backbone,
            "backbone_kwargs": dict(backbone_kwargs or {}),
            "num_classes": num_classes,
            "img_size": None if img_size is None else int(img_size),
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
            "pretrained": None if pretrained in (None, "") else str(pretrained),
            "freeze_backbone": bool(freeze_backbone),
            "reinit": [str(p) for p in reinit or []],
        })
        self.backbone = self.build_backbone()
        if img_size is not None:
            check_image_size(self.backbone, backbone, int(img_size))
        self.num_classes = int(self.backbone.num_classes)
        if reinit:
            if not self.hparams["pretrained"]:
                raise ConfigError("model.reinit puts parts of loaded weights back at their constructor init: set "
                                  "model.pretrained too (without it model.init sets every weight)")
            reinit_targets(self.backbone, self.hparams["reinit"])  # a pattern that matches nothing: one line, now
        if freeze_backbone:
            freeze_backbone_params(self.backbone)
        self.weights_report: InitReport | None = None  # set by load_weights (a run started from model.pretrained)
        self.label_smoothing = float(label_smoothing)
        self.ema: ModelEmaV3 | None = make_ema(self.backbone, ema_decay, ema_warmup)
        self.mixup_fn: Mixup | None = make_mixup(self.mixup_cfg, self.label_smoothing, self.num_classes)
        self.metrics = accuracy_metrics(
            self.num_classes, ("train", "val", "test", *(("val_ema", "test_ema") if self.ema is not None else ())))
        self.resolved: dict[str, Any] = {}  # lr / global batch / steps, filled by configure_optimizers
        self._checkpoint_plan: dict[str, Any] | None = None  # the lr plan of the checkpoint being resumed

    # ------------------------------------------------------------------ structure
    def build_backbone(self) -> nn.Module:
        """A fresh ``timm.create_model`` of this model's settings (:func:`impulsevit.training.backbone.timm_kwargs`),
        on the current default device.

        Raises:
            ValueError: unknown model name or kwargs the model rejects (names the model and the kwargs); a
                ``backbone_kwargs.img_size`` that differs from ``img_size`` (:class:`~impulsevit.errors.ConfigError`).
        """
        hp = self.hparams
        return create_backbone(hp.backbone, timm_kwargs(hp.backbone, hp.backbone_kwargs, hp.num_classes,
                                                        hp.get("img_size")))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of the raw (non-EMA) backbone for images ``(B, 3, S, S)``."""
        return self.backbone(images)

    def configure_callbacks(self) -> list[L.Callback]:
        """:func:`impulsevit.callbacks.standard_callbacks` for this model's ``init``, minus the kinds the trainer
        already has (a user-configured one is kept): the same set for a plain ``Trainer`` and for ``impulsevit fit``."""
        from impulsevit.callbacks import standard_callbacks

        trainer = self._attached_trainer()
        cfg = self.init_cfg
        return standard_callbacks(
            init_method=cfg.method, init_seed=cfg.seed, init_options=cfg.options,
            pretrained=self.hparams.get("pretrained"),
            log_attention=self.hparams.log_attention,
            attention_every_n_epochs=self.hparams.get("attention_every_n_epochs", 1),
            existing=list(trainer.callbacks) if trainer is not None else [],
            has_logger=bool(trainer.loggers) if trainer is not None else False,
        )

    def _attached_trainer(self) -> L.Trainer | None:
        """The trainer this model is attached to, or None (Lightning's public ``trainer`` raises when there is none)."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    def configure_model(self) -> None:
        """Under the ``fsdp2`` strategy (``ModelParallelStrategy``): FSDP2 ``fully_shard`` per block, then the backbone;
        then ``torch.compile`` when ``compile`` is set (:mod:`impulsevit.training.sharding`).

        Idempotent (Lightning calls it for every stage). Raises ``ValueError`` when EMA is requested with FSDP2.
        """
        trainer = self._attached_trainer()
        if trainer is None:
            return
        if isinstance(trainer.strategy, ModelParallelStrategy):
            if self.ema is not None:
                raise ValueError(
                    f"model.ema_decay={self.hparams.ema_decay} is not supported with the "
                    f"{type(trainer.strategy).__name__} (fsdp2) strategy: the EMA copy would not be sharded. Use "
                    "strategy ddp, or set model.ema_decay: null"
                )
            mesh = self.device_mesh["data_parallel"] if self.device_mesh is not None else None
            shard_backbone(self.backbone, mesh, str(trainer.precision))
        compile_backbone(self.backbone, self.hparams.get("compile"))

    def setup(self, stage: str) -> None:
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(self.trainer.strategy, FSDPStrategy):
            raise ValueError(
                "Lightning's FSDPStrategy (FSDP1) is not supported: its flat parameters cannot be initialized per "
                "tensor at on_fit_start. Use trainer.strategy: fsdp2"
            )
        if self.trainer.strategy.root_device.type == "cuda":
            torch.set_float32_matmul_precision("high")
        self._check_data()

    def _check_data(self) -> None:
        """The trainer's data fits the model: its image size (checked against the backbone here when the model was
        built without ``img_size``, a plain ``Trainer`` user's case; the CLI links the two) and its class count."""
        data = data_info(self.trainer)
        size = self.hparams.get("img_size")
        if size is None:
            check_image_size(self.backbone, self.hparams.backbone, data.image_size)
        elif data.image_size is not None and data.image_size != size:
            raise ValueError(f"the model was built for img_size {size} (model.img_size) but the data has image_size "
                             f"{data.image_size} (data.image_size); set model.img_size: {data.image_size}")
        if data.num_classes is not None and data.num_classes != self.num_classes:
            raise ValueError(
                f"backbone {self.hparams.backbone!r} has {self.num_classes} outputs but the data has "
                f"{data.num_classes} classes; set model.num_classes: {data.num_classes}"
            )

    def load_weights(self, trust: bool | None = None) -> InitReport:
        """Load ``pretrained`` into the backbone (once: a second call returns the first report) and take the EMA copy;
        returns the init report of method ``from weights`` (source, sha256, what was adapted).

        Raises:
            ConfigError / UntrustedFileError: the source is not found, would run code, or does not fit the backbone
                (one line each; nothing was changed then).
        """
        if self.weights_report is not None:
            return self.weights_report
        spec = self.hparams.get("pretrained")
        if not spec:
            raise ValueError("model.pretrained is not set: nothing to load")
        source = resolve_source(spec)
        report = load_into(self.backbone, self.hparams.backbone, source, read_state_dict(source, trust=trust))
        if self.hparams.get("reinit"):
            report.notes.append(reinit_parts(self.backbone, self.hparams["reinit"], self.init_cfg.seed))
            print(f"[impulsevit] model.reinit: {report.notes[-1]}", file=sys.stderr, flush=True)
        self.weights_report = report
        self.on_initialized(report)
        return report

    def on_initialized(self, report: Any) -> None:
        """Called by the ``Initializer`` callback right after the init was applied: take the EMA copy now."""
        if self.ema is not None:
            self.ema.set(self.backbone)

    # ------------------------------------------------------------------ steps
    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return classification_loss(logits, targets, self.label_smoothing if self.training else 0.0)

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

    # ------------------------------------------------------------------ optimization (impulsevit.training.optim)
    def global_batch_size(self) -> int | None:
        """Per-device batch x data-parallel replicas x ``accumulate_grad_batches``; ``None`` if the batch is unknown."""
        return optim.global_batch_size(self.trainer, data_info(self.trainer).batch_size)

    def lr_plan(self) -> dict[str, Any]:
        """The schedule's plan for this run (:func:`impulsevit.training.optim.lr_plan`)."""
        return optim.lr_plan(self.trainer, self.scheduler_cfg)

    def configure_optimizers(self) -> dict[str, Any]:
        plan = self.lr_plan()
        global_batch = self.global_batch_size()
        lr = resolve_lr(self.optimizer_cfg, global_batch)
        optimizer = optim.build_optimizer(self.backbone, self.optimizer_cfg, lr, self.device)
        scheduler = optim.build_scheduler(optimizer, self.scheduler_cfg, plan)
        self.resolved = {"lr": lr, "global_batch_size": global_batch, **plan}
        # "name": the tag Lightning's LearningRateMonitor logs the lr under (lr/pg<i> with several param groups)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1, "name": "lr"}}

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict`` (a resume, ``load_from_checkpoint``), with weights that do not fit raised as
        one line naming the checkpoint and the first tensors that differ
        (:func:`impulsevit.training.checkpointing.weights_mismatch`)."""
        try:
            path = self.trainer.ckpt_path
        except RuntimeError:  # not attached to a trainer (load_from_checkpoint)
            path = None
        with weights_mismatch(f"checkpoint {path}" if path else "the checkpoint"):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.resolved:
            checkpoint["lr_plan"] = {k: self.resolved[k] for k in optim.PLAN_KEYS if k in self.resolved}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._checkpoint_plan = checkpoint.get("lr_plan")

    def _follow_plan_after_resume(self) -> None:
        """After a resume: if the checkpoint's plan differs from this run's, say so in one line and replace the
        restored scheduler (whose state holds the old length) by one for the new plan, at the current step."""
        old, self._checkpoint_plan = self._checkpoint_plan, None
        if not optim.plan_changed(old, self.resolved):
            return
        optim.rebuild_scheduler(self.trainer, self.scheduler_cfg, self.resolved, self.global_step)
        if self.trainer.is_global_zero:
            print(f"[impulsevit] lr schedule: the plan changed on resume (checkpoint: {optim.describe_plan(old)}; now: "
                  f"{optim.describe_plan(self.resolved)}); rebuilt the {self.scheduler_cfg.name} schedule for the new "
                  f"plan from step {self.global_step}", file=sys.stderr, flush=True)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        # Lightning calls this after each optimizer step with global_step already counting it.
        scheduler.step_update(num_updates=self.global_step)

    def on_train_start(self) -> None:
        self._follow_plan_after_resume()

    def on_fit_start(self) -> None:
        # Runs after the callbacks' on_fit_start (the Initializer) and before Lightning logs the hparams.
        if self.logger is not None and self.resolved:
            self.logger.log_hyperparams({"resolved": dict(self.resolved)})
