"""Sample orders: repeated augmentation (DeiT's RASampler semantics) as a pure function, plus a torch sampler using it.

Repeated augmentation shuffles the dataset once per epoch, repeats every index ``repeats`` times in a row, and deals
the list round-robin to the replicas, so the copies of an image land on different ranks (and get different
augmentations). Each rank then keeps ``floor(N // 256 * 256 / world)`` indices, so an epoch has as many steps as
without repetition and sees about ``1 / repeats`` of the distinct images. Below 256 images per epoch the 256-rounding
is skipped (tiny test sets would otherwise be empty).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import numpy as np
from torch.utils.data import DistributedSampler

__all__ = ["RepeatedAugSampler", "repeated_aug_order"]


def repeated_aug_order(num_samples: int, repeats: int, rank: int, world_size: int, epoch: int, seed: int) -> np.ndarray:
    """Indices (into ``range(num_samples)``) that replica ``rank`` of ``world_size`` visits in ``epoch``."""
    if repeats < 1 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need repeats >= 1, world_size >= 1 and 0 <= rank < world_size; got {repeats}, "
                         f"{world_size}, {rank}")
    perm = np.random.default_rng([seed, epoch]).permutation(num_samples)
    repeated = np.repeat(perm, repeats)
    per_rank = int(math.ceil(num_samples * repeats / world_size))
    total = per_rank * world_size
    if total > len(repeated):  # pad by wrapping around, as DistributedSampler does
        repeated = np.concatenate([repeated, repeated[: total - len(repeated)]])
    mine = repeated[rank:total:world_size]
    keep = num_samples // 256 * 256 // world_size if num_samples >= 256 else num_samples // world_size
    return mine[: max(1, keep)]


class RepeatedAugSampler(DistributedSampler):
    """A ``DistributedSampler`` (so Lightning leaves it in place) yielding :func:`repeated_aug_order`. Works with
    ``world_size=1`` too. Lightning calls ``set_epoch`` at every epoch start."""

    def __init__(self, dataset: Sized, repeats: int = 3, num_replicas: int = 1, rank: int = 0, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)  # type: ignore[arg-type]
        self.repeats = int(repeats)
        self.num_samples = len(self._order())

    def _order(self) -> np.ndarray:
        return repeated_aug_order(len(self.dataset), self.repeats, self.rank, self.num_replicas,  # type: ignore[arg-type]
                                  self.epoch, self.seed)

    def __iter__(self) -> Iterator[int]:
        return iter(self._order().tolist())

    def __len__(self) -> int:
        return self.num_samples
