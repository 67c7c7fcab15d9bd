"""The one place a run's callbacks are assembled: :func:`standard_callbacks`.

``ImageClassifier.configure_callbacks`` returns it, so a plain ``L.Trainer(...).fit(ImageClassifier(...), dm)`` and
``impulsevit fit`` get the same set; the CLI adds only what is about its run directory (the ``checkpoint`` group's
:class:`~impulsevit.callbacks.run_checkpoint.RunCheckpoint`, the resolved-config writer). A kind the trainer already has
(the
user passed one in ``callbacks=[...]``, a recipe's ``trainer.callbacks``, an sbatch script's) is kept as configured
and not added again; two instances of a kind that must have one owner is an error, not a silent choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor, ModelSummary, ThroughputMonitor, TQDMProgressBar

from impulsevit.callbacks.attention_evolution import AttentionEvolution
from impulsevit.callbacks.console import FlopsModelSummary, LineProgressBar, ResumeProgressBar, stdout_is_terminal
from impulsevit.callbacks.initializer import Initializer
from impulsevit.callbacks.nan_guard import NonFiniteLossGuard
from impulsevit.callbacks.preemption import SlurmRequeue
from impulsevit.callbacks.rng_state import RNGStateCheckpoint
from impulsevit.callbacks.run_record import RunRecord
from impulsevit.callbacks.throughput import ThroughputLogger

__all__ = ["SINGLE_OWNER", "standard_callbacks"]

# kinds whose second instance would act twice on one event (two requeues, two re-seedings per batch, two inits)
SINGLE_OWNER: tuple[type[L.Callback], ...] = (Initializer, SlurmRequeue, RNGStateCheckpoint, RunRecord)


def standard_callbacks(
    *,
    init_method: str,
    init_seed: int,
    init_options: Mapping[str, Any],
    log_attention: bool,
    pretrained: str | None = None,
    attention_every_n_epochs: int | None = 1,
    existing: Sequence[L.Callback] = (),
    has_logger: bool = True,
) -> list[L.Callback]:
    """The callbacks every ``ImageClassifier`` fit runs with, minus the kinds already in ``existing``.

    In order: :class:`Initializer` (the recipe's ``model.init``, or the weights of ``pretrained``, once per run at
    ``on_fit_start``),
    :class:`RNGStateCheckpoint` (per-rank seeds, RNG state in checkpoints), :class:`SlurmRequeue` (the one owner of
    SIGUSR1 / SIGTERM / SIGINT: checkpoint at a step boundary, requeue), :class:`NonFiniteLossGuard`, :class:`RunRecord`
    (data config, class names, metrics and cost in every checkpoint, for ``impulsevit export``),
    :class:`ThroughputLogger` (skipped when any ``ThroughputMonitor`` is there) and, with a logger, Lightning's
    ``LearningRateMonitor`` (per-step lr, ``lr`` or ``lr/pg<i>`` per param group) and, unless
    ``attention_every_n_epochs`` is ``None``, :class:`AttentionEvolution` (attention locality on a probe batch at init,
    every that many epochs and at the end).

    Raises:
        ValueError: ``existing`` holds two instances of a kind in :data:`SINGLE_OWNER` (names the kind).
    """
    for kind in SINGLE_OWNER:
        count = sum(isinstance(c, kind) for c in existing)
        if count > 1:
            raise ValueError(f"trainer.callbacks has {count} {kind.__name__} callbacks; a run has exactly one (it is "
                             f"added by default: remove the extra ones from the recipe / command line)")

    def missing(*kinds: type[L.Callback]) -> bool:
        return not any(isinstance(c, kinds) for c in existing)

    out: list[L.Callback] = []
    if missing(Initializer):
        out.append(Initializer(init_method, seed=init_seed, options=dict(init_options), log_attention=log_attention,
                               pretrained=pretrained))
    if missing(RNGStateCheckpoint):
        out.append(RNGStateCheckpoint())
    if missing(SlurmRequeue):
        out.append(SlurmRequeue())
    if missing(NonFiniteLossGuard):
        out.append(NonFiniteLossGuard())
    if missing(RunRecord):
        out.append(RunRecord())
    if missing(ThroughputLogger, ThroughputMonitor):
        out.append(ThroughputLogger())
    if has_logger and missing(LearningRateMonitor):
        out.append(LearningRateMonitor(logging_interval="step"))
    if attention_every_n_epochs is not None and missing(AttentionEvolution):
        out.append(AttentionEvolution(every_n_epochs=attention_every_n_epochs))
    # Lightning's default summary and bar (exactly those types) are replaced by the console ones, which Lightning then
    # uses instead (a callback returned by configure_callbacks replaces the trainer's of a parent type); where stdout
    # is not a terminal (job logs, pipes), the bar becomes one line per log_every_n_steps steps / minute
    for c in existing:
        if type(c) is ModelSummary:
            out.append(FlopsModelSummary())  # Lightning's default: max_depth 1
        elif type(c) is TQDMProgressBar:
            out.append(ResumeProgressBar(refresh_rate=c.refresh_rate, process_position=c.process_position)
                       if stdout_is_terminal() else LineProgressBar(process_position=c.process_position))
    return out
