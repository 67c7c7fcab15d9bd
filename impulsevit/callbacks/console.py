"""What a run prints to the terminal: Lightning's model summary and progress bar, with two things they get wrong for
an impulsevit run fixed.

- :class:`FlopsModelSummary`: Lightning's ``ModelSummary`` prints "0 Total Flops" unless the model has an
  ``example_input_array``, whose forward pass at summary time would run on rank 0 alone (a hang under FSDP2) and
  compile an extra graph under ``torch.compile``. This one counts the backbone's forward FLOPs for one image on a
  meta-device copy (:func:`~impulsevit.callbacks.throughput.backbone_flops`: nothing runs on the real model) — what
  Lightning reports for a one-image ``example_input_array``.
- :class:`ResumeProgressBar`: Lightning does not call ``on_train_epoch_start`` when a fit resumes in the middle of an
  epoch, so its progress bar shows "Training: 33/?" — no epoch, no total. This one starts the epoch's bar itself
  on such a resume.
- :class:`LineProgressBar`: where stdout is not a terminal (a SLURM ``%j.out``, ``nohup``, ``| tee``, a redirect),
  a bar redrawn every step writes carriage-return frames (250 KB for the 2-epoch quickstart, ~100 MB for a 300-epoch
  ImageNet run). This one prints one plain line every ``every_n_steps`` optimizer steps or ``every_seconds`` seconds,
  whichever comes first — epoch, step / total, img/s (global and per device), loss, lr, ETA, peak memory — and one
  line per validation with its metrics, as timm's ``train.py`` and torchtitan do.

:func:`impulsevit.callbacks.standard_callbacks` puts them in place of Lightning's default instances (same settings;
the bar where stdout is a terminal, the lines where it is not);
a summary or bar of another kind (``RichModelSummary``, ``RichProgressBar``, a subclass) is left alone. A plain
``ModelSummary`` given in ``trainer.callbacks`` is replaced too, with ``max_depth`` 1 (Lightning's default); pass
``FlopsModelSummary(max_depth=...)`` to choose another depth.
"""

from __future__ import annotations

import datetime
import math
import resource
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelSummary, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from impulsevit.callbacks.throughput import ThroughputLogger, backbone_flops

__all__ = ["FlopsModelSummary", "LineProgressBar", "ResumeProgressBar", "format_bytes", "format_duration",
           "stdout_is_terminal"]


class FlopsModelSummary(ModelSummary):
    """Lightning's ``ModelSummary`` with "Total Flops" = the backbone's forward FLOPs for one image (see the module
    docstring); 0, as Lightning prints it, when they cannot be counted."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flops = backbone_flops(trainer, pl_module, batch=1, backward=False) if trainer.is_global_zero else None
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data: list, total_parameters: int, trainable_parameters: int, model_size: float,
                  total_training_modes: dict[str, int], total_flops: int, **summarize_kwargs: Any) -> None:
        ModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                               total_flops=total_flops or self._flops or 0, **summarize_kwargs)


class ResumeProgressBar(TQDMProgressBar):
    """Lightning's ``TQDMProgressBar`` that also shows the epoch and its total after a mid-epoch resume."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if trainer.fit_loop.restarted_mid_epoch:  # Lightning skips on_train_epoch_start for this epoch
            self.on_train_epoch_start(trainer)


def stdout_is_terminal() -> bool:
    """Whether ``sys.stdout`` (where Lightning's progress bar draws) is a terminal."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` (``d days, h:mm:ss`` past a day) of a non-negative number of seconds; ``?`` when not finite."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    return str(datetime.timedelta(seconds=round(seconds)))


def format_bytes(n: float) -> str:
    """``n`` bytes as MiB below 1 GiB, else GiB (one decimal)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _peak_memory(trainer: L.Trainer) -> str | None:
    """``peak mem X`` (CUDA: ``torch.cuda.max_memory_allocated`` of this rank's device) or ``max rss X`` (this
    process's peak resident memory, Linux/macOS); None where neither is known."""
    device = trainer.strategy.root_device
    if device.type == "cuda":
        return f"peak mem {format_bytes(torch.cuda.max_memory_allocated(device))}"
    try:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    return f"max rss {format_bytes(rss if sys.platform == 'darwin' else rss * 1024)}"  # Linux: KiB, macOS: bytes


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return v if math.isfinite(v) else None


