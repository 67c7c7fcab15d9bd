"""Throughput: images/s on the progress bar; images/s per device, FLOP/s and MFU (GPU) to the loggers.

``ThroughputLogger`` is Lightning's ``ThroughputMonitor`` (which logs ``train/device/samples_per_sec``,
``train/samples_per_sec``, ``train/device/flops_per_sec`` and, when the device's peak is known, ``train/device/mfu``
every ``log_every_n_steps`` once its window is full) with one change and some additions:

- training is timed at log steps only: Lightning's monitor calls ``torch.cuda.synchronize()`` after every batch
  (for an exact clock), which stalls the host each step and, on rank 0 only, makes rank 0 the straggler of every
  gradient all-reduce. Here the samples and batches are counted every batch on the host, and the clock is read
  (after a synchronize) only at the steps that log; ``window_size`` counts log intervals (rates are averaged over
  the last ``window_size - 1`` intervals). Validation keeps Lightning's per-batch timing;

- ``flops_per_batch`` measured once per fit with ``torch.utils.flop_counter`` on a meta-device copy of the backbone
  (forward + backward of one training batch; no memory, no compute), when the module offers ``build_backbone()``;
- peak FLOP/s for chips Lightning's table misses or cannot match by name: ``torch.cuda.get_device_name`` says
  ``NVIDIA H200`` for the SXM part, which Lightning 2.6 does not map (Lightning#20660). Values here are **dense**
  (no 2:4 sparsity) datasheet numbers, the convention MFU uses;
- a smoothed global images/s shown on the progress bar (``img/s``; host-side timing between batch ends, no
  synchronisation: on a GPU it follows the rate at which the host enqueues steps, which equals the device's rate once
  the queue is full).

Not supported: MFU on CPU (no peak known); variable batch sizes (the ``ThroughputMonitor`` assumption).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.callbacks import ThroughputMonitor
from torch import nn

__all__ = ["ThroughputLogger", "peak_flops", "training_flops", "DENSE_PEAK_FLOPS"]

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


class ThroughputLogger(ThroughputMonitor):
    """Lightning's ``ThroughputMonitor`` for ``(images, labels)`` batches, with FLOPs, H200 peaks and ``img/s``.

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
        super().__init__(batch_size_fn=batch_size_fn or (lambda batch: int(batch[0].shape[0])), window_size=window_size)
        self.smoothing = smoothing
        self._last: float | None = None
        self.images_per_sec: float | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        device = trainer.strategy.root_device
        if self.available_flops is None and device.type == "cuda":
            from lightning.fabric.utilities.throughput import _plugin_to_compute_dtype

            dtype = _plugin_to_compute_dtype(trainer.precision_plugin)
            if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
                dtype = "tfloat32"
            peak = peak_flops(torch.cuda.get_device_name(device), dtype)
            if peak is not None:
                self.available_flops = int(peak)
                for tp in self._throughputs.values():
                    tp.available_flops = self.available_flops

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after the module's own setup() validated the data / backbone pairing
        if not hasattr(pl_module, "flops_per_batch"):
            pl_module.flops_per_batch = self._measure(trainer, pl_module)

    @staticmethod
    def _measure(trainer: L.Trainer, pl_module: L.LightningModule) -> int | None:
        build = getattr(pl_module, "build_backbone", None)
        dm = trainer.datamodule
        size, batch = getattr(dm, "image_size", None), getattr(dm, "batch_size", None)
        if build is None or size is None or batch is None:
            return None
        try:
            with torch.device("meta"):
                model = build()
                images = torch.empty(int(batch), 3, int(size), int(size))
            return training_flops(model, images)
        except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError):
            return None  # an op without a meta kernel / FLOP formula: log throughput without FLOPs

    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        from lightning.pytorch.trainer.states import RunningStage

        stage = trainer.state.stage
        if stage == RunningStage.TRAINING and not trainer._logger_connector.should_update_logs:
            # count on the host only; the clock (and its device synchronize) waits for the next log step
            if self.length_fn is not None:
                self._lengths[stage] += self.length_fn(batch)
            self._samples[stage] += self.batch_size_fn(batch)
            self._batches[stage] += 1
            return
        super()._update(trainer, pl_module, batch, iter_num)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        now = time.perf_counter()
        if self._last is not None and now > self._last:
            rate = self.batch_size_fn(batch) * trainer.world_size / (now - self._last)
            s = self.smoothing
            self.images_per_sec = rate if self.images_per_sec is None else s * self.images_per_sec + (1 - s) * rate
            # a float given to self.log becomes a device tensor read back after every batch: write the progress
            # bar's dict directly (a Python float), at log steps
            if trainer._logger_connector.should_update_logs:
                trainer.progress_bar_metrics["img/s"] = round(self.images_per_sec, 1)
        self._last = now

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last = None  # do not count the validation / epoch boundary as training time
