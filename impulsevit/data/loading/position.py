"""Where the data of a run stands, as explicit values: :class:`LoaderPosition`, and the one place the data package reads
it from a Lightning ``Trainer``.

The loaders and the device augmentation are functions of a position — which epoch (it seeds the order and the
augmentation draws), which batch of the epoch (it keys the device augmentation's draws), which rank of how many
(it picks the shard) — never of the trainer itself: the datamodule's Lightning hooks compute the position here and
pass it in, and a caller without a trainer (``impulsevit data preview``, tests) builds a :class:`LoaderPosition`
itself.

The counters of Lightning's fit loop are read through :func:`impulsevit._compat.lightning.epoch_batch_progress` (loop
internals); this module is its only caller.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

__all__ = ["LoaderPosition", "dist_info", "loader_position", "planned_world_size", "trained_position"]


def dist_info() -> tuple[int, int]:
    """(rank, world_size) of the default process group, (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


@dataclasses.dataclass(frozen=True)
class LoaderPosition:
    """A point in a run's data stream, on one rank.

    Attributes:
        epoch: 0-based epoch; the training order and every augmentation draw are seeded with it.
        batches_done: batches of ``epoch`` this rank has already taken, i.e. the 0-based index in the epoch of the
            batch at hand (the device augmentation's draws are keyed by it). It does not skip batches of a loader:
            a resumed loader continues from the checkpoint's loader state (:mod:`impulsevit.data.loading.sampling`).
        rank / world_size: this process's rank in the process group and the group's size (the shard of the
            training order; ``0`` / ``1`` without a process group).
    """

    epoch: int = 0
    batches_done: int = 0
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.batches_done < 0 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need epoch >= 0, batches_done >= 0 and 0 <= rank < world_size; got {self}")

    def next_batch(self) -> LoaderPosition:
        """The position one batch further in the same epoch."""
        return dataclasses.replace(self, batches_done=self.batches_done + 1)


def loader_position(trainer: Any) -> LoaderPosition:
    """The position of ``trainer`` (a Lightning ``Trainer``, or None): its ``current_epoch`` and, while it trains, the
    index of the training batch being moved to the device (Lightning's ``ready`` count of the epoch); the rank and
    world size of the default process group (:func:`dist_info`). Without a trainer:
    epoch 0, batch 0. Outside training ``batches_done`` is 0 (no training batch is at hand)."""
    rank, world = dist_info()
    if trainer is None:
        return LoaderPosition(0, 0, rank, world)
    done = 0
    if getattr(trainer, "training", False):
        from impulsevit._compat.lightning import epoch_batch_progress

        done = epoch_batch_progress(trainer)[0]
    return LoaderPosition(int(trainer.current_epoch), done, rank, world)


def trained_position(trainer: Any) -> tuple[int, int] | None:
    """``(epoch, batches)`` a checkpoint written now records for the training loader: the batches whose training
    step ran (Lightning's ``processed`` count; its fetcher prefetches, so a loader's own count of yielded batches is
    one too many), a finished epoch read as ``(epoch + 1, 0)``; None outside fitting (no trainer, or not
    ``fit``)."""
    if trainer is None or getattr(getattr(trainer, "state", None), "fn", None) != "fit":
        return None
    from impulsevit._compat.lightning import epoch_batch_progress

    epoch = int(trainer.current_epoch)
    done = epoch_batch_progress(trainer)[1]
    total = trainer.num_training_batches
    if math.isfinite(total) and done >= total:
        return epoch + 1, 0
    return epoch, done


def planned_world_size(trainer: Any) -> int:
    """The run's number of processes as ``prepare_data`` sees it: the trainer's ``world_size`` (known before the
    process group exists), else the process group's, else 1."""
    return int(getattr(trainer, "world_size", 0) or 0) or dist_info()[1]
