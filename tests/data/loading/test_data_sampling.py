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


# ------------------------------------------------------------------------------------------------------ block order
CHUNKS = [7, 5, 9, 0, 6, 8, 7, 5, 6, 7]  # 60 samples in 10 chunks of consecutive samples (one empty)


def _chunk_of(sizes: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(sizes)), sizes)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_block_order_is_a_pure_function_dealing_whole_chunks_a_block_at_a_time(world):
    from impulsevit.data.loading.sampling import block_sequence, samples_per_rank

    n, block = sum(CHUNKS), 12
    seq, per_rank = block_sequence(CHUNKS, epoch=3, seed=7, world_size=world, block_size=block)
    again, _ = block_sequence(CHUNKS, epoch=3, seed=7, world_size=world, block_size=block)
    other, _ = block_sequence(CHUNKS, epoch=4, seed=7, world_size=world, block_size=block)
    assert np.array_equal(seq, again) and not np.array_equal(seq, other)
    assert per_rank == samples_per_rank(n, world) and len(seq) == per_rank * world
    counts = np.bincount(seq, minlength=n)
    assert counts.min() == 1 and counts.sum() - n == per_rank * world - n  # every sample, the padding aside
    chunk = _chunk_of(CHUNKS)
    ranks_of_chunk: dict[int, set[int]] = {}
    for r in range(world):
        order = seq[r::world]
        blocks = [chunk[order[lo:lo + block]] for lo in range(0, per_rank, block)]
        for b, chunks in enumerate(blocks):
            assert len(set(chunks)) <= block // min(c for c in CHUNKS if c) + 2  # a few chunks live per block
            assert not np.array_equal(order[b * block:(b + 1) * block],
                                      np.sort(order[b * block:(b + 1) * block]))  # shuffled within the block
        for c in set(chunk[order]):  # a chunk is read within two consecutive blocks of a rank
            where = [b for b, chunks in enumerate(blocks) if c in chunks]
            assert where == list(range(where[0], where[0] + len(where))) and len(where) <= 2
            ranks_of_chunk.setdefault(int(c), set()).add(r)
    assert max(len(v) for v in ranks_of_chunk.values()) <= 2  # only the chunks cut between two ranks are shared
    with pytest.raises(ValueError, match="block_size >= 1"):
        block_sequence(CHUNKS, epoch=0, seed=0, block_size=0)


def test_a_chunk_cut_between_two_ranks_is_read_by_both_in_the_same_block():
    from impulsevit.data.loading.sampling import block_sequence

    seq, per_rank = block_sequence(CHUNKS, epoch=1, seed=2, world_size=2, block_size=10)
    chunk = _chunk_of(CHUNKS)
    shared = set(chunk[seq[0::2]]) & set(chunk[seq[1::2]])
    assert len(shared) == 1
    (c,) = shared
    first_block = [set(chunk[seq[r::2][:10]]) for r in (0, 1)]
    assert c in first_block[0] and c in first_block[1]  # both read it at the start of the epoch


@pytest.mark.parametrize("batches", [0, 1, 3, 5])
def test_block_order_resumes_at_any_batch_with_the_rest_of_the_same_order(batches):
    from impulsevit.data.loading.sampling import EpochSampler, LoaderState, ResumableDataLoader

    ds = list(range(sum(CHUNKS)))
    for world in (1, 2):
        for rank in range(world):
            kw = dict(num_replicas=world, rank=rank, seed=4, batch_size=4, chunk_sizes=CHUNKS, block_size=16)
            full = EpochSampler(ds, **kw)
            full.set_epoch(2)
            whole = list(full)
            loader = ResumableDataLoader(ds, sampler=EpochSampler(ds, **kw), batch_size=4, drop_last=True)
            state = LoaderState(epoch=2, batches=batches, batch_size=4, world_size=world, num_samples=len(ds), seed=4,
                                order="block", block_size=16)
            loader.load_state_dict(state.to_dict())
            used = len(whole) // 4 * 4
            assert list(loader.sampler) == (whole[batches * 4:used] if batches else whole)
            assert loader.state_dict()["order"] == "block"


def test_a_block_order_state_does_not_resume_another_order():
    from impulsevit.data.loading.sampling import EpochSampler, LoaderState, ResumableDataLoader
    from impulsevit.errors import ConfigError

    ds = list(range(sum(CHUNKS)))
    state = LoaderState(epoch=0, batches=2, batch_size=4, world_size=1, num_samples=len(ds), seed=0, order="block",
                        block_size=16)
    plain = ResumableDataLoader(ds, sampler=EpochSampler(ds, batch_size=4), batch_size=4, drop_last=True)
    with pytest.raises(ConfigError, match="'block' order, this run's is 'random'"):
        plain.load_state_dict(state.to_dict())
    other = ResumableDataLoader(ds, sampler=EpochSampler(ds, batch_size=4, chunk_sizes=CHUNKS, block_size=8),
                                batch_size=4, drop_last=True)
    with pytest.raises(ConfigError, match="block_size 16, this run has 8"):
        other.load_state_dict(state.to_dict())


def test_block_order_after_a_world_size_change_repeats_and_skips_nothing():
    from impulsevit.data.loading.sampling import block_sequence, resumed_shard

    seq, per_rank = block_sequence(CHUNKS, epoch=0, seed=1, world_size=2, block_size=16)
    consumed = 2 * 4
    done = np.concatenate([seq[r::2][:consumed] for r in (0, 1)])
    rest = [resumed_shard(seq, per_rank, old_world=2, consumed=consumed, batch_size=4, rank=r, world_size=3)[0]
            for r in range(3)]
    seen = np.concatenate([done, *rest])
    assert len(set(seen.tolist())) == len(seen)  # nothing twice
    assert len(seen) >= per_rank // 4 * 4 * 2 - 2  # nothing skipped beyond the W_new - 1 rounding


def test_shuffle_quality_counts_distinct_labels_per_batch_and_grows_with_the_block():
    from impulsevit.data.loading.sampling import block_sequence, distinct_per_batch, epoch_sequence

    labels = np.repeat(np.arange(40), 50)  # 2,000 samples stored in class order, chunks of 25 (half a class each)
    chunks = [25] * 80
    assert distinct_per_batch(np.arange(8), labels, 4) == 1.0  # sorted: one class per batch
    spread = {b: distinct_per_batch(block_sequence(chunks, epoch=0, seed=0, block_size=b)[0], labels, 32)
              for b in (50, 200, 2000)}
    glob = distinct_per_batch(epoch_sequence(2000, epoch=0, seed=0)[0], labels, 32)
    assert spread[50] < spread[200] < spread[2000] <= glob + 1 and spread[50] <= 4
    with pytest.raises(ValueError, match="one full batch"):
        distinct_per_batch(np.arange(3), labels, 4)
