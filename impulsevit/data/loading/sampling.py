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
- block order (``data.order: block``, litdata backend, the ``auto`` choice for a set written shuffled;
  :func:`block_sequence`), for shard sets read from a store: the chunks (runs of consecutive samples, ``chunk_sizes``)
  are shuffled (``default_rng([seed, epoch, 0xB10C])``) and laid end to end, the stream is cut into ``W`` equal
  contiguous shares (padded by wrapping around, as above), even ranks read their share backward and odd ranks forward
  (so a chunk cut between ranks ``r`` and ``r + 1`` is read by both at the same time: at the start or at the end of
  the epoch), and each share is cut into blocks of ``block_size`` samples whose samples are shuffled within the block.
  A rank therefore reads whole chunks, a block at a time (``block_size / chunk size + 1`` chunks live at once), and a
  node fetches each of its chunks once per epoch with a cache of a few blocks instead of the whole set — in the family
  of MosaicML Streaming's ``py1b`` / ``py1e`` orders. The global sequence interleaves the ranks' orders (``seq[r::W]``
  is rank ``r``'s), so positions, resume and per-sample seeds are those of the other orders.

**Resuming** (:class:`LoaderState`, :func:`resumed_shard`). A training loader's position is ``(epoch, batches)``: the
next batch it yields is batch ``batches`` of this rank's order in ``epoch`` (every rank has consumed the same number
of batches, so one state describes all ranks; it records the world size it was taken under). On the same world size
a resumed loader yields exactly the batches the uninterrupted run would have yielded next. On a different world size
the epoch's remaining samples — global positions ``[batches * batch_size * W_old, used * W_old)`` of the old global
sequence, ``used`` being the samples per rank the old epoch would have trained on — are dealt round-robin to the new
ranks (equal shares; up to ``W_new - 1`` samples of the remainder are dropped): no sample is repeated, none skipped
beyond that rounding, but the batches (and so the weights) differ from any uninterrupted run. Under the block order
each new rank then reads, for the rest of that epoch only, from the ``W_old`` old ranks' current blocks at once (a
cache of ``W_old / W_new`` times as many blocks per rank); the next epoch is the block order of the new world size.

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

ORDERS = ("global", "block")
"""The training orders: ``global`` (one permutation of the whole set per epoch) or ``block``
(:func:`block_sequence`). ``data.order`` may also say ``auto``, which the datamodule resolves to one of them."""

__all__ = [
    "EpochSampler",
    "LoaderState",
    "RepeatedAugSampler",
    "ORDERS",
    "ResumableDataLoader",
    "SampleKey",
    "block_mixing",
    "block_sequence",
    "distinct_per_batch",
    "epoch_sequence",
    "repeated_aug_order",
    "resumed_shard",
    "sample_seed",
    "samples_per_rank",
    "shard_order",
    "train_batches",
]


def block_sequence(chunk_sizes: np.ndarray | list[int], *, epoch: int, seed: int, world_size: int = 1,
                   block_size: int) -> tuple[np.ndarray, int]:
    """The block order's global sequence ``seq`` (int64 sample indices, length ``per_rank * world_size``) and
    ``per_rank`` (``ceil(N / world_size)``, as the global order's) for a set whose samples ``0 .. N - 1`` are stored in
    chunks of ``chunk_sizes`` consecutive samples (``N = sum(chunk_sizes)``): rank ``r`` visits ``seq[r::world_size]``
    (module docstring). A pure function of its arguments; ``block_size >= 1`` samples (a block larger than a rank's
    share shuffles the whole share).

    Raises:
        ValueError: an empty set, a negative chunk size, ``world_size < 1`` or ``block_size < 1``."""
    sizes = np.asarray(chunk_sizes, dtype=np.int64)
    if sizes.ndim != 1 or (sizes < 0).any() or sizes.sum() < 1 or world_size < 1 or block_size < 1:
        raise ValueError(f"need non-negative chunk sizes summing to >= 1, world_size >= 1 and block_size >= 1; got "
                         f"{len(sizes)} chunks of {int(sizes.sum())} samples, {world_size}, {block_size}")
    starts = np.cumsum(sizes) - sizes
    perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 0xB10C]).permutation(len(sizes))
    stream = np.concatenate([np.arange(starts[c], starts[c] + sizes[c], dtype=np.int64) for c in perm])
    per_rank = int(math.ceil(len(stream) / world_size))
    stream = np.resize(stream, per_rank * world_size)  # pads by wrapping around, as the global order
    seq = np.empty_like(stream)
    for r in range(world_size):
        share = stream[r * per_rank:(r + 1) * per_rank]
        if world_size > 1 and r % 2 == 0:
            share = share[::-1]  # a chunk cut between ranks r and r + 1 is read by both at the same time
        share = share.copy()
        for b, lo in enumerate(range(0, per_rank, block_size)):
            rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 0xB10C, world_size, r, b])
            share[lo:lo + block_size] = rng.permutation(share[lo:lo + block_size])
        seq[r::world_size] = share
    return seq, per_rank


def distinct_per_batch(order: np.ndarray, groups: np.ndarray, batch_size: int) -> float:
    """Shuffle quality of one rank's ``order`` (sample indices): the mean number of distinct ``groups[i]`` (labels,
    or chunks) per full batch of ``batch_size``. A global shuffle of a set with many groups approaches
    ``batch_size``; an order that reads few chunks at a time, from a set stored in class order, sees fewer labels per
    batch. ``order`` of at least one full batch."""
    full = len(order) // batch_size * batch_size
    if full == 0:
        raise ValueError(f"need at least one full batch of {batch_size}, got {len(order)} samples")
    g = np.sort(np.asarray(groups)[np.asarray(order)[:full]].reshape(-1, batch_size), axis=1)
    return float(np.mean(1 + np.count_nonzero(np.diff(g, axis=1), axis=1)))


