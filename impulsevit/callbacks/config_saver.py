"""``<run_dir>/config.yaml``: the resolved config of a run, written at setup."""

from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger

from impulsevit.io import atomic_write_text

log = logging.getLogger("impulsevit")


class RunConfigSaver(SaveConfigCallback):
    """Writes the resolved config to ``<run_dir>/config.yaml`` at setup, atomically, overwriting an existing one.

    Lightning's :class:`SaveConfigCallback` does the rank-0 / once-only bookkeeping; this class uses its extension
    point (``save_to_log_dir=False`` plus :meth:`save_config`) for the two things it cannot do: an atomic write
    (through :mod:`impulsevit.io`; Lightning's ``parser.save`` writes in place) and the config as TensorBoard text
    (``config``). Overwriting is deliberate: a requeued / resumed job reuses its run directory (Lightning's default
    aborts there, Lightning#17115). The path is logged to the ``impulsevit`` logger. ``multifile`` is not supported.
    """

    def __init__(self, *args, save_to_log_dir: bool = False, **kwargs) -> None:  # noqa: ANN002, ANN003
        if save_to_log_dir:
            raise ValueError("RunConfigSaver writes <log_dir>/config.yaml itself (atomically); "
                             "save_to_log_dir=True is not supported")
        super().__init__(*args, save_to_log_dir=False, **kwargs)
        self._log_dir: str | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self.already_saved:  # in sync on all ranks (Lightning broadcasts it)
            self._log_dir = trainer.log_dir  # collective (broadcast from rank 0): every rank calls it, here
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Rank 0 only (Lightning's contract): the atomic write and the TensorBoard text."""
        if self._log_dir is None:
            return
        text = self.parser.dump(self.config, skip_none=False)
        path = Path(self._log_dir) / self.config_filename
        atomic_write_text(path, text)
        log.info("impulsevit: resolved config written to %s", path)
        for lg in trainer.loggers:
            if isinstance(lg, TensorBoardLogger):
                lg.experiment.add_text("config", "    " + text.replace("\n", "\n    "), global_step=0)
