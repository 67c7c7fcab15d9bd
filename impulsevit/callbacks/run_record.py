"""The ``RunRecord`` callback: what a checkpoint must carry so that the model can be shared without its run directory.

Every checkpoint gets (as this callback's state, ``checkpoint["callbacks"]["RunRecord"]``) a plain dict, read by
``impulsevit export`` (:func:`impulsevit.export.run_record`) for the model folder's ``config.json`` and model card:

- ``data_config``: the evaluation transform the run used, in timm's terms (``input_size`` ``[3, S, S]``, ``mean`` /
  ``std`` on the 0–1 scale, ``interpolation``, ``crop_pct``, ``crop_mode``), from the datamodule's
  :meth:`~impulsevit.data.loading.base.BaseImageDataModule.eval_data_config`;
- ``class_names``: the dataset's class names, index = label (None when the datamodule does not know them);
- ``dataset``: a short description of the data (registry name and splits);
- ``metrics``: the latest validation metrics (``val/*``, ``val_ema/*``) and the training epoch metrics, as floats;
- ``seed`` (``seed_everything``), ``commands`` (the ``impulsevit fit`` command line of each segment of the run, a
  resume adds one; empty for in-process runs),
  ``wall_seconds`` (training wall time summed over the run's resumed segments), ``device`` (accelerator, count and
  name), ``strategy``, ``versions`` (impulsevit, timm, torch, lightning) and ``started`` (UTC, first segment).

Pure bookkeeping: it changes nothing in training. Not recorded: time spent in runs that died without a checkpoint.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import shlex
import sys
import time
from typing import Any

import lightning as L
import torch

__all__ = ["RunRecord", "device_description"]


def device_description(trainer: L.Trainer) -> str:
    """``"<n> x <device name>"`` of the run (GPU name, or the CPU model and its core count)."""
    root = trainer.strategy.root_device
    if root.type == "cuda":
        name = torch.cuda.get_device_name(root)
    else:
        name = platform.processor() or platform.machine() or root.type
        name = f"{root.type} ({name}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    nodes = getattr(trainer, "num_nodes", 1)
    per = f"{trainer.num_devices} x {name}"
    return f"{nodes} nodes x {per}" if nodes > 1 else per


def _versions() -> dict[str, str]:
    import timm

    import impulsevit

    versions = {"impulsevit": impulsevit.__version__, "timm": timm.__version__, "torch": torch.__version__,
                "lightning": L.__version__, "python": platform.python_version()}
    return {k: str(v) for k, v in versions.items()}  # plain str: torch's TorchVersion breaks weights_only loading


def _float_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not key.startswith(("val/", "val_ema/", "train/")):
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            out[key] = v
    return out


class RunRecord(L.Callback):
    """Records the run's data config, class names, metrics, cost and versions in every checkpoint (see module)."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}
        self._segment_start: float | None = None
        self._wall_before = 0.0

    @property
    def state_key(self) -> str:
        return "RunRecord"

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._segment_start = time.monotonic()
        dm = trainer.datamodule
        data_config = dm.eval_data_config() if hasattr(dm, "eval_data_config") else None
        args = sys.argv[1:]
        self.record.update({
            "data_config": data_config,
            "class_names": list(getattr(dm, "class_names", None) or []) or None,
            "dataset": dm.describe() if hasattr(dm, "describe") else type(dm).__name__ if dm is not None else None,
            "seed": int(os.environ["PL_GLOBAL_SEED"]) if os.environ.get("PL_GLOBAL_SEED") else None,
            "commands": [*self.record.get("commands", []), *([shlex.join(["impulsevit", *args])]
                                                            if args and args[0] == "fit" else [])],
            "device": device_description(trainer),
            "strategy": type(trainer.strategy).__name__,
            "precision": str(trainer.precision),
            "versions": _versions(),
        })
        self.record.setdefault("started", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))

    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "_trainer", None)
        if trainer is not None:
            self.record["metrics"] = {**self.record.get("metrics", {}), **_float_metrics(trainer.callback_metrics)}
        elapsed = time.monotonic() - self._segment_start if self._segment_start is not None else 0.0
        return {**self.record, "wall_seconds": round(self._wall_before + elapsed, 1)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.record = {k: v for k, v in state_dict.items() if k != "wall_seconds"}
        self._wall_before = float(state_dict.get("wall_seconds") or 0.0)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer
