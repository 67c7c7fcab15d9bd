"""Sample orders as pure functions of (seed, epoch, rank, world size), the loader position that makes them resumable,
and the torch sampler both use.

**Orders.** :func:`epoch_sequence` gives an epoch's *global sequence* ``seq`` and the per-rank length ``per_rank``;
rank ``r`` of ``W`` visits ``seq[r::W][:per_rank]`` (:func:`shard_order`), i.e. the global position of its ``i``-th
sample is ``i * W + r``. Two kinds:

- plain shuffling: ``torch.randperm`` seeded with ``seed + epoch``, padded by wrapping around to a multiple of ``W``
  — exactly ``torch.utils.data.DistributedSampler``'s order (also with ``W = 1``), used by both backends;
- repeated augmentation (DeiT's RASampler semantics, ``repeats > 1``): the dataset is shuffled once per epoch
  (``numpy.random.default_rng([seed, epoch])``), every index is repeated ``repeats`` times in a row and the list is
  dealt round-robin to the replicas, so the copies of an image land on different ranks (and get different
  augmentations). Each rank keeps ``floor(N // 256 * 256 / world)`` indices, so an epoch has as many steps as without
  repetition and sees about ``1 / repeats`` of the distinct images. Below 256 images per epoch the 256-rounding is
  skipped (tiny test sets would otherwise be empty).

**Resuming** (:class:`LoaderState`, :func:`resumed_shard`). A training loader's position is ``(epoch, batches)``: the
next batch it yields is batch ``batches`` of this rank's order in ``epoch`` (every rank has consumed the same number
of batches, so one state describes all ranks; it records the world size it was taken under). On the same world size
a resumed loader yields exactly the batches the uninterrupted run would have yielded next. On a different world size
the epoch's remaining samples — global positions ``[batches * batch_size * W_old, used * W_old)`` of the old global
sequence, ``used`` being the samples per rank the old epoch would have trained on — are dealt round-robin to the new
ranks (equal shares; up to ``W_new - 1`` samples of the remainder are dropped): no sample is repeated, none skipped
beyond that rounding, but the batches (and so the weights) differ from any uninterrupted run.

**Per-sample augmentation keys.** :class:`EpochSampler` yields :class:`SampleKey` ``(index, epoch, position)`` (the
global position in the epoch's sequence); :func:`sample_seed` turns ``(seed, epoch, position)`` into the seed of that
sample's augmentation draws, so they depend neither on the worker that decodes it nor on the number of workers, nor
on whether the run was resumed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sized
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

__all__ = [
    "EpochSampler",
    "LoaderState",
    "RepeatedAugSampler",
    "ResumableDataLoader",
    "SampleKey",
    "epoch_sequence",
    "repeated_aug_order",
    "resumed_shard",
    "sample_seed",
    "samples_per_rank",
    "shard_order",
    "train_batches",
]


def epoch_sequence(num_samples: int, *, epoch: int, seed: int, world_size: int = 1, repeats: int = 1,
                   shuffle: bool = True) -> tuple[np.ndarray, int]:
    """The global sequence ``seq`` (int64 dataset indices, length ``per_rank * world_size``) of ``epoch`` and the
    number of samples ``per_rank`` each rank visits: rank ``r`` visits ``seq[r::world_size][:per_rank]``."""
    if repeats < 1 or world_size < 1 or num_samples < 1:
        raise ValueError(f"need repeats >= 1, world_size >= 1 and num_samples >= 1; got {repeats}, {world_size}, "
                         f"{num_samples}")
    per_rank = samples_per_rank(num_samples, world_size, repeats)
    if repeats > 1:
        perm = np.random.default_rng([seed, epoch]).permutation(num_samples)
        items = np.repeat(perm, repeats)
        full = int(math.ceil(num_samples * repeats / world_size))
    else:
        if shuffle:
            items = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).numpy()
        else:
            items = np.arange(num_samples)
        full = per_rank
    return np.resize(items.astype(np.int64), full * world_size), per_rank  # np.resize pads by wrapping around


def samples_per_rank(num_samples: int, world_size: int = 1, repeats: int = 1) -> int:
    """How many samples each of ``world_size`` ranks visits in an epoch of :func:`epoch_sequence` over
    ``num_samples`` (``repeats`` > 1: repeated augmentation); ``num_samples >= 1``."""
    if repeats > 1:
        full = int(math.ceil(num_samples * repeats / world_size))
        keep = num_samples // 256 * 256 // world_size if num_samples >= 256 else num_samples // world_size
        return min(full, max(1, keep))
    return int(math.ceil(num_samples / world_size))


def train_batches(num_samples: int, batch_size: int, world_size: int = 1, repeats: int = 1) -> int:
    """Full batches per rank in a training epoch of both backends' loaders (the last partial batch is dropped): 0
    means an epoch without a training step."""
    return samples_per_rank(num_samples, world_size, repeats) // batch_size if num_samples > 0 else 0


def shard_order(num_samples: int, rank: int, world_size: int, epoch: int, seed: int, repeats: int = 1,
                shuffle: bool = True) -> np.ndarray:
    """Indices (into ``range(num_samples)``) that replica ``rank`` of ``world_size`` visits in ``epoch``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
    seq, per_rank = epoch_sequence(num_samples, epoch=epoch, seed=seed, world_size=world_size, repeats=repeats,
                                   shuffle=shuffle)
    return seq[rank::world_size][:per_rank]


def repeated_aug_order(num_samples: int, repeats: int, rank: int, world_size: int, epoch: int, seed: int) -> np.ndarray:
    """Indices that replica ``rank`` of ``world_size`` visits in ``epoch`` under repeated augmentation."""
    return shard_order(num_samples, rank, world_size, epoch, seed, repeats=repeats)


def resumed_shard(seq: np.ndarray, per_rank: int, *, old_world: int, consumed: int, batch_size: int, rank: int,
                  world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, global positions)`` of the samples of an interrupted epoch that rank ``rank`` of ``world_size``
    visits after the resume, when every one of the ``old_world`` ranks had consumed ``consumed`` samples of its share
    of ``seq`` (``batches * batch_size``; the epoch drops the last incomplete batch). With ``world_size == old_world``
    this is exactly ``seq[rank::W][consumed:used]``."""
    used = per_rank // batch_size * batch_size
    lo, hi = consumed * old_world, max(consumed, used) * old_world
    share = (hi - lo) // world_size
    positions = lo + rank + world_size * np.arange(share, dtype=np.int64)
    return seq[positions], positions


def sample_seed(seed: int, epoch: int, position: int) -> np.ndarray:
    """Four uint32 words seeding the augmentation draws of the sample at global ``position`` of ``epoch``."""
    return np.random.SeedSequence([0x1A7A, int(seed) & 0xFFFFFFFF, int(epoch), int(position)]).generate_state(4)


class SampleKey(NamedTuple):
    """What :class:`EpochSampler` yields instead of a bare index: the dataset ``index`` plus what seeds its
    augmentation (``epoch`` and the global ``position`` in the epoch's sequence)."""

    index: int
    epoch: int
    position: int


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """Position of a training loader: the next batch is batch ``batches`` of this rank's order in ``epoch``.

    ``world_size``, ``batch_size``, ``num_samples``, ``seed``, ``repeats`` and ``order`` identify the order the
    position refers to (:meth:`check` compares them with the loader loading the state)."""

    epoch: int
    batches: int
    batch_size: int
    world_size: int
    num_samples: int
    seed: int
    repeats: int = 1
    order: str = "random"

    def to_dict(self) -> dict[str, Any]:
        """Plain ints and strings (loadable with ``torch.load(weights_only=True)``), plus ``samples`` per rank."""
        return {**dataclasses.asdict(self), "samples": self.batches * self.batch_size}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderState:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"epoch", "batches", "batch_size", "world_size", "num_samples", "seed"} - set(state)
        if missing:
            raise ValueError(f"loader state is missing {sorted(missing)} (got keys {sorted(state)})")
        return cls(**{k: v for k, v in state.items() if k in names})

    def check(self, *, batch_size: int, num_samples: int, seed: int, repeats: int) -> None:
        """Raise :class:`~impulsevit.errors.ConfigError` (a ``ValueError``) naming the setting when the state belongs
        to a different data order (a state at the start of an epoch fits any order)."""
        from impulsevit.errors import ConfigError

        if self.batches == 0:
            return
        for key, now in (("batch_size", batch_size), ("num_samples", num_samples), ("seed", seed),
                         ("repeats", repeats)):
            then = getattr(self, key)
            if int(then) != int(now):
                raise ConfigError(
                    f"cannot resume the training loader: the checkpoint's loader state has {key} {then}, this run "
                    f"has {now}; the interrupted epoch's order would not be the same (resume with the same data "
                    f"settings, or from a checkpoint taken at an epoch boundary with --resume PATH)")


class EpochSampler(DistributedSampler):
    """A ``DistributedSampler`` (so Lightning leaves it in place) yielding :func:`shard_order` as :class:`SampleKey`
    (or plain ints with ``keys=False``), resumable through :meth:`resume`. Lightning calls ``set_epoch`` at every
    epoch start; ``len()`` is the full epoch (Lightning counts the resumed epoch's batches from the restored step).
    """

    def __init__(self, dataset: Sized, *, num_replicas: int = 1, rank: int = 0, seed: int = 0, repeats: int = 1,
                 shuffle: bool = True, batch_size: int = 1, keys: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.repeats, self.batch_size, self.keys = int(repeats), int(batch_size), keys
        self._resume: LoaderState | None = None
        self.num_samples = self._sequence(0)[1]

    def _sequence(self, epoch: int, world: int | None = None) -> tuple[np.ndarray, int]:
        return epoch_sequence(len(self.dataset), epoch=epoch, seed=self.seed,  # type: ignore[arg-type]
                              world_size=world or self.num_replicas, repeats=self.repeats, shuffle=self.shuffle)

    def resume(self, state: LoaderState | None) -> None:
        """Make epoch ``state.epoch`` continue after its first ``state.batches`` batches (None: no resume)."""
        self._resume = state
        if state is not None:
            self.epoch = state.epoch

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None

    def plan(self) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, global positions)`` this rank visits in the current epoch (the remainder when resuming)."""
        r = self._resume
        if r is not None and r.epoch == self.epoch:
            seq, per_rank = self._sequence(self.epoch, r.world_size)
            return resumed_shard(seq, per_rank, old_world=r.world_size, consumed=r.batches * r.batch_size,
                                 batch_size=r.batch_size, rank=self.rank, world_size=self.num_replicas)
        seq, per_rank = self._sequence(self.epoch)
        return seq[self.rank::self.num_replicas][:per_rank], self.rank + self.num_replicas * np.arange(per_rank)

    def __iter__(self) -> Iterator[Any]:
        indices, positions = self.plan()
        if not self.keys:
            return iter(indices.tolist())
        return (SampleKey(i, self.epoch, p) for i, p in zip(indices.tolist(), positions.tolist(), strict=True))

    def __len__(self) -> int:
        r = self._resume
        if r is not None and r.world_size != self.num_replicas:  # the resumed epoch, counted from the restored step
            return max(self.num_samples, r.batches * self.batch_size + len(self.plan()[0]))
        return self.num_samples


class RepeatedAugSampler(EpochSampler):
    """:class:`EpochSampler` with ``repeats`` copies per image, yielding plain indices (DeiT's RASampler)."""

    def __init__(self, dataset: Sized, repeats: int = 3, num_replicas: int = 1, rank: int = 0, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, seed=seed, repeats=repeats, keys=False)


class ResumableDataLoader(DataLoader):
    """A training ``DataLoader`` over an :class:`EpochSampler` (the torchvision backend's, the synthetic
    datamodule's), stateful like :class:`~impulsevit.data.loading.ffcv_loader.FFCVLoader`: ``state_dict()`` is the
    :class:`LoaderState` (epoch, batches consumed on this rank — from ``progress()`` when bound to Lightning's training
    progress, else the batches yielded), ``load_state_dict()`` makes the sampler continue that epoch after them."""

    progress: Callable[[], tuple[int, int] | None] | None = None
    _position: tuple[int, int] = (0, 0)

    def __iter__(self):  # noqa: ANN204
        sampler = self.sampler
        r = sampler._resume
        done = r.batches if r is not None and r.epoch == sampler.epoch else 0
        self._position = (sampler.epoch, done)
        return self._count(super().__iter__(), sampler.epoch, done)

    def _count(self, it: Iterator, epoch: int, done: int) -> Iterator:
        for batch in it:
            done += 1
            self._position = (epoch, done)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        s = self.sampler
        pos = self.progress() if self.progress is not None else None
        epoch, batches = pos if pos is not None else self._position
        if pos is None and batches >= len(self):  # a finished epoch: the next one starts from its beginning
            epoch, batches = epoch + 1, 0
        return LoaderState(epoch=int(epoch), batches=int(batches), batch_size=int(self.batch_size),
                           world_size=s.num_replicas, num_samples=len(self.dataset), seed=s.seed, repeats=s.repeats,
                           order="repeated" if s.repeats > 1 else "random").to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue epoch ``state['epoch']`` after its first ``state['batches']`` batches.

        Raises:
            ValueError: the state belongs to another order (batch size, sample count, seed or repeats differ).
        """
        st = LoaderState.from_dict(state)
        s = self.sampler
        st.check(batch_size=self.batch_size, num_samples=len(self.dataset), seed=s.seed, repeats=s.repeats)
        s.set_epoch(st.epoch)
        s.resume(st if st.batches > 0 else None)
        self._position = (st.epoch, st.batches)
