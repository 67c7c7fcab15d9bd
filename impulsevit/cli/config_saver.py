"""``<run_dir>/config.yaml``: the resolved config of a run, written at setup."""

from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger

from impulsevit.checkpointing import atomic_write_text

log = logging.getLogger("impulsevit")


class RunConfigSaver(SaveConfigCallback):
    """Writes the resolved config to ``<run_dir>/config.yaml`` at setup, atomically, overwriting an existing one.

    Overwriting is deliberate: a requeued / resumed job reuses its run directory (Lightning's default aborts there,
    Lightning#17115). Rank 0 writes; the config is also logged to TensorBoard as text (``config``) and its path to the
    ``impulsevit`` logger. ``multifile`` is not supported.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir  # broadcast from rank 0 (collective: every rank calls it)
        if trainer.is_global_zero and log_dir is not None:
            text = self.parser.dump(self.config, skip_none=False)
            path = Path(log_dir) / self.config_filename
            atomic_write_text(path, text)
            log.info("impulsevit: resolved config written to %s", path)
            for lg in trainer.loggers:
                if isinstance(lg, TensorBoardLogger):
                    lg.experiment.add_text("config", "    " + text.replace("\n", "\n    "), global_step=0)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)
