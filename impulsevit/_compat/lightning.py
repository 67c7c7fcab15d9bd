"""Lightning internals impulsevit uses (see :mod:`impulsevit._compat`), each with why no public API does the job.

Lightning is pinned to one minor version in ``setup.cfg`` because of this module; ``tests/house/test_compat.py``
exercises each entry on the installed version, so an upgrade that moves one of these fails there, by name, instead of
somewhere in a training run.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

__all__ = ["is_log_step", "hand_back_signal_handlers", "validation_follows_batch", "rerun_interrupted_validation",
           "callback_state_key",
           "default_data_parallel_to_world", "epoch_batch_progress",
           "CommHookOnAnyDeviceDDPStrategy"]


def is_log_step(trainer: Trainer) -> bool:
    """Whether the current training batch is one whose metrics Lightning sends to the loggers (every
    ``log_every_n_steps`` batches that step the optimizer, and the step where ``should_stop`` is set).

    Why private: Lightning's cadence lives in ``_LoggerConnector.should_update_logs`` (it counts batches that stepped
    the optimizer, a loop-internal counter); ``Trainer`` exposes no public equivalent. Reading it lets the training
    step touch the device (progress-bar values, throughput clock) only at the steps that log anyway.

    Reaches: ``Trainer._logger_connector.should_update_logs``
    Checked on: lightning>=2.6,<2.7
    Waits for: a public "this step logs" flag on ``Trainer``.
    """
    return bool(trainer._logger_connector.should_update_logs)


def hand_back_signal_handlers(trainer: Trainer, mine: Callable[..., Any],
                              previous: dict[int, Any]) -> None:
    """Make Lightning's end-of-fit signal restore put back ``previous`` wherever it would restore ``mine``.

    Lightning's ``_SignalConnector`` records the handlers installed when it registers its own (after the callbacks'
    ``setup``) and re-installs them in ``Trainer._teardown``; a callback that installed ``mine`` in ``setup`` would be
    re-installed after the fit ended. Why private: the recorded handlers (``_original_handlers``) have no public
    accessor, and no hook runs after ``_teardown``.

    Reaches: ``Trainer._signal_connector._original_handlers``
    Checked on: lightning>=2.6,<2.7
    Waits for: a public way to hand a signal handler back to Lightning's restore (or a hook after ``_teardown``).
    """
    originals = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", None)
    if isinstance(originals, dict):
        for sig, handler in previous.items():
            if originals.get(sig) == mine:
                originals[sig] = handler if handler is not None else signal.SIG_DFL


def epoch_batch_progress(trainer: Trainer) -> tuple[int, int]:
    """``(ready, processed)``: the fit loop's counts of the current training epoch's batches on this rank — ``ready``
    the batches it has fetched and moved to the device (while a batch is in ``batch_to_device`` /
    ``on_after_batch_transfer`` it is not counted yet, so ``ready`` is that batch's index in the epoch), ``processed``
    the batches whose training step ran (Lightning's fetcher prefetches, so a loader's own count of yielded batches
    is one ahead). Both restart at 0 each epoch and are restored from the checkpoint on a resume.

    Why here: the loops' progress objects are Lightning's loop internals (``Trainer.fit_loop`` is public, its
    ``epoch_loop.batch_progress`` counters are not documented API), and the datamodule needs them to key the device
    augmentation by the batch index and to record the loader position in a checkpoint
    (:mod:`impulsevit.data.loading.position` is their one reader).

    Reaches: Trainer.fit_loop.epoch_loop.batch_progress.current.ready / .processed (the loops' progress counters)
    Checked on: lightning>=2.6,<2.7
    Waits for: a public "index of the current training batch in its epoch" on ``Trainer``.
    """
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    return int(current.ready), int(current.processed)


def validation_follows_batch(trainer: Trainer) -> bool:
    """Whether the fit loop runs a validation right after the current training batch: call it from
    ``on_train_batch_end``. True at the epoch's last batch of an epoch that ``check_val_every_n_epoch`` validates, and
    at a ``val_check_interval`` point inside an epoch (batches or time), when there is validation at all
    (``limit_val_batches`` not 0, a validation loader); also when a callback has already set ``should_stop`` (Lightning
    validates before stopping early).

    Why private: Lightning decides in ``_TrainingEpochLoop.on_advance_end``, after the batch's hooks, with
    ``_should_check_val_fx`` (the same rules as this answer, read at the same batch); ``Trainer`` exposes the settings
    but not the decision, and re-deriving it would drift from Lightning's own rules.

    Reaches: ``Trainer.fit_loop.epoch_loop._should_check_val_fx``, ``Trainer.fit_loop._data_fetcher``
    Checked on: lightning>=2.6,<2.7
    Waits for: a public "validation is due after this batch" property on the fit loop.
    """
    fit_loop = trainer.fit_loop
    return bool(fit_loop.epoch_loop._should_check_val_fx(fit_loop._data_fetcher))


_TRAIN_PROGRESS = "epoch_loop.batch_progress"
_VAL_PROGRESS = "epoch_loop.val_loop.batch_progress"


def rerun_interrupted_validation(checkpoint: dict[str, Any]) -> bool:
    """Edit a checkpoint saved while the fit loop's validation ran, or saved at the end of the training batch after
    which that validation was due (``on_train_batch_end``, see :func:`validation_follows_batch`), before Lightning
    restores its loops from it, so that the resumed fit runs that validation, from its first batch, before training on
    (and, at an epoch's end, before that epoch's ``on_train_epoch_end`` hooks). Returns whether the checkpoint had the
    loop state to edit.

    Lightning resumes a validation as "restarted mid-evaluation" only when a batch was started but not processed,
    and then continues after the batches it had done, whose metric state is lost; a SIGTERM raises between batches,
    so Lightning would skip the rest of that validation (no metrics for the epoch, top-k never sees it). The edit
    marks one batch as started-not-processed and the current run as empty.

    A checkpoint saved at ``on_train_batch_end`` restores as "restarted on train batch end": Lightning then
    fast-forwards the validation due after that batch (``increment_progress_to_evaluation_end``), and at an epoch's
    last batch counts the epoch as finished, so neither that validation nor the epoch-end hooks ever run. The edit
    first completes the training batch (the batch progress Lightning has once the batch's hooks returned, which is
    where it saves during that validation), so the resume takes the mid-evaluation path above.

    Why private: the loops' progress is Lightning's own checkpoint entry (``checkpoint["loops"]``), with no public
    API to say "validation of this epoch is still to do".

    Reaches: ``checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]`` and
    ``["epoch_loop.batch_progress"]`` (the loops' private state)
    Checked on: lightning>=2.6,<2.7
    Waits for: Lightning resuming an interrupted validation from its start by itself.
    """
    fit = (checkpoint.get("loops") or {}).get("fit_loop", {})
    progress, train = fit.get(_VAL_PROGRESS), fit.get(_TRAIN_PROGRESS)
    if not all(isinstance(p, dict) and {"total", "current"} <= set(p) for p in (progress, train)):
        return False
    at_batch_end = int(train["total"]["processed"]) == int(train["total"]["completed"]) + 1
    if at_batch_end:  # saved in on_train_batch_end: the batch's hooks ran; what Lightning counts once they returned
        for part in ("total", "current"):
            train[part]["completed"] = train[part]["processed"]
        before = int(progress["total"]["completed"])  # no validation had started: all of the epoch's are earlier
    else:  # saved during the validation: `current` counts its batches
        before = int(progress["total"]["completed"]) - int(progress["current"]["completed"])
    progress["total"] = {"ready": before + 1, "started": before + 1, "processed": before, "completed": before}
    progress["current"] = {key: 0 for key in progress["current"]}
    progress["is_last_batch"] = False
    return True


def callback_state_key(callback: Callback, **kwargs: Any) -> str:
    """The key under which Lightning stores ``callback``'s state in a checkpoint, for a callback whose instances
    differ by ``kwargs`` (Lightning's own format: class qualname then ``repr(kwargs)``). Checkpoints written so far
    carry keys in this format, so a change of format would orphan their callback state.

    Reaches: ``Callback._generate_state_key``
    Checked on: lightning>=2.6,<2.7
    Waits for: a public state-key helper (Lightning's docs recommend this protected one for ``state_key``).
    """
    return callback._generate_state_key(**kwargs)


def default_data_parallel_to_world(strategy: ModelParallelStrategy) -> None:
    """Make a ``ModelParallelStrategy`` created with ``data_parallel_size="auto"`` use all its processes for data
    parallelism (``num_nodes · num_processes``; Lightning's ``auto`` is ``num_nodes``, one device per node). Call it
    from ``setup_environment`` before Lightning's, once ``num_nodes`` / ``num_processes`` are known; a size given
    explicitly is kept.

    Reaches: ``ModelParallelStrategy._data_parallel_size``
    Checked on: lightning>=2.6,<2.7
    Waits for: a public setter, or ``auto`` meaning the world size.
    """
    if strategy._data_parallel_size == "auto":
        strategy._data_parallel_size = strategy.num_nodes * strategy.num_processes


class CommHookOnAnyDeviceDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` that registers its ``ddp_comm_hook`` (with ``ddp_comm_state``) on every device type;
    Lightning's registers comm hooks on CUDA only, so on CPU (gloo) the argument would be ignored silently.
    ``ddp_comm_wrapper`` is not supported (ignored, as ``bf16_compress_hook`` needs none).

    Reaches: ``DDPStrategy._register_ddp_hooks`` (overridden), ``DDPStrategy._ddp_comm_state`` / ``_ddp_comm_hook``
    Checked on: lightning>=2.6,<2.7
    Waits for: Lightning registering comm hooks on all devices (the CUDA-only test dates from torch 1.8).
    """

    def _register_ddp_hooks(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        assert isinstance(self.model, DistributedDataParallel)
        self.model.register_comm_hook(state=self._ddp_comm_state, hook=self._ddp_comm_hook)



def mlflow_tracking_uri(logger: Any) -> str:
    """The tracking URI an ``MLFlowLogger`` writes to (Lightning keeps it only as the private ``_tracking_uri``)."""
    return str(logger._tracking_uri)


def flat_hyperparams(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as Lightning's loggers send them: converted to loggable values and flattened with ``/`` (the private
    ``_convert_params`` + ``_flatten_dict`` of ``lightning.fabric.utilities.logger``), so the keys match what
    ``MLFlowLogger.log_hyperparams`` stores."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict

    return _flatten_dict(_convert_params(dict(params)))
