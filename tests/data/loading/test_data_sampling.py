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


def test_loader_at_an_explicit_position_is_the_hooks_loader():
    """``loader(train, LoaderPosition(epoch=e))`` (what ``impulsevit data preview`` uses, no trainer) yields the
    batches the Lightning hook yields for a trainer at epoch ``e``."""
    from types import SimpleNamespace

    import torch

    from impulsevit.data import ImageDataModule
    from impulsevit.data.loading.position import LoaderPosition

    def dm() -> ImageDataModule:
        return ImageDataModule(dataset="digits", backend="torchvision", image_size=8, batch_size=64, num_workers=0)

    hooked = dm()
    hooked.trainer = SimpleNamespace(current_epoch=2, training=False)
    a = next(iter(hooked.train_dataloader()))
    b = next(iter(dm().loader(True, LoaderPosition(epoch=2))))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="rank"):
        LoaderPosition(rank=1, world_size=1)


def test_the_trainer_is_read_in_one_place():
    """docs/design.md ("The datamodule"): the backends take a LoaderPosition and never touch a trainer; in
    ``data/loading/`` only ``position.py`` reads the trainer's epoch and loop counters (through
    ``_compat.lightning.epoch_batch_progress``)."""
    import ast
    from pathlib import Path

    import impulsevit

    loading = Path(impulsevit.__file__).parent / "data" / "loading"
    progress = {"current_epoch", "fit_loop", "batch_progress", "global_rank", "epoch_batch_progress"}
    for path in sorted(loading.glob("*.py")):
        tree = ast.parse(path.read_text())
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if path.name in ("backends.py", "ffcv_backend.py", "torchvision_backend.py"):
            assert not ({"trainer"} & (attrs | names)), f"{path.name} reads a trainer"
        if path.name != "position.py":
            assert not (progress & (attrs | names)), f"{path.name} reads {sorted(progress & (attrs | names))}"
