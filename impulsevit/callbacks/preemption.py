"""Preemption-safe SLURM requeue: checkpoint at the next step boundary on USR1/TERM/INT, then ``scontrol requeue``.

Why not Lightning's own handler: with ``SLURMEnvironment(auto_requeue=True)`` Lightning 2.6 saves the HPC checkpoint
*inside* the USR1 signal handler (``_SignalConnector._slurm_sigusr_handler_fn``). A handler runs between any two
bytecodes — in the middle of a backward pass, an optimizer step or a collective — so the checkpoint can be
inconsistent, and under DDP the handler's ``save_checkpoint`` barrier interleaves with the ranks' gradient all-reduces
and can hang (Lightning#21406; the fix proposed in #21407 is what this callback does). There must be exactly one
requeue owner (a second handler would requeue twice or fight over signals, Lightning#14893/#6389), so this callback
sets the detected ``SLURMEnvironment.auto_requeue = False`` in ``setup`` — before Lightning registers its handlers,
which it then skips for USR1 — and owns requeueing itself. Lightning keeps its SIGTERM bookkeeping
(``trainer.received_sigterm``).

What it does:

- ``setup`` (fit only): takes over requeueing as above; installs handlers for ``SIGUSR1`` (requeue), ``SIGTERM``
  and ``SIGINT`` (stop) that only set a flag (async-signal-safe: no I/O, no locks); warns once when running under
  SLURM without ``scontrol`` on PATH (common inside containers, Lightning#21404): the checkpoint is still written,
  the job is not requeued.
- ``on_train_batch_end`` — the step boundary where Lightning's own ``ModelCheckpoint(every_n_train_steps)`` saves: on
  one rank the flag is a Python int (nothing to read from the device); on several ranks it is max-reduced over ranks
  every ``check_every_n_steps`` optimizer steps (default: ``trainer.log_every_n_steps``, the steps that read the
  device for logging anyway; a scalar collective and a host read, kept off the other steps; every
  rank takes the same decision at the same step even if the signal reached only some ranks), then all ranks save
  ``<checkpoints>/preempted.ckpt`` through
  ``trainer.save_checkpoint`` into a temp name that rank 0 renames into place (atomic for files and for FSDP2
  distributed-checkpoint folders).
- USR1: rank 0 runs ``scontrol requeue $SLURM_JOB_ID`` (``<array job>_<task>`` for arrays); after a successful
  requeue every rank leaves at the next ``on_train_batch_start`` (or ``on_validation_start`` / epoch end), i.e. after
  Lightning has logged the step, by raising :class:`Preempted` — so the TensorBoard curve has neither a gap nor a
  duplicate when the requeued job resumes. If the requeue fails or there is no ``scontrol``, training continues (the
  job may still finish within the signal lead time; if it is killed, the checkpoint is there).
- TERM: the same checkpoint, then every rank leaves (exit code 143: :class:`Preempted`, or Lightning's own
  ``SIGTERMException``, which ``impulsevit.cli.main`` maps to 143). A SIGTERM that Lightning turns into
  ``SIGTERMException`` before this callback saw it (e.g. during validation) still gets a checkpoint from
  ``on_exception``.
- INT (Ctrl-C): the same checkpoint at the next step boundary, then every rank leaves with exit code 130; a second
  Ctrl-C stops at once (:class:`InterruptedAgain`: no checkpoint of that step, one line, exit code 130).

The checkpoint carries the loaders' position (:mod:`impulsevit.data.loading.sampling`) and every rank's RNG state
(:class:`~impulsevit.callbacks.rng_state.RNGStateCheckpoint`), so ``--resume auto`` continues bit-exactly.
- ``on_train_start``: on a resumed run, reports the checkpoint and the restored global step.

Every action is printed (rank 0, stderr) and appended to the run's ``slurm/events.log``
(``$IMPULSEVIT_EVENTS_LOG``, set by the generated batch script; ``<default_root_dir>/slurm/events.log`` otherwise).

A SIGTERM during the fit's validation: Lightning stops the validation between two batches; the checkpoint written
then records that this epoch's validation is pending (``impulsevit_validation_pending``), and the resumed fit runs
that validation again from its first batch before training on (so the epoch's metrics and top-k are not lost).
The same holds for a signal acted on at a training batch after which the fit loop validates (the last batch of an
epoch that ``check_val_every_n_epoch`` validates, a ``val_check_interval`` point): the checkpoint is written at that
batch and the fit leaves at the validation's start, so the checkpoint records the validation as pending too, and the
resumed fit runs it, then that epoch's ``on_train_epoch_end`` hooks (scheduler, last / top-k checkpoints, ...) once,
as an uninterrupted run does (Lightning alone would restore past both).

Not supported: requeue signals other than USR1 (the batch script asks SLURM for ``--signal=USR1@lead``); USR1 and
SIGINT that arrive during validation are acted on at the next training step (validation is not interrupted); a
SIGKILL (after SLURM's ``KillWait``) loses the steps since the last checkpoint.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from impulsevit._compat.lightning import (
    hand_back_signal_handlers,
    rerun_interrupted_validation,
    validation_follows_batch,
)
from impulsevit.env import slurm_job_id, slurm_restart_count
from impulsevit.eventlog import append_event
from impulsevit.training.checkpointing import checkpoint_dir, save_checkpoint

__all__ = ["InterruptedAgain", "Preempted", "SlurmRequeue"]

_NONE, _INTERRUPT, _STOP, _REQUEUE = 0, 1, 2, 3  # max-reduced over ranks: a requeue request wins
_NAMES = {_INTERRUPT: "SIGINT", _STOP: "SIGTERM", _REQUEUE: "SIGUSR1"}
EXIT_CODES = {_INTERRUPT: 130, _STOP: 143}  # 128 + signal number, what a shell reports for a killed job
# checkpoint entry: the epoch whose validation a signal cut short, or that was due after the batch the signal stopped at
VALIDATION_PENDING = "impulsevit_validation_pending"


class Preempted(SystemExit):
    """Raised on every rank after the preemption checkpoint (and requeue); exit code 0 when requeued, 143 after
    SIGTERM, 130 after SIGINT."""


class InterruptedAgain(Preempted):
    """Raised where the main thread is by a second SIGINT (Ctrl-C) while the first one's checkpoint is still pending
    or being written: the fit stops at once, without that checkpoint, exit code 130."""


class SlurmRequeue(Callback):
    """Checkpoint at the next step boundary on SIGUSR1 (then requeue) or SIGTERM (then stop); see the module docstring.

    Args:
        filename: checkpoint file name inside the ``ModelCheckpoint`` directory (``<default_root_dir>/checkpoints``
            without one); overwritten at each preemption, picked up by ``--resume auto`` as the newest checkpoint.
        requeue: run ``scontrol requeue`` on SIGUSR1 (False: only checkpoint and stop).
        check_every_n_steps: with several ranks, agree on the flag every this many optimizer steps (each agreement
            is a collective and a host read); a signal is acted on within that many steps of its arrival. ``None``:
            ``trainer.log_every_n_steps``.
    """

    def __init__(self, filename: str = "preempted.ckpt", requeue: bool = True,
                 check_every_n_steps: int | None = None) -> None:
        if check_every_n_steps is not None and check_every_n_steps < 1:
            raise ValueError(f"SlurmRequeue check_every_n_steps must be >= 1, got {check_every_n_steps}")
        self.filename = filename
        self.requeue = requeue
        self.check_every_n_steps = check_every_n_steps
        self._pending = _NONE
        self._interrupts = 0  # SIGINTs received during this fit
        self._exit_code: int | None = None
        self._saved_step: int | None = None
        self._previous: dict[int, Any] = {}
        self._active = False
        self._cut_validation: int | None = None  # epoch whose validation the signal interrupted (while saving)

    # ------------------------------------------------------------------------------------------------- signals
    def _on_signal(self, signum: int, frame: Any) -> None:  # async-signal context: set a flag, nothing else
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:  # a second Ctrl-C stops at once (not Lightning's KeyboardInterrupt: exit 1)
                raise InterruptedAgain(130)
        code = {signal.SIGUSR1: _REQUEUE, signal.SIGINT: _INTERRUPT}.get(signum, _STOP)
        self._pending = max(self._pending, code)

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)

    def _uninstall(self, trainer: pl.Trainer) -> None:
        hand_back_signal_handlers(trainer, self._on_signal, self._previous)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self._previous.items():
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    # --------------------------------------------------------------------------------------------------- helpers
    def _events_log(self, trainer: pl.Trainer) -> Path:
        env = os.environ.get("IMPULSEVIT_EVENTS_LOG")
        return Path(env) if env else Path(trainer.default_root_dir) / "slurm" / "events.log"

    def _say(self, trainer: pl.Trainer, message: str, **event: Any) -> None:
        if trainer.is_global_zero:
            print(f"[impulsevit] {message}", file=sys.stderr, flush=True)
            if event:
                append_event(self._events_log(trainer), **event)

    def checkpoint_path(self, trainer: pl.Trainer) -> Path:
        return checkpoint_dir(trainer) / self.filename

    def _save(self, trainer: pl.Trainer, reason: str) -> Path:
        """All ranks: :func:`impulsevit.training.checkpointing.save_checkpoint` (temp name, rank 0 renames it into
        place)."""
        step = trainer.global_step
        path = save_checkpoint(trainer, self.checkpoint_path(trainer), f"step{step}")
        self._saved_step = step
        self._say(trainer, f"{reason}: checkpoint saved to {path} at global step {step}",
                  event="checkpoint", reason=reason, path=path, step=step)
        return path

    def _requeue(self, trainer: pl.Trainer) -> bool:
        """Rank 0 requeues the job; the outcome is broadcast so every rank agrees."""
        ok = False
        if trainer.is_global_zero:
            job = slurm_job_id()
            scontrol = shutil.which("scontrol")
            if job is None:
                self._say(trainer, "SIGUSR1 outside a SLURM job: checkpoint written, nothing to requeue; continuing")
            elif scontrol is None:
                self._say(trainer, f"cannot requeue SLURM job {job}: `scontrol` not found on PATH; checkpoint "
                                   "written, continuing until the job ends",
                          event="requeue", job_id=job, rc="no-scontrol")
            else:
                proc = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
                ok = proc.returncode == 0
                detail = "" if ok else f": {proc.stderr.strip() or proc.stdout.strip()}"
                self._say(trainer, f"scontrol requeue {job} -> exit {proc.returncode}{detail}",
                          event="requeue", job_id=job, rc=proc.returncode)
        return bool(trainer.strategy.broadcast(ok, src=0))

    def _leave_if_done(self, trainer: pl.Trainer) -> None:
        if self._exit_code is not None:
            code, self._exit_code = self._exit_code, None
            self._say(trainer, f"leaving after the preemption checkpoint (exit {code})", event="leave", rc=code)
            raise Preempted(code)

    # ----------------------------------------------------------------------------------------------------- hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._active = stage == "fit"
        if not self._active:
            return
        # the environment of a multi-device strategy is the one Lightning's signal connector reads; a single-device
        # strategy has none to reach publicly, but its requeue handler is not registered either, since ours is already
        # installed (Lightning skips a signal that has a handler) — it only logs "Bypassing SIGTERM"
        env = getattr(trainer.strategy, "cluster_environment", None)
        if isinstance(env, SLURMEnvironment) and env.auto_requeue:
            env.auto_requeue = False  # one requeue owner: this callback
        self._pending, self._exit_code, self._saved_step, self._interrupts = _NONE, None, None, 0
        self._install()
        if self.requeue and slurm_job_id() is not None and shutil.which("scontrol") is None:
            self._say(trainer, "warning: running under SLURM but `scontrol` is not on PATH (common inside "
                               "containers): on SIGUSR1 the job will checkpoint but cannot requeue itself; resubmit "
                               "it by hand (it resumes from the checkpoint) or make scontrol available",
                      event="warning", reason="no-scontrol")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self._active:
            return
        if stage == "fit":
            self._uninstall(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._active:
            return
        if trainer.ckpt_path:
            restart = slurm_restart_count()
            self._say(trainer, f"resumed from {trainer.ckpt_path} at global step {trainer.global_step} "
                               f"(epoch {trainer.current_epoch}, SLURM restart {restart})",
                      event="resume", path=trainer.ckpt_path, step=trainer.global_step)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._active:
            return
        if trainer.world_size > 1:
            if trainer.global_step % (self.check_every_n_steps or trainer.log_every_n_steps or 1):
                return
            flag = torch.tensor(self._pending, dtype=torch.int32, device=trainer.strategy.root_device)
            decision = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        else:
            decision = self._pending
        if decision == _NONE:
            return
        self._pending = _NONE
        # at a batch after which the fit loop validates (the epoch's last one, a val_check_interval point) the fit
        # leaves at that validation's start: the checkpoint says the validation is still to do, so the resumed fit
        # runs it (and then the epoch-end hooks) instead of restoring past it
        due = validation_follows_batch(trainer)
        self._say(trainer, f"received {_NAMES[decision]} (on at least one rank); checkpointing at global step "
                           f"{trainer.global_step}" + (f"; the validation due after it (epoch {trainer.current_epoch})"
                                                       " runs first at resume" if due else ""),
                  event="signal", signal=_NAMES[decision], step=trainer.global_step)
        self._cut_validation = trainer.current_epoch if due else None
        try:
            self._save(trainer, "requeue" if decision == _REQUEUE else "stop")
        finally:
            self._cut_validation = None
        if decision != _REQUEUE or not self.requeue:
            self._exit_code = EXIT_CODES.get(decision, 0)
        elif self._requeue(trainer):
            self._exit_code = 0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if not self._active:
            return
        self._leave_if_done(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._active:
            return
        if trainer.state.fn == "fit":
            self._leave_if_done(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._active:
            return
        self._leave_if_done(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not self._active:
            return
        try:
            if isinstance(exception, InterruptedAgain):
                self._say(trainer, f"second Ctrl-C: stopped at once at global step {trainer.global_step}, without "
                                   "a checkpoint of this step (exit 130); --resume auto continues from the last one",
                          event="signal", signal="SIGINT", step=trainer.global_step)
            elif (isinstance(exception, SIGTERMException) and trainer.state.fn == "fit"
                    and (self._saved_step != trainer.global_step or trainer.validating)):
                cut = trainer.validating and not trainer.sanity_checking
                self._say(trainer, "SIGTERM (Lightning): checkpointing before exit" +
                          (f"; the interrupted validation of epoch {trainer.current_epoch} runs again at resume"
                           if cut else ""), event="signal", signal="SIGTERM", step=trainer.global_step)
                self._cut_validation = trainer.current_epoch if cut else None
                try:
                    self._save(trainer, "stop")
                finally:
                    self._cut_validation = None
        finally:
            self._uninstall(trainer)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if self._cut_validation is not None:
            checkpoint[VALIDATION_PENDING] = self._cut_validation

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # runs before Lightning restores its loops from the same dict (callbacks first, then loops)
        epoch = checkpoint.get(VALIDATION_PENDING)
        if epoch is not None and trainer.state.fn == "fit" and rerun_interrupted_validation(checkpoint):
            self._say(trainer, f"the validation of epoch {epoch} was interrupted (or not yet run) when a signal "
                               "stopped the fit: running it first")
