"""Throughput: images/s on the progress bar; images/s per device, FLOP/s and MFU (GPU) to the loggers.

``ThroughputLogger`` is a callback on Lightning's public ``Throughput`` meter (``lightning.fabric``), logging the
keys Lightning's ``ThroughputMonitor`` logs — ``train/samples_per_sec``, ``train/device/samples_per_sec``,
``train/device/flops_per_sec`` and, when the device's peak is known, ``train/device/mfu`` — at every
``log_every_n_steps`` once its window is full. What the stock ``ThroughputMonitor`` lacks:

- it calls ``torch.cuda.synchronize()`` after every batch (for an exact clock), which stalls the host each step and,
  on rank 0 only, makes rank 0 the straggler of every gradient all-reduce. Here samples and batches are counted on
  the host every batch and the clock is read (after a synchronize) only at the steps that log; ``window_size``
  counts log intervals (rates are averaged over the last ``window_size - 1`` intervals);
- ``flops_per_batch`` is measured once per fit with ``torch.utils.flop_counter`` on a meta-device copy of the backbone
  (forward + backward of one training batch; no memory, no compute), when the module offers ``build_backbone()``;
- peak FLOP/s for chips Lightning's table misses or cannot match by name: ``torch.cuda.get_device_name`` says
  ``NVIDIA H200`` for the SXM part, which Lightning 2.6 does not map (Lightning#20660). Values here are **dense**
  (no 2:4 sparsity) datasheet numbers, the convention MFU uses;
- a smoothed global images/s on the progress bar (``img/s``; host-side timing between batch ends, no
  synchronisation: on a GPU it follows the rate at which the host enqueues steps, which equals the device's rate once
  the queue is full).

Not supported: validation / test throughput (training only); MFU on CPU (no peak known); variable batch sizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import Throughput, get_available_flops, measure_flops
from torch import nn

from impulsevit._compat.lightning import is_log_step
from impulsevit.training.datainfo import data_info

__all__ = ["DENSE_PEAK_FLOPS", "ThroughputLogger", "backbone_flops", "compute_dtype", "device_peak_flops", "peak_flops",
           "training_flops"]

# Dense peak FLOP/s per dtype ("tf32" = fp32 matmuls on tensor cores). NVIDIA H200 datasheet (SXM / NVL).
DENSE_PEAK_FLOPS: dict[str, dict[Any, float]] = {
    "h200 nvl": {torch.float64: 30e12, torch.float32: 60e12, "tfloat32": 417.5e12, torch.bfloat16: 835e12,
                 torch.float16: 835e12},
    "h200": {torch.float64: 34e12, torch.float32: 67e12, "tfloat32": 494.7e12, torch.bfloat16: 989.5e12,
             torch.float16: 989.5e12},
}


def peak_flops(device_name: str, dtype: torch.dtype | str) -> float | None:
    """Dense peak FLOP/s of a CUDA device name (as ``torch.cuda.get_device_name`` gives it) for ``dtype``, if known."""
    name = device_name.lower()
    for chip, table in DENSE_PEAK_FLOPS.items():  # most specific first
        if all(part in name for part in chip.split()):
            return table.get(dtype)
    return None


def training_flops(model: nn.Module, images: torch.Tensor) -> int:
    """FLOPs of one training step's forward + backward of ``model`` on ``images`` ``(B, 3, S, S)``.

    Use a meta-device model and meta images: nothing is computed or allocated.
    """
    return int(measure_flops(model, lambda: model(images), loss_fn=torch.Tensor.sum))


def backbone_flops(trainer: L.Trainer, pl_module: L.LightningModule, batch: int, backward: bool) -> int | None:
    """FLOPs of ``pl_module.build_backbone()`` on a ``(batch, 3, S, S)`` batch (``S`` = the datamodule's
    ``image_size``), forward only or forward + backward, counted on a meta-device copy (nothing computed or
    allocated). ``None`` when the module or datamodule does not say how to build it, or an op has no meta kernel /
    FLOP formula."""
    build = getattr(pl_module, "build_backbone", None)
    size = data_info(trainer).image_size
    if build is None or size is None:
        return None
    try:
        with torch.device("meta"):
            model = build()
            images = torch.empty(int(batch), 3, int(size), int(size))
        if backward:
            return training_flops(model, images)
        return int(measure_flops(model, lambda: model(images)))
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError):
        return None


_PRECISION_DTYPES: dict[str, torch.dtype] = {
    "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16, "16-mixed": torch.float16, "16-true": torch.float16,
    "32-true": torch.float32, "64-true": torch.float64,
}


def compute_dtype(precision: str) -> torch.dtype | None:
    """The matmul dtype of a Lightning ``Trainer.precision`` string (``bf16-mixed`` -> bfloat16); None if unknown."""
    return _PRECISION_DTYPES.get(str(precision))


def device_peak_flops(device: torch.device, precision: str) -> int | None:
    """Dense peak FLOP/s of ``device`` under ``precision`` (fp32 matmuls count as TF32 when enabled): this module's
    table, then Lightning's ``get_available_flops``; None on CPU or for an unknown chip."""
    if device.type != "cuda":
        return None
    dtype: torch.dtype | str | None = compute_dtype(precision)
    if dtype is None:
        return None
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        dtype = "tfloat32"
    peak = peak_flops(torch.cuda.get_device_name(device), dtype)
    return int(peak) if peak is not None else get_available_flops(device, dtype)


