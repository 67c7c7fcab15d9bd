"""The ``RunRecord`` callback: what a checkpoint must carry so that the model can be shared without its run directory.

Every checkpoint gets (as this callback's state, ``checkpoint["callbacks"]["RunRecord"]``) a plain dict, read by
``impulsevit export`` (:func:`impulsevit.tools.checkpoint_model.run_record`) for the model folder's ``config.json``
and model card:

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

Under ``impulsevit fit`` it also keeps ``<run>/run.json`` (:data:`SUMMARY_NAME`; global rank 0; atomic, through
:func:`impulsevit.io.atomic_write_json`), the run's state as plain JSON for ``impulsevit runs`` (which never opens a
checkpoint): written when training starts, after every validation and when the fit ends — ``state`` ``running``,
``finished`` (the training loop ended), ``preempted`` (SIGTERM / SIGUSR1 checkpoint), ``interrupted`` (Ctrl-C) or
``failed`` (with ``reason``: the exception's type and first line) — with ``epoch``, ``global_step``,
``total_steps``, ``max_epochs``, the last and best ``val/acc1``, ``wall_seconds``, ``backbone``, ``init_method``,
``recipes`` (the ``--recipe`` names of the command line), ``init_calibration`` (the init's calibration batch:
``images``, ``shape``, ``sha256``; ``null`` when the init took none), ``host`` / ``pid`` and ``updated`` (UTC).

A start that fails before training (a bad resume, unreadable data) leaves ``run.json`` as it was. A plain ``Trainer``
without the CLI's run directory writes none (it would land in the working directory; ``impulsevit runs`` only reads
runs directories).

Pure bookkeeping: it changes nothing in training. Not recorded: time spent in runs that died without a checkpoint;
``run.json`` of a process killed by SIGKILL keeps its last ``running`` state (``impulsevit runs`` reads the lock too).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from impulsevit.io import atomic_write_json
from impulsevit.training.trackers import cli_run_directory

__all__ = ["SUMMARY_NAME", "RunRecord", "device_description", "recipe_names"]

_PRETRAINED_KEYS = ("source", "sha256", "architecture")  # run.json's "pretrained": the init report's options

SUMMARY_NAME = "run.json"
_RECIPE_FLAGS = ("--recipe", "--config", "-c")


def recipe_names(argv: list[str]) -> list[str]:
    """The recipes a command line names (``--recipe X`` / ``--recipe=X`` / ``--config`` / ``-c``), as file stems."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in _RECIPE_FLAGS:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value:
                out.append(Path(value).stem if value.endswith((".yaml", ".yml")) else value)
    return out


def _one_line(exception: BaseException, limit: int = 200) -> str:
    text = str(exception).strip().splitlines()
    line = f"{type(exception).__name__}: {text[0]}" if text else type(exception).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


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

    from impulsevit._version import __version__

    versions = {"impulsevit": __version__, "timm": timm.__version__, "torch": torch.__version__,
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


def _init_calibration(trainer: L.Trainer) -> dict | None:
    """The calibration batch's identity in the init report of the trainer's ``Initializer`` (kept in its checkpointed
    state, so a resumed run still has it), or ``None``."""
    from impulsevit.callbacks.initializer import Initializer

    init = next((c for c in trainer.callbacks if isinstance(c, Initializer)), None)
    report = getattr(init, "report", None)
    return (report.options or {}).get("calibration") if report is not None else None


class RunRecord(L.Callback):
    """Records the run's data config, class names, metrics, cost and versions in every checkpoint (see module)."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}
        self._segment_start: float | None = None
        self._wall_before = 0.0
        self._training = False

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
        weights = getattr(pl_module, "weights_report", None)
        if weights is not None:  # a run started from model.pretrained: its source, kept through resumes
            self.record["pretrained"] = {k: weights.options.get(k) for k in _PRETRAINED_KEYS}
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

    # ------------------------------------------------------------------ run.json (see the module docstring)
    def write_summary(self, trainer: L.Trainer, pl_module: L.LightningModule, state: str,
                      reason: str | None = None) -> None:
        """Write ``<run>/run.json`` with ``state`` (global rank 0 only; only under the CLI, whose config writer holds
        the run directory)."""
        run_dir = cli_run_directory(trainer)
        if not trainer.is_global_zero or run_dir is None:
            return
        hparams = getattr(pl_module, "hparams", {}) or {}
        init = hparams.get("init") if hasattr(hparams, "get") else None
        method = init.get("method") if isinstance(init, dict) else getattr(init, "method", None)
        weights = getattr(pl_module, "weights_report", None)
        if hasattr(hparams, "get") and hparams.get("pretrained"):
            method = "from weights"
        total = trainer.estimated_stepping_batches if trainer.state.fn == "fit" and trainer.train_dataloader is \
            not None else None
        total_f = float(total) if total is not None else math.inf
        record = self.state_dict()
        summary = {
            "state": state, "reason": reason,
            "epoch": trainer.current_epoch, "max_epochs": trainer.max_epochs, "global_step": trainer.global_step,
            "total_steps": int(total_f) if math.isfinite(total_f) else None,
            "last_val_acc1": record.get("last_val_acc1"), "best_val_acc1": record.get("best_val_acc1"),
            "wall_seconds": record.get("wall_seconds"), "started": record.get("started"),
            "backbone": hparams.get("backbone") if hasattr(hparams, "get") else None,
            "init_method": method, "recipes": recipe_names(sys.argv[1:]),
            "pretrained": ({k: weights.options.get(k) for k in _PRETRAINED_KEYS} if weights is not None else
                           self.record.get("pretrained")),
            "init_calibration": _init_calibration(trainer),
            "host": socket.gethostname(), "pid": os.getpid(),
            "updated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        atomic_write_json(Path(run_dir) / SUMMARY_NAME, summary)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training = True
        self.write_summary(trainer, pl_module, "running")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        acc = trainer.callback_metrics.get("val/acc1")
        if acc is not None:
            acc = float(acc)
            best = self.record.get("best_val_acc1")
            self.record["last_val_acc1"] = acc
            self.record["best_val_acc1"] = acc if best is None else max(float(best), acc)
        self.write_summary(trainer, pl_module, "running")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write_summary(trainer, pl_module, "finished")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if trainer.state.fn != "fit" or not self._training:
            return  # a start that failed before training changes nothing in the run's record
        if isinstance(exception, KeyboardInterrupt) or (isinstance(exception, SystemExit) and exception.code == 130):
            state, reason = "interrupted", "SIGINT"
        elif isinstance(exception, SIGTERMException) or (isinstance(exception, SystemExit) and
                                                         exception.code in (0, 143, None)):
            state, reason = "preempted", "SIGUSR1 (requeued)" if isinstance(exception, SystemExit) and \
                exception.code == 0 else "SIGTERM"
        else:
            state, reason = "failed", _one_line(exception)
        with contextlib.suppress(OSError):  # a full disk must not hide the error being raised
            self.write_summary(trainer, pl_module, state, reason)