def block_mixing(labels: np.ndarray, chunk_sizes: np.ndarray | list[int], *, block_size: int, batch_size: int,
                 seed: int = 0, window: int = 256) -> tuple[float, float]:
    """``(block, global)``: :func:`distinct_per_batch` of ``labels`` (one per stored sample, in stored order) over
    the first ``window`` full batches of epoch 0 (one rank) under the block order and under the global order. A set
    stored in class order gives a block figure far below the global one; a set written shuffled gives about the
    same. Batches beyond the set are not counted (a set smaller than one batch gives ``(0.0, 0.0)``)."""
    labels = np.asarray(labels)
    take = min(len(labels), window * batch_size) // batch_size * batch_size
    if take == 0:
        return 0.0, 0.0
    block, _ = block_sequence(chunk_sizes, epoch=0, seed=seed, block_size=block_size)
    shuffled, _ = epoch_sequence(len(labels), epoch=0, seed=seed)
    return (distinct_per_batch(block[:take], labels, batch_size),
            distinct_per_batch(shuffled[:take], labels, batch_size))


def epoch_sequence(num_samples: int, *, epoch: int, seed: int, world_size: int = 1, repeats: int = 1,
                   shuffle: bool = True, chunk_sizes: np.ndarray | list[int] | None = None,
                   block_size: int = 0) -> tuple[np.ndarray, int]:
    """The global sequence ``seq`` (int64 dataset indices, length ``per_rank * world_size``) of ``epoch`` and the
    number of samples ``per_rank`` each rank visits: rank ``r`` visits ``seq[r::world_size][:per_rank]``.
    ``chunk_sizes`` given (summing to ``num_samples``): the block order (:func:`block_sequence`, with ``block_size``;
    not with ``repeats > 1`` or ``shuffle=False``)."""
    if repeats < 1 or world_size < 1 or num_samples < 1:
        raise ValueError(f"need repeats >= 1, world_size >= 1 and num_samples >= 1; got {repeats}, {world_size}, "
                         f"{num_samples}")
    if chunk_sizes is not None:
        if repeats > 1 or not shuffle or int(np.sum(chunk_sizes)) != num_samples:
            raise ValueError(f"the block order needs repeats == 1, shuffle and chunk sizes summing to num_samples; "
                             f"got {repeats}, {shuffle}, {int(np.sum(chunk_sizes))} != {num_samples}")
        return block_sequence(chunk_sizes, epoch=epoch, seed=seed, world_size=world_size, block_size=block_size)
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
    block_size: int = 0

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

    def check(self, *, batch_size: int, num_samples: int, seed: int, repeats: int, order: str | None = None,
              block_size: int | None = None) -> None:
        """Raise :class:`~impulsevit.errors.ConfigError` (a ``ValueError``) naming the setting when the state belongs
        to a different data order (a state at the start of an epoch fits any order). ``order``: this loader's kind
        (``block`` or another); a block-order state and a loader of another kind do not fit each other."""
        from impulsevit.errors import ConfigError

        if self.batches == 0:
            return
        if order is not None and (self.order == "block") != (order == "block"):
            raise ConfigError(
                f"cannot resume the training loader: the checkpoint's loader state is of the {self.order!r} order, "
                f"this run's is {order!r} (data.order); resume with the same data.order, or from a checkpoint taken "
                f"at an epoch boundary with --resume PATH")
        if order == "block" and block_size is not None and int(self.block_size) != int(block_size):
            raise ConfigError(
                f"cannot resume the training loader: the checkpoint's loader state has data.storage.block_size "
                f"{self.block_size}, this run has {block_size}; the interrupted epoch's order would not be the same "
                f"(resume with the same data settings, or from a checkpoint taken at an epoch boundary with --resume "
                f"PATH)")
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
                 shuffle: bool = True, batch_size: int = 1, keys: bool = True,
                 chunk_sizes: np.ndarray | list[int] | None = None, block_size: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.repeats, self.batch_size, self.keys = int(repeats), int(batch_size), keys
        self.chunk_sizes, self.block_size = chunk_sizes, int(block_size)
        self._resume: LoaderState | None = None
        self.num_samples = self._sequence(0)[1]

    def _sequence(self, epoch: int, world: int | None = None) -> tuple[np.ndarray, int]:
        return epoch_sequence(len(self.dataset), epoch=epoch, seed=self.seed,  # type: ignore[arg-type]
                              world_size=world or self.num_replicas, repeats=self.repeats, shuffle=self.shuffle,
                              chunk_sizes=self.chunk_sizes, block_size=self.block_size)

    @property
    def order(self) -> str:
        """This sampler's kind, as the loader state records it: ``block``, ``repeated`` or ``random``."""
        return "block" if self.chunk_sizes is not None else "repeated" if self.repeats > 1 else "random"

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
        return self._count(self._batches(), sampler.epoch, done)

    def _batches(self) -> Iterator:
        """The batches of the sampler's current epoch (``DataLoader``'s iteration; the litdata backend's threaded
        loader fills them itself)."""
        return super().__iter__()

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
                           order=s.order, block_size=s.block_size).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue epoch ``state['epoch']`` after its first ``state['batches']`` batches.

        Raises:
            ValueError: the state belongs to another order (batch size, sample count, seed or repeats differ).
        """
        st = LoaderState.from_dict(state)
        s = self.sampler
        st.check(batch_size=self.batch_size, num_samples=len(self.dataset), seed=s.seed, repeats=s.repeats,
                 order=s.order, block_size=s.block_size)
        s.set_epoch(st.epoch)
        s.resume(st if st.batches > 0 else None)
        self._position = (st.epoch, st.batches)
