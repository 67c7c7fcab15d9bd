"""``NonFiniteLossGuard``: stop training on a NaN/inf loss, after saving the last good state.

The check runs in ``on_before_backward``, i.e. after the forward of a step and before its backward and optimizer
step, so the weights still hold the last good state. All ranks take the decision together (any rank non-finite ->
all stop), then every rank calls ``trainer.save_checkpoint`` on ``<checkpoint dir>/last_good.ckpt`` (written to a
temporary name and renamed by rank 0, so a crash never leaves a half-written file under the final name) and raises
``FloatingPointError`` naming the step, the epoch and the loss value.

The checkpoint directory is the ``ModelCheckpoint``'s ``dirpath`` (the CLI's ``<runs-dir>/<name>/checkpoints/``),
else ``<default_root_dir>/checkpoints``. The saved loop state is mid-step (the failing batch counts as started, not
completed); it is meant for inspecting / restarting from the good weights, e.g. with a lower lr.
Cost: one ``isfinite`` + one boolean all-reduce per micro-batch (a host sync).
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from impulsevit.io import commit, remove, temp_path

__all__ = ["NonFiniteLossGuard", "checkpoint_dir"]


def checkpoint_dir(trainer: L.Trainer) -> Path:
    """Where the run's checkpoints live: the ModelCheckpoint's ``dirpath``, else ``<default_root_dir>/checkpoints``."""
    cb = trainer.checkpoint_callback
    dirpath = getattr(cb, "dirpath", None) if cb is not None else None
    return Path(dirpath) if dirpath else Path(trainer.default_root_dir) / "checkpoints"


class NonFiniteLossGuard(L.Callback):
    """Raise ``FloatingPointError`` at the first non-finite training loss, after saving ``last_good.ckpt``.

    Args:
        filename: checkpoint file name inside the run's checkpoint directory.
        save: save the last good state before raising.
    """

    def __init__(self, filename: str = "last_good.ckpt", save: bool = True) -> None:
        self.filename = filename
        self.save = save
        self.saved_path: Path | None = None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        bad_here = not bool(torch.isfinite(loss.detach()).all())
        bad = trainer.strategy.reduce_boolean_decision(bad_here, all=False)
        if not bad:
            return
        step, epoch = trainer.global_step, trainer.current_epoch
        where = f"at optimizer step {step} (epoch {epoch}, batch {trainer.fit_loop.epoch_loop.batch_idx})"
        value = float(loss.detach().float().cpu()) if bad_here else None
        msg = f"non-finite training loss {value if bad_here else '(on another rank)'} {where}"
        if self.save:
            path = checkpoint_dir(trainer) / self.filename
            tmp = temp_path(path, "nan-guard")  # one name on every rank
            if trainer.global_rank == 0:
                path.parent.mkdir(parents=True, exist_ok=True)
                remove(tmp)
            trainer.strategy.barrier("nan_guard_prepare")
            trainer.save_checkpoint(str(tmp))
            trainer.strategy.barrier("nan_guard_saved")
            if trainer.global_rank == 0:
                commit(tmp, path)
            trainer.strategy.barrier("nan_guard_renamed")
            self.saved_path = path
            msg += f"; the last good state (before this step) is saved in {path}"
        raise FloatingPointError(msg + ". Lower the lr, enable gradient clipping, or check the data.")
