"""The litdata backend's threaded training loader (:mod:`impulsevit.data.loading.threaded_loader`) against the
``DataLoader`` path on a real shard set (JPEG and raw images in several chunks, ``short256``): the same batches byte
for byte, with threads or without, fresh and resumed mid-epoch, and a failure in a thread raised as the source's
one-line error.

Data: 40 generated images of 40-60 px, batches of 8; seconds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from impulsevit.data.loading.litdata_backend import CropPlan, ShardDataset, ShardSource
from impulsevit.data.loading.sampling import EpochSampler, ResumableDataLoader
from impulsevit.data.loading.threaded_loader import ThreadedLoader
from impulsevit.errors import DataError

BATCH = 8


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory) -> tuple[str, np.ndarray]:
    from PIL import Image

    from impulsevit.data.sources.image_source import ArraySource
    from impulsevit.data.storage.presets import PRESETS
    from impulsevit.data.storage.shards import write_shards

    rng = np.random.default_rng(4)
    low = rng.integers(0, 256, (40, 4, 5, 3), dtype=np.uint8)
    imgs = np.stack([np.asarray(Image.fromarray(x).resize((60, 44), Image.Resampling.BICUBIC)) for x in low])
    imgs = np.clip(imgs.astype(np.int16) + rng.integers(-15, 16, imgs.shape), 0, 255).astype(np.uint8)
    src = ArraySource(imgs, np.arange(40) % 7, [str(i) for i in range(7)], "test")
    dst = str(tmp_path_factory.mktemp("threaded") / "set")
    write_shards(src, dst, PRESETS["short256"], progress=False, log=lambda _: None, chunk_bytes="24KB")
    return dst, src.labels


def _loader(shard_set, threads: int | None, *, block: bool = True, epoch: int = 1):  # noqa: ANN202
    """``threads`` None: today's ``DataLoader`` path (in this process: the worker's code, without the hop)."""
    where, labels = shard_set
    source = ShardSource(where, [str(i) for i in range(7)], labels, np.arange(40), None, "1GB", 5.0)
    if block:
        source.plan = (3, 1, 16, 2 * max(threads or 0, 1) * BATCH)
    ds = ShardDataset(source, None, seed=3, plan=CropPlan(24, train=True, interpolation="bicubic", seed=3))
    sampler = EpochSampler(ds, seed=3, batch_size=BATCH,
                           **(dict(chunk_sizes=source.chunk_sizes(), block_size=16) if block else {}))
    sampler.set_epoch(epoch)
    if threads is None:
        return ResumableDataLoader(ds, batch_size=BATCH, sampler=sampler, drop_last=True, num_workers=0,
                                   collate_fn=ds.collate_fn)
    return ThreadedLoader(ds, sampler=sampler, batch_size=BATCH, threads=threads)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) > 0 and all(
        torch.equal(x, y) and torch.equal(s, t) and x.stride() == y.stride() for (x, s), (y, t) in zip(a, b))


def test_the_batches_and_positions_are_the_dataloader_paths(shard_set):
    assert len(ShardSource(shard_set[0], [], shard_set[1], np.arange(40), None, "1GB", 5.0).chunk_table()) > 3
    for block in (True, False):
        dataloader = _loader(shard_set, None, block=block)
        reference = list(dataloader)
        assert len(reference) == 40 // BATCH
        for threads in (0, 1, 3):
            loader = _loader(shard_set, threads, block=block)
            assert len(loader) == len(reference) and loader.num_workers == threads
            assert _same(list(loader), reference), (block, threads)
            assert loader.state_dict() == dataloader.state_dict() and loader.state_dict()["epoch"] == 2
    # resumed after 2 batches of epoch 1: the rest of that epoch, as the DataLoader path resumes it
    fresh, resumed = _loader(shard_set, None), _loader(shard_set, 2, epoch=0)
    state = {**fresh.state_dict(), "batches": 2, "samples": 2 * BATCH}
    fresh.load_state_dict(state)
    resumed.load_state_dict(state)
    assert _same(list(resumed), list(fresh)) and len(list(fresh)) == 40 // BATCH - 2


def test_a_failure_in_a_thread_is_the_sources_one_line_error(shard_set, tmp_path):
    import shutil

    copy = tmp_path / "set"
    shutil.copytree(shard_set[0], copy)
    loader = _loader((str(copy), shard_set[1]), 2)
    (copy / loader.dataset.source.chunk_table()[1]["filename"]).unlink()  # a chunk gone after setup
    with pytest.raises(DataError) as threaded:
        list(loader)
    with pytest.raises(DataError) as processes:
        list(_loader((str(copy), shard_set[1]), None))
    assert str(threaded.value) == str(processes.value) and "\n" not in str(threaded.value)