class ThroughputLogger(L.Callback):
    """Training throughput, FLOP/s and MFU to the loggers at log steps; a smoothed ``img/s`` on the progress bar.

    Args:
        window_size: log intervals in the ``Throughput`` window (metrics appear once it is full: after
            ``window_size`` log steps; 2 = the rate over the last interval).
        smoothing: EMA factor of the progress-bar ``img/s``.
        batch_size_fn: samples in a batch (default: ``batch[0].shape[0]``).
    """

    def __init__(
        self,
        window_size: int = 2,
        smoothing: float = 0.9,
        batch_size_fn: Callable[[Any], int] | None = None,
    ) -> None:
        if window_size < 2:
            raise ValueError(f"ThroughputLogger window_size must be >= 2 (a rate needs two clock readings), got "
                             f"{window_size}")
        self.window_size = window_size
        self.smoothing = smoothing
        self.batch_size_fn = batch_size_fn or (lambda batch: int(batch[0].shape[0]))
        self.meter: Throughput | None = None
        self.images_per_sec: float | None = None
        self._samples = self._batches = self._batches_logged = 0
        self._t0 = 0.0
        self._paused: float | None = None
        self._last: float | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            peak = device_peak_flops(trainer.strategy.root_device, trainer.precision)
            self.meter = Throughput(available_flops=peak, world_size=trainer.world_size, window_size=self.window_size)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after the module's own setup() validated the data / backbone pairing
        if not hasattr(pl_module, "flops_per_batch"):
            pl_module.flops_per_batch = self._measure(trainer, pl_module)

    @staticmethod
    def _measure(trainer: L.Trainer, pl_module: L.LightningModule) -> int | None:
        batch = data_info(trainer).batch_size
        return None if batch is None else backbone_flops(trainer, pl_module, int(batch), backward=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.meter is not None:
            self.meter.reset()
        self._samples = self._batches = self._batches_logged = 0
        self._t0 = time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last = None  # do not count the validation / epoch boundary as training time (progress bar)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._paused = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._paused is not None:
            self._t0 += time.perf_counter() - self._paused  # validation time is not training time
        self._paused = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        n = self.batch_size_fn(batch)
        self._samples += n
        self._batches += 1
        log_step = is_log_step(trainer)
        now = time.perf_counter()
        if self._last is not None and now > self._last:
            rate = n * trainer.world_size / (now - self._last)
            s = self.smoothing
            self.images_per_sec = rate if self.images_per_sec is None else s * self.images_per_sec + (1 - s) * rate
            # a float given to self.log becomes a device tensor read back after every batch: write the progress
            # bar's dict directly (a Python float), at log steps
            if log_step:
                trainer.progress_bar_metrics["img/s"] = round(self.images_per_sec, 1)
        self._last = now
        if log_step and self.meter is not None and trainer.is_global_zero:
            self._log(trainer, pl_module)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read the clock (after the device's queue drained) and log the meter's metrics, prefixed ``train/``."""
        assert self.meter is not None
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        per_batch = getattr(pl_module, "flops_per_batch", None)
        since = self._batches - self._batches_logged  # flops: per device, since the previous update
        self.meter.update(time=time.perf_counter() - self._t0, batches=self._batches, samples=self._samples,
                          flops=None if per_batch is None else per_batch * since)
        self._batches_logged = self._batches
        metrics = {f"train/{k}": v for k, v in self.meter.compute().items()}
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=trainer.global_step)