class LineProgressBar(TQDMProgressBar):
    """One plain line per ``every_n_steps`` optimizer steps or ``every_seconds`` seconds (whichever first) and one per
    validation, on stdout, from global rank 0 — what a job log (file, pipe) should hold instead of bar frames::

        epoch 1/2 step 150/468 (global 618/936) | 2150.3 img/s (2150.3/device) | loss 0.8123 | lr 1.63e-03 | \
eta 0:00:41 | max rss 812 MiB
        epoch 1/2 validation | val/acc1 0.7950 | val/acc5 0.9961 | val/loss 0.6712

    A subclass of Lightning's ``TQDMProgressBar`` whose bars are never drawn (``Tqdm(disable=True)``): Lightning lets a
    callback returned by ``configure_callbacks`` replace a trainer callback only of a parent type, so this is how
    :func:`~impulsevit.callbacks.standard_callbacks` swaps it for the default bar when stdout is not a terminal.
    Given explicitly (``trainer.callbacks: [{class_path: impulsevit.callbacks.LineProgressBar, init_args:
    {every_n_steps: 100, every_seconds: 30}}]``, or ``--trainer.callbacks+=impulsevit.callbacks.LineProgressBar
    --trainer.callbacks.every_seconds=30``) it prints lines on a terminal too.

    img/s is :class:`~impulsevit.callbacks.throughput.ThroughputLogger`'s smoothed global rate when the trainer has one
    (else the mean over the interval since the previous line); per device = global / world size. ETA: the optimizer
    steps left to ``trainer.estimated_stepping_batches`` at this segment's mean time per step (validation included).
    Memory: CUDA ``max_memory_allocated`` of rank 0's device, or the process's max RSS on CPU. The loss is the
    training step's own (one device read per line). Nothing is printed under ``trainer.enable_progress_bar: false``.
    Not supported: lines from ranks other than 0; lines during ``validate`` / ``test`` / ``predict`` (Lightning prints
    their result table).

    Args:
        every_n_steps: optimizer steps between lines (``None``: ``trainer.log_every_n_steps``); 0 disables the step
            trigger.
        every_seconds: the longest time between two lines (``None`` or 0: no time trigger).
    """

    def __init__(self, every_n_steps: int | None = None, every_seconds: float | None = 60.0,
                 process_position: int = 0) -> None:
        if every_n_steps is not None and every_n_steps < 0:
            raise ValueError(f"LineProgressBar every_n_steps must be >= 0 (0: no step trigger), got {every_n_steps}")
        if every_seconds is not None and every_seconds < 0:
            raise ValueError(f"LineProgressBar every_seconds must be >= 0 (0: no time trigger), got {every_seconds}")
        super().__init__(refresh_rate=1, process_position=process_position)
        self.every_n_steps = every_n_steps
        self.every_seconds = every_seconds
        self._t_start = self._t_line = 0.0
        self._step_start = self._step_line = 0
        self._samples = 0
        self._throughput: ThroughputLogger | None = None

    # the bars Lightning's hooks update are never drawn
    def init_sanity_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    def init_validation_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    def init_test_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    def init_predict_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    def _emit(self, line: str) -> None:
        print(line, file=sys.stdout, flush=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if trainer.fit_loop.restarted_mid_epoch:  # Lightning skips on_train_epoch_start for this epoch
            self.on_train_epoch_start(trainer)
        self._throughput = next((c for c in trainer.callbacks if isinstance(c, ThroughputLogger)), None)
        self._t_start = self._t_line = time.monotonic()
        self._step_start = self._step_line = trainer.global_step
        self._samples = 0

    def _interval(self, trainer: L.Trainer) -> int:
        return trainer.log_every_n_steps if self.every_n_steps is None else self.every_n_steps

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.is_disabled:
            return
        if self._throughput is None:
            self._samples += _batch_size(batch)
        step, now = trainer.global_step, time.monotonic()
        n = self._interval(trainer)
        due = (n > 0 and step != self._step_line and step % n == 0) or \
            (bool(self.every_seconds) and now - self._t_line >= float(self.every_seconds))
        if due:
            self._emit(self.train_line(trainer, outputs, batch_idx, now))
            self._t_line, self._step_line, self._samples = now, step, 0

    def train_line(self, trainer: L.Trainer, outputs: Any, batch_idx: int, now: float) -> str:
        """The line for the training step that just ended (see the class)."""
        step = trainer.global_step
        total_steps = _number(trainer.estimated_stepping_batches)
        per_epoch = _number(self.total_train_batches)
        max_epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else None
        epoch = f"epoch {trainer.current_epoch + 1}" + (f"/{max_epochs}" if max_epochs else "")
        where = f"step {batch_idx + 1}" + (f"/{int(per_epoch)}" if per_epoch else "")
        where += f" (global {step}" + (f"/{int(total_steps)})" if total_steps else ")")
        parts = [f"{epoch} {where}"]
        rate = self._throughput.images_per_sec if self._throughput is not None else None
        if rate is None and self._samples and now > self._t_line:
            rate = self._samples * trainer.world_size / (now - self._t_line)
        if rate is not None:
            parts.append(f"{rate:.1f} img/s ({rate / max(trainer.world_size, 1):.1f}/device)")
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        loss = _number(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if trainer.optimizers:
            lrs = [g["lr"] for g in trainer.optimizers[0].param_groups if _number(g.get("lr")) is not None]
            if lrs:
                parts.append(f"lr {max(lrs):.3g}")
        done = step - self._step_start
        if total_steps and done > 0:
            parts.append(f"eta {format_duration((total_steps - step) * (now - self._t_start) / done)}")
        memory = _peak_memory(trainer)
        if memory:
            parts.append(memory)
        return " | ".join(parts)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self.is_disabled or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self._emit(self.validation_line(trainer))

    def validation_line(self, trainer: L.Trainer) -> str:
        """The line for the validation that just ended: its ``val*`` metrics, sorted by name."""
        metrics = {k: _number(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        shown = [f"{k} {v:.4f}" for k, v in sorted(metrics.items()) if v is not None]
        max_epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else None
        head = f"epoch {trainer.current_epoch + 1}" + (f"/{max_epochs}" if max_epochs else "") + \
            f" validation (global step {trainer.global_step})"
        return " | ".join([head, *shown])


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, list | tuple) and batch else batch
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.ndim else 0
