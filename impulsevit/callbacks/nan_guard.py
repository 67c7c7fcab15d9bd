"""``NonFiniteLossGuard``: stop training at the first non-finite loss, gradient or weight; never checkpoint one.

A finite but huge loss can give an update to NaN / inf weights, so the loss alone is not enough. Three things are
checked per micro-batch: the loss (``on_before_backward``), the gradients before the optimizer step
(``on_before_optimizer_step``; skipped under a ``GradScaler``, whose inf gradients are routine and whose step is then
skipped) and the weights after it (``on_train_batch_end``; a norm per tensor through one fused kernel,
:func:`impulsevit._compat.torch.foreach_norm`, so a
weight whose norm overflows float counts as non-finite too). All ranks take the decision together (any rank bad ->
all stop).

Two ways to check (``check``):

- ``"every_step"`` (the default on CPU, where reading a value costs nothing): each check is read at once. A bad loss
  or bad gradients stop the step before its update: every rank calls ``trainer.save_checkpoint`` on
  ``<checkpoint dir>/last_good.ckpt`` (written to a temporary name and renamed by rank 0), the state right before the
  bad step (mid-step loop state: the failing batch counts as started). Bad weights after an update (finite gradients
  that still overflowed the weights) leave no pre-step state: the good checkpoint is the run's newest one.
- ``"next_step"`` (the default on GPUs): the checks must not stall the device queue. The micro-batch's three flags are
  folded into one device tensor, max-reduced across ranks with an asynchronous collective and copied into pinned host
  memory without blocking; it is read (a host-memory read, no device synchronisation) at the next micro-batch, when
  the copy has long finished (a CUDA event confirms it). A bad step is therefore found one step late, its update
  applied; no ``last_good.ckpt`` is written. The last micro-batch of an epoch is checked at ``on_train_epoch_end``.

Every checkpoint, from any writer (``RunCheckpoint``, ``ModelCheckpoint``, ``SlurmRequeue``, the guard's own), passes
``on_save_checkpoint``: the pending flag is read there (a checkpoint reads the device anyway) and the weights about to
be written are checked; a non-finite state stops the run before the file is written, so ``last.ckpt``, the top-k files
and the preemption checkpoint always hold the last finite state.

The stop is a :class:`~impulsevit.errors.TrainingDiverged` (a ``FloatingPointError``; the CLI prints it as one line,
exit 1) naming the step and the checkpoint to resume from (``last_good.ckpt``, else the newest complete checkpoint of
the run). The checkpoint directory is the ``ModelCheckpoint``'s ``dirpath`` (the CLI's
``<runs-dir>/<name>/checkpoints/``), else ``<default_root_dir>/checkpoints``.

Not supported: manual optimization (only the loss and weight checks run); buffers other than the state dict's floating
point tensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from impulsevit._compat.torch import foreach_norm
from impulsevit.errors import TrainingDiverged
from impulsevit.training.checkpointing import checkpoint_dir, latest_checkpoint, save_checkpoint

__all__ = ["NonFiniteLossGuard", "nonfinite_flag"]

_ADVICE = "Lower the lr, enable gradient clipping, or check the data."


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor (FSDP2): this rank's shard; the decision is reduced over ranks
    return to_local() if callable(to_local) else t


def nonfinite_flag(tensors: Iterable[torch.Tensor | None]) -> torch.Tensor | None:
    """A 0-d bool device tensor: whether any floating-point tensor of ``tensors`` holds a NaN / inf (or has a float32
    norm beyond the float32 range, ~3.4e38). Nothing is read back from the device. None when there is no
    floating-point tensor."""
    ts = [_local(t.detach()) for t in tensors if t is not None and t.is_floating_point()]
    ts = [t for t in ts if t.numel()]
    if not ts:
        return None
    norms = foreach_norm(ts, dtype=torch.float32)  # float32 results: a 16-bit norm overflows at 65504
    device = norms[0].device  # a state dict may mix devices (a CPU buffer): the flag lives on the first one's
    return ~torch.isfinite(torch.stack([n.to(device) for n in norms])).all()


def _either(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None or b is None:
        return a if b is None else b
    return a | b.to(a.device)


class NonFiniteLossGuard(L.Callback):
    """Raise :class:`~impulsevit.errors.TrainingDiverged` at the first non-finite loss, gradient or weight, after
    saving ``last_good.ckpt`` where the pre-step state still exists; refuse to write a non-finite checkpoint.

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
        self._flag: torch.Tensor | None = None  # this micro-batch's device flag (next_step mode), not yet launched
        self._pending: tuple[torch.Tensor, object, str] | None = None  # (host flag, cuda event | None, where)
        self._step_where: str | None = None  # where the current micro-batch started (before its update)

    def _mode(self, trainer: L.Trainer) -> str:
        if self.check != "auto":
            return self.check
        return "next_step" if trainer.strategy.root_device.type == "cuda" else "every_step"

    def _where(self, trainer: L.Trainer) -> str:
        """The current micro-batch: its optimizer step as counted before its update."""
        return self._step_where or (f"at optimizer step {trainer.global_step} (epoch {trainer.current_epoch}, batch "
                                    f"{trainer.fit_loop.epoch_loop.batch_idx})")

    def _good_checkpoint(self, trainer: L.Trainer) -> Path | None:
        if self.saved_path is not None:
            return self.saved_path
        folder = checkpoint_dir(trainer)
        return latest_checkpoint(folder.parent, extra_dirs=(folder,))

    def _fail(self, trainer: L.Trainer, what: str) -> None:
        good = self._good_checkpoint(trainer)
        resume = (f"resume from the last good checkpoint with --resume {good}" if good is not None else
                  "no checkpoint of this run holds a good state yet")
        raise TrainingDiverged(f"training diverged: {what}; no checkpoint with these values was written; {resume}. "
                               f"{_ADVICE}")

    def _decide(self, trainer: L.Trainer, flag: torch.Tensor | None) -> bool:
        """Read ``flag`` now (every_step mode) and agree across ranks."""
        return bool(trainer.strategy.reduce_boolean_decision(bool(flag) if flag is not None else False, all=False))

    # ------------------------------------------------------------------ the three checks
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        flag = nonfinite_flag([loss])
        if self._mode(trainer) == "next_step":
            self._check_previous(trainer)
        self._step_where = None  # a new micro-batch: where it starts, as counted before its update
        self._step_where = self._where(trainer)
        if self._mode(trainer) == "next_step":
            self._flag = flag
            return
        if self._decide(trainer, flag):
            value = float(loss.detach().float().cpu()) if flag is not None and bool(flag) else None
            self._stop_before_update(trainer, f"non-finite training loss "
                                              f"{value if value is not None else '(on another rank)'}")

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return  # GradScaler: inf gradients make it skip the step and lower the scale, they are not a failure
        flag = nonfinite_flag(p.grad for p in pl_module.parameters())
        if self._mode(trainer) == "next_step":
            self._flag = _either(self._flag, flag)
        elif self._decide(trainer, flag):
            self._stop_before_update(trainer, "non-finite gradients")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        flag = nonfinite_flag(pl_module.parameters())
        if self._mode(trainer) == "next_step":
            self._launch(trainer, _either(self._flag, flag))
            self._flag = None
        elif self._decide(trainer, flag):
            self._fail(trainer, f"non-finite weights after the update {self._where(trainer)}")
        self._step_where = None

    def _stop_before_update(self, trainer: L.Trainer, what: str) -> None:
        """every_step mode, before the update: save the current (good) state as ``last_good.ckpt``, then stop."""
        what = f"{what} {self._where(trainer)}"
        if self.save:
            path = save_checkpoint(trainer, checkpoint_dir(trainer) / self.filename, "nan-guard")
            self.saved_path = path
            what += " (the state before this step is saved)"
        self._fail(trainer, what)

    # ------------------------------------------------------------------ next_step mode
    def _launch(self, trainer: L.Trainer, flag: torch.Tensor | None) -> None:
        """Start this micro-batch's check: device flag -> async max all-reduce -> non-blocking copy to pinned host."""
        if flag is None:
            return
        flag = flag.to(torch.int32).reshape(1)
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True).wait()  # on NCCL: a stream dependency only
        cuda = flag.device.type == "cuda"
        host = torch.empty(1, dtype=torch.int32, pin_memory=cuda)
        host.copy_(flag, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        self._pending = (host, event, self._where(trainer))

    def _check_previous(self, trainer: L.Trainer) -> None:
        if self._pending is None:
            return
        host, event, where = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()  # recorded a whole step ago: already complete, returns at once
        if int(host.numpy()[0]):  # pinned host memory: no device read
            self._fail(trainer, f"non-finite loss, gradients or weights {where} (on at least one rank), found one "
                                "step later (check='next_step'), its update applied")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_previous(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_previous(trainer)

    # ------------------------------------------------------------------ every checkpoint writer
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Called on every rank inside every ``trainer.save_checkpoint``, before the file is written: stop instead of
        writing a non-finite state."""
        if trainer.sanity_checking:
            return
        self._check_previous(trainer)
        state = checkpoint.get("state_dict") or {}
        if self._decide(trainer, nonfinite_flag(state.values())):
            bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(_local(v)).all()]
            self._fail(trainer, f"non-finite weights {self._where(trainer)} ({len(bad)} tensor(s), first: "
                                f"{bad[0] if bad else 'on another rank'}), found when saving a checkpoint")
