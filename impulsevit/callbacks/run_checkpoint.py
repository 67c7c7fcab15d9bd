"""``RunCheckpoint``: Lightning's ``ModelCheckpoint`` with a ``last.ckpt`` that is always the newest state.

It also writes ``last.ckpt`` at the step where any callback sets ``trainer.should_stop`` (``max_time``, early stopping
mid-epoch, ...), so every graceful stop leaves a checkpoint to resume from. Its checkpoint entry is keyed by
``ModelCheckpoint.state_key`` (the class's qualified name ``RunCheckpoint`` and its monitor / mode / intervals, not its
module), the same key as when it lived in :mod:`impulsevit.training.checkpointing`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from impulsevit.training.checkpointing import RUN_KEY, checkpoint_dir, run_limits, save_checkpoint

__all__ = ["RunCheckpoint", "can_stop_now"]


def can_stop_now(trainer: Trainer) -> bool:
    """Whether the fit loop honours ``trainer.should_stop`` at this step: ``min_epochs`` and ``min_steps`` are met."""
    loop = trainer.fit_loop
    return (not loop.min_epochs or trainer.current_epoch >= loop.min_epochs) and \
        (not loop.min_steps or trainer.global_step >= loop.min_steps)


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` for the top-k checkpoints, whose ``last.ckpt`` always holds the newest state.

    ``last.ckpt`` (``save_last``) is written by this class, not by Lightning's ``ModelCheckpoint``: at the end of
    every training epoch (after that epoch's validation and top-k save, so it carries the updated top-k state), every
    ``every_n_train_steps`` optimizer steps, and at the step where a callback sets ``trainer.should_stop``
    (``max_time``, early stopping mid-epoch, ...) — each at most once per global step. A step whose ``last.ckpt`` is
    written gets no later top-k save (as in Lightning, one checkpoint state per step): after a mid-epoch stop the
    epoch-end hooks would otherwise save a top-k file whose loop state reads "epoch finished", newer than
    ``last.ckpt``, and ``--resume auto`` would skip the rest of the interrupted epoch.

    What the stock part lacks: Lightning 2.6 writes ``last.ckpt`` only when a top-k checkpoint was saved at the same
    step, so an epoch whose monitored metric did not improve leaves ``last.ckpt`` behind (a resume would silently redo
    that epoch); a step-interval save is deferred until the monitored ``val/*`` metric exists; a mid-epoch stop ends
    without a checkpoint; and ``fast_dev_run`` still writes ``last.ckpt`` at the end of training. Only public members
    of ``ModelCheckpoint`` and ``Trainer.save_checkpoint`` are used. Top-k selection is Lightning's, unchanged.
    Sanity checks, ``fast_dev_run`` and non-fit stages never save ``last.ckpt``. Every checkpoint the trainer saves
    carries the run's limits (:func:`run_limits`), so ``--resume auto`` skips those of smoke runs.

    Not supported: ``save_last="link"`` (a symlink to the newest top-k file; ``last.ckpt`` is always a full copy here).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        """Lightning's ``ModelCheckpoint`` arguments; ``save_last`` (a bool) turns on this class's ``last.ckpt``."""
        if save_last == "link":
            raise ValueError("checkpoint.save_last='link' is not supported: last.ckpt is always a full checkpoint")
        super().__init__(
            dirpath=dirpath, filename=filename, monitor=monitor, verbose=verbose, save_last=False,
            save_top_k=save_top_k, save_on_exception=save_on_exception, save_weights_only=save_weights_only,
            mode=mode, auto_insert_metric_name=auto_insert_metric_name, every_n_train_steps=every_n_train_steps,
            train_time_interval=train_time_interval, every_n_epochs=every_n_epochs,
            save_on_train_epoch_end=save_on_train_epoch_end, enable_version_counter=enable_version_counter,
        )
        self.keep_last = bool(save_last)
        self.last_every_n_train_steps = int(every_n_train_steps or 0)
        self._last_step: int | None = None  # global step of the last.ckpt this process wrote

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[RUN_KEY] = run_limits(trainer)

    def write_last(self, trainer: Trainer) -> None:
        """Write ``<dirpath>/last.ckpt`` through :func:`impulsevit.training.checkpointing.save_checkpoint` (every rank:
        a collective) unless it already holds this global step, or saving is off (sanity check, ``fast_dev_run``, not
        fitting)."""
        if not self.keep_last or trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != "fit":
            return
        if self._last_step == trainer.global_step:
            return
        path = str(save_checkpoint(trainer, Path(self.dirpath or checkpoint_dir(trainer))
                                   / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}", "last",
                                   weights_only=self.save_weights_only))
        self.last_model_path, self._last_step = path, trainer.global_step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        n = self.last_every_n_train_steps
        if (n >= 1 and trainer.global_step % n == 0) or (trainer.should_stop and can_stop_now(trainer)):
            # a stop asked by a callback (Timer for max_time, a user's rule): the loops leave after this step without
            # reaching the end-of-epoch save, so save here, at a step boundary. Lightning runs checkpoint callbacks
            # after all others, so a flag set in this hook is seen.
            self.write_last(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._last_step != trainer.global_step:
            super().on_train_epoch_end(trainer, pl_module)
        self.write_last(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._last_step != trainer.global_step:
            super().on_validation_end(trainer, pl_module)
