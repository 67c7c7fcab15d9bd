"""``<run_dir>/config.yaml``: the resolved config of a run, written at setup; the trackers' ids beside it."""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger

from impulsevit.io import atomic_write_text
from impulsevit.training.trackers import log_hyperparams, log_text, record_trackers, run_directory

log = logging.getLogger("impulsevit")


class RunConfigSaver(SaveConfigCallback):
    """Writes the resolved config to ``<run_dir>/config.yaml`` at setup, atomically, overwriting an existing one.

    ``run_dir`` (the CLI passes its run directory) is where: it is the run's
    :func:`~impulsevit.training.trackers.run_directory`, whatever loggers the trainer has; without it, Lightning's
    ``trainer.log_dir``. At ``fit``, the W&B / MLflow run ids go to ``<run_dir>/trackers.json``
    (:func:`~impulsevit.training.trackers.record_trackers`) and the config, without the command's run-control keys, to
    every logger other than TensorBoard as hyperparameters (``config/...``).

    Lightning's :class:`SaveConfigCallback` does the rank-0 / once-only bookkeeping; this class uses its extension
    point (``save_to_log_dir=False`` plus :meth:`save_config`) for the two things it cannot do: an atomic write
    (through :mod:`impulsevit.io`; Lightning's ``parser.save`` writes in place) and the config as TensorBoard text
    (``config``). Overwriting is deliberate: a requeued / resumed job reuses its run directory (Lightning's default
    aborts there, Lightning#17115). The path is logged to the ``impulsevit`` logger. ``multifile`` is not supported.
    """

    # run-control keys of the command line, not the recipe: not sent to trackers as hyperparameters (MLflow refuses a
    # parameter that changes, as ``resume`` does between a run and its resumption)
    NOT_HYPERPARAMETERS = ("resume", "overwrite", "untrained", "ckpt_path", "config", "tracker", "tensorboard")

    def __init__(self, *args, save_to_log_dir: bool = False, run_dir: str | Path | None = None,
                 **kwargs) -> None:  # noqa: ANN002, ANN003
        self.run_dir = Path(run_dir) if run_dir is not None else None
        if save_to_log_dir:
            raise ValueError("RunConfigSaver writes <log_dir>/config.yaml itself (atomically); "
                             "save_to_log_dir=True is not supported")
        super().__init__(*args, save_to_log_dir=False, **kwargs)
        self._log_dir: str | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self.already_saved:  # in sync on all ranks (Lightning broadcasts it)
            # collective for a plain Trainer (broadcast from rank 0): every rank calls it, here
            self._log_dir = str(run_directory(trainer) or trainer.log_dir)
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Rank 0 only (Lightning's contract): the atomic write and the TensorBoard text."""
        if self._log_dir is None:
            return
        text = self.parser.dump(self.config, skip_none=False)
        path = Path(self._log_dir) / self.config_filename
        atomic_write_text(path, text)
        log.info("impulsevit: resolved config written to %s", path)
        tensorboard = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        log_text(tensorboard, "config", "    " + text.replace("\n", "\n    "), 0)
        others = [lg for lg in trainer.loggers if not isinstance(lg, TensorBoardLogger)]
        if stage == "fit" and others:
            record_trackers(Path(self._log_dir), trainer.loggers)
            config = yaml.safe_load(text) or {}
            log_hyperparams(others, {"config": {k: v for k, v in config.items() if k not in self.NOT_HYPERPARAMETERS}})
