"""Stateful training loaders on their own: order functions, positions, re-sharding, and augmentation draws that do
not depend on the worker count (real FFCV ``.beton`` files and real torchvision workers, no trainer)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from impulsevit.data import ImageDataModule
from impulsevit.data.loading.sampling import EpochSampler, LoaderState, epoch_sequence, resumed_shard, shard_order

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


# ------------------------------------------------------------------------------------------------- pure functions
def test_plain_order_is_torchs_distributed_sampler_order():
    from torch.utils.data import DistributedSampler

    for world in (1, 2, 3):
        for rank in range(world):
            ref = DistributedSampler(range(50), num_replicas=world, rank=rank, shuffle=True, seed=7)
            ref.set_epoch(4)
            assert shard_order(50, rank, world, epoch=4, seed=7).tolist() == list(ref)


@pytest.mark.parametrize("repeats", [1, 3])
@pytest.mark.parametrize(("old", "new"), [(2, 2), (2, 1), (1, 2), (2, 3)])
def test_resumed_shard_covers_the_remaining_samples_once(repeats, old, new):
    n, bs, consumed_batches = 600, 8, 5
    seq, per_rank = epoch_sequence(n, epoch=3, seed=1, world_size=old, repeats=repeats)
    used = per_rank // bs * bs
    seen = [seq[r::old][: consumed_batches * bs] for r in range(old)]
    rest = [resumed_shard(seq, per_rank, old_world=old, consumed=consumed_batches * bs, batch_size=bs, rank=r,
                          world_size=new) for r in range(new)]
    positions = np.sort(np.concatenate([p for _, p in rest]))
    remaining = np.arange(consumed_batches * bs * old, used * old)
    assert len(remaining) - len(positions) < new  # only the rounding to equal shares is dropped
    assert np.isin(positions, remaining).all() and len(np.unique(positions)) == len(positions)
    if old == new:  # same world size: exactly the tail of each rank's own order
        for r in range(old):
            np.testing.assert_array_equal(rest[r][0], seq[r::old][consumed_batches * bs: used])
    # together, the consumed and the remaining samples are the epoch's samples (multiset of indices)
    everything = np.concatenate([*seen, *(i for i, _ in rest)])
    full = np.concatenate([seq[r::old][:used] for r in range(old)])
    assert np.isin(everything, full).all() and len(everything) >= len(full) - new


def test_loader_state_rejects_another_order():
    state = LoaderState(epoch=1, batches=2, batch_size=8, world_size=1, num_samples=100, seed=0)
    state.check(batch_size=8, num_samples=100, seed=0, repeats=1)
    with pytest.raises(ValueError, match="batch_size 8, this run has 16"):
        state.check(batch_size=16, num_samples=100, seed=0, repeats=1)
    LoaderState(epoch=1, batches=0, batch_size=8, world_size=1, num_samples=100, seed=0).check(
        batch_size=16, num_samples=50, seed=3, repeats=1)  # the start of an epoch fits any order
    with pytest.raises(ValueError, match="missing"):
        LoaderState.from_dict({"epoch": 0})


def test_sampler_resume_applies_to_its_epoch_only():
    s = EpochSampler(list(range(40)), batch_size=4, seed=2, keys=False)
    s.set_epoch(1)
    full = list(s)
    s.resume(LoaderState(epoch=1, batches=3, batch_size=4, world_size=1, num_samples=40, seed=2))
    assert list(s) == full[12:] and len(s) == 40
    s.set_epoch(2)
    assert len(list(s)) == 40 and list(s) != full


# ------------------------------------------------------------------------------------------------- real loaders
def _dm(backend: str, tmp_path, augment: dict | None = None, **kw) -> ImageDataModule:
    dm = ImageDataModule(dataset="fashion_mnist", backend=backend, image_size=28, batch_size=16, train_subset=160,
                         val_subset=16, crop_pct=1.0, cache_dir=str(tmp_path / "cache"),
                         augment={"scale": (0.5, 1.0), **(augment or {})}, **kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.mark.parametrize(("backend", "kw", "order"), [
    ("ffcv", {"storage": {"in_memory": True}}, "random"),
    ("ffcv", {"storage": {"in_memory": False}}, "quasi_random"),
    ("ffcv", {"storage": {"in_memory": True}, "augment": {"repeated_aug": 3}}, "repeated"),
    ("torchvision", {"num_workers": 0}, "random"),
])
def test_loader_continues_after_its_state(tmp_path, backend, kw, order):
    kw = {"num_workers": 1, **kw}
    loader = _dm(backend, tmp_path, **kw).train_dataloader()
    loader.sampler.set_epoch(2)
    batches = list(loader)
    assert len(batches) == len(loader) == 10
    loader.sampler.set_epoch(2)  # a finished FFCV iteration moves on to the next epoch by itself
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"], state["samples"], state["order"]) == (2, 4, 64, order)
    fresh = _dm(backend, tmp_path, **kw).train_dataloader()
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert len(rest) == 6
    for a, b in zip(batches[4:], rest, strict=True):
        assert torch.equal(a[1], b[1])
    if backend == "torchvision":  # the augmentation draws are per sample: the images are the same too
        assert all(torch.equal(a[0], b[0]) for a, b in zip(batches[4:], rest, strict=True))
    assert fresh.state_dict()["epoch"] == 3 and fresh.state_dict()["batches"] == 0  # the epoch is done


def test_torchvision_augmentation_does_not_depend_on_the_worker_count(tmp_path):
    """RandomResizedCrop + flip + RandAugment in 0, 1 and 2 worker processes: the same images, sample by sample."""
    def images(workers: int) -> torch.Tensor:
        dm = _dm("torchvision", tmp_path, num_workers=workers,
                 augment={"hflip": 0.5, "auto_augment": "rand-m9-mstd0.5-inc1"})
        return torch.cat([b[0] for b in dm.train_dataloader()])

    ref = images(0)
    assert torch.equal(ref, images(1)) and torch.equal(ref, images(2))
    # and they are random: the next epoch draws differently
    loader = _dm("torchvision", tmp_path, num_workers=0,
                 augment={"hflip": 0.5, "auto_augment": "rand-m9-mstd0.5-inc1"}).train_dataloader()
    loader.sampler.set_epoch(1)
    assert not torch.equal(ref, torch.cat([b[0] for b in loader]))
