"""Repeated-augmentation and sharded orders (pure functions) and the torch sampler built on them."""

from __future__ import annotations

import numpy as np
import pytest

from impulsevit.data.loading.sampling import RepeatedAugSampler, repeated_aug_order


@pytest.mark.parametrize("world", [1, 2, 8])
def test_repeated_aug_order_deals_copies_to_different_ranks(world):
    n, repeats = 1000, 3
    orders = [repeated_aug_order(n, repeats, r, world, epoch=2, seed=5) for r in range(world)]
    keep = n // 256 * 256 // world
    assert all(len(o) == keep for o in orders)  # DeiT's per-rank epoch length
    if world == 8:  # consecutive copies go to consecutive ranks: position j of rank r and r+1 hold the same image
        same = sum(int(orders[r][j] == orders[r + 1][j]) for r in range(7) for j in range(keep))
        assert same >= 0.6 * 7 * keep
    allidx = np.concatenate(orders)
    counts = np.bincount(allidx, minlength=n)
    assert counts.max() <= repeats and (counts > 0).sum() >= len(allidx) // repeats
    np.testing.assert_array_equal(orders[0], repeated_aug_order(n, repeats, 0, world, epoch=2, seed=5))
    assert not np.array_equal(orders[0], repeated_aug_order(n, repeats, 0, world, epoch=3, seed=5))


def test_single_process_repeats_are_consecutive():
    o = repeated_aug_order(30, 3, 0, 1, epoch=0, seed=0)
    assert len(o) == 30 and all(o[i] == o[i + 1] == o[i + 2] for i in range(0, 30, 3))


def test_sampler_follows_set_epoch_and_validates():
    s = RepeatedAugSampler(list(range(300)), repeats=3, num_replicas=2, rank=1, seed=3)
    first = list(s)
    assert len(first) == len(s) == 128
    s.set_epoch(1)
    assert list(s) != first
    with pytest.raises(ValueError, match="repeats >= 1"):
        repeated_aug_order(10, 0, 0, 1, 0, 0)


def test_torchvision_train_order_is_a_function_of_the_trainers_epoch():
    """A loader created at epoch e (as on a resumed run) yields the same order as the uninterrupted run's epoch e."""
    from types import SimpleNamespace

    from impulsevit.data import ImageDataModule

    def first_labels(epoch: int) -> list[int]:
        dm = ImageDataModule(dataset="digits", backend="torchvision", image_size=8, batch_size=64, num_workers=0,
                             augment={"scale": (1.0, 1.0), "hflip": 0.0}, crop_pct=1.0)
        dm.trainer = SimpleNamespace(current_epoch=epoch, training=False)
        return next(iter(dm.train_dataloader()))[1].tolist()

    assert first_labels(3) == first_labels(3)
    assert first_labels(3) != first_labels(4)
