"""``NonFiniteLossGuard``: stop training on a NaN/inf loss, after saving the last good state.

The check runs in ``on_before_backward``, i.e. after the forward of a step and before its backward and optimizer
step, so the weights still hold the last good state. All ranks take the decision together (any rank non-finite ->
all stop), then every rank calls ``trainer.save_checkpoint`` on ``<checkpoint dir>/last_good.ckpt`` (written to a
temporary name and renamed by rank 0, so a crash never leaves a half-written file under the final name) and raises
``FloatingPointError`` naming the step, the epoch and the loss value.

The checkpoint directory is the ``ModelCheckpoint``'s ``dirpath`` (the CLI's ``<runs-dir>/<name>/checkpoints/``),
else ``<default_root_dir>/checkpoints``. The saved loop state is mid-step (the failing batch counts as started, not
completed); it is meant for inspecting / restarting from the good weights, e.g. with a lower lr.
Two ways to check (``check``):

- ``"every_step"`` (the default on CPU, where reading a value costs nothing): the loss is read and the decision
  all-reduced before each backward, so the saved ``last_good.ckpt`` is the state right before the bad step.
- ``"next_step"`` (the default on GPUs): the check must not stall the device queue. Each micro-batch's
  ``isfinite`` flag is max-reduced across ranks with an asynchronous collective and copied into pinned host memory
  without blocking; the flag is read (a host-memory read, no device synchronisation) at the next micro-batch, when
  the copy has long finished (a CUDA event confirms it). A non-finite loss is therefore found one step late: the
  bad step's update has been applied, so no ``last_good.ckpt`` is written — the error names the first bad step;
  restart from the run's last regular checkpoint. The last micro-batch of the fit is checked at ``on_train_end``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist

from impulsevit.checkpointing import checkpoint_dir, is_distributed_checkpoint
from impulsevit.io import commit, remove, temp_path

__all__ = ["NonFiniteLossGuard"]


class NonFiniteLossGuard(L.Callback):
    """Raise ``FloatingPointError`` at the first non-finite training loss, after saving ``last_good.ckpt``.

    Args:
        filename: checkpoint file name inside the run's checkpoint directory.
        save: save the last good state before raising (``every_step`` checks only).
        check: ``"every_step"``, ``"next_step"`` or ``"auto"`` (``next_step`` on CUDA, ``every_step`` elsewhere).
    """

    def __init__(self, filename: str = "last_good.ckpt", save: bool = True, check: str = "auto") -> None:
        if check not in ("auto", "every_step", "next_step"):
            raise ValueError(f"NonFiniteLossGuard check must be 'auto', 'every_step' or 'next_step', got {check!r}")
        self.filename = filename
        self.save = save
        self.check = check
        self.saved_path: Path | None = None
        self._pending: tuple[torch.Tensor, object, str] | None = None  # (host flag, cuda event | None, where)

    def _mode(self, trainer: L.Trainer) -> str:
        if self.check != "auto":
            return self.check
        return "next_step" if trainer.strategy.root_device.type == "cuda" else "every_step"

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self._mode(trainer) == "next_step":
            self._check_previous(trainer)
            self._launch(trainer, loss)
            return
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
                commit(tmp, path, replace_dir=is_distributed_checkpoint(path))
            trainer.strategy.barrier("nan_guard_renamed")
            self.saved_path = path
            msg += f"; the last good state (before this step) is saved in {path}"
        raise FloatingPointError(msg + ". Lower the lr, enable gradient clipping, or check the data.")

    # ------------------------------------------------------------------ next_step mode
    def _launch(self, trainer: L.Trainer, loss: torch.Tensor) -> None:
        """Start this micro-batch's check: device flag -> async max all-reduce -> non-blocking copy to pinned host."""
        flag = (~torch.isfinite(loss.detach()).all()).to(torch.int32).reshape(1)
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True).wait()  # on NCCL: a stream dependency only
        cuda = flag.device.type == "cuda"
        host = torch.empty(1, dtype=torch.int32, pin_memory=cuda)
        host.copy_(flag, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        where = f"at optimizer step {trainer.global_step} (epoch {trainer.current_epoch}, batch " \
                f"{trainer.fit_loop.epoch_loop.batch_idx})"
        self._pending = (host, event, where)

    def _check_previous(self, trainer: L.Trainer) -> None:
        if self._pending is None:
            return
        host, event, where = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()  # recorded a whole step ago: already complete, returns at once
        if int(host.numpy()[0]):  # pinned host memory: no device read
            raise FloatingPointError(
                f"non-finite training loss {where} (on at least one rank), found one step later (check='next_step'): "
                "that step's update was applied, no last-good checkpoint was written; restart from the run's last "
                "checkpoint. Lower the lr, enable gradient clipping, or check the data.")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_previous(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_previous(trainer)

