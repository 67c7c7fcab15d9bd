"""The device resample (``data.resample_on: device``) computes the worker path's pixels: its coefficients equal the
numba ones for every line length a crop box can have, its output equals ``resample_crop`` on random boxes (both pass
orders, up- and down-scaling, unchanged sides, flips, both filters), the canvas holds every box torchvision's
RandomResizedCrop can draw, and it runs without a host synchronisation."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from _sync_counter import SyncCounter

from impulsevit.data.loading import resample as rs
from impulsevit.data.loading.device_resample import (
    canvas_side,
    coefficients,
    pack_box,
    resample_boxes,
    resample_canvas,
    taps_for,
    unpack_canvas,
)

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("size", [224, 64, 32])
def test_coefficients_equal_the_worker_ones_for_every_line_length(size, interpolation):
    # every line a short256 canvas can hold (shorter side 256, ratio 4/3: the canvas side bounds the box sides)
    kind, longest = rs.FILTERS[interpolation], canvas_side(np.array([256]), np.array([4096]), (3 / 4, 4 / 3))
    assert longest == 344
    taps = taps_for(longest, size, kind)
    first, weights = coefficients(torch.arange(1, longest + 1), size, kind, taps)
    for n in range(1, longest + 1):
        bounds, ref = rs.coefficients(n, 0.0, float(n), size, 0, size, kind)
        assert ref.shape[1] <= taps
        assert np.array_equal(first[n - 1].numpy(), bounds[:, 0]), n
        assert np.array_equal(weights[n - 1, :, :ref.shape[1]].numpy(), ref), n
        assert not weights[n - 1, :, ref.shape[1]:].any(), n


def _random_boxes(rng: np.random.Generator, batch: int, side: int, size: int) -> tuple[np.ndarray, ...]:
    """Images larger than the canvas, boxes inside them (some sides equal to ``size``), flips."""
    images = rng.integers(0, 256, (batch, side + 5, side + 7, 3), dtype=np.uint8)
    heights, widths = rng.integers(1, side + 1, batch), rng.integers(1, side + 1, batch)
    heights[:3], widths[2:5] = size, size
    flips = rng.random(batch) < 0.5
    tops = np.array([rng.integers(0, side + 5 - h + 1) for h in heights])
    lefts = np.array([rng.integers(0, side + 7 - w + 1) for w in widths])
    return images, heights, widths, tops, lefts, flips


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("size", [32, 48])
def test_resample_equals_the_worker_resample_on_random_boxes(size, interpolation, device):
    rng, side, batch = np.random.default_rng(size), 90, 32
    images, heights, widths, tops, lefts, flips = _random_boxes(rng, batch, side, size)
    canvas = rng.integers(0, 256, (batch, side + 1, side, 3), dtype=np.uint8)  # stale memory around the boxes
    expected = np.zeros((batch, size, size, 3), dtype=np.uint8)
    for b in range(batch):
        h, w, t, left = int(heights[b]), int(widths[b]), int(tops[b]), int(lefts[b])
        canvas[b, :h, :w] = images[b, t:t + h, left:left + w]
        pack_box(canvas[b, side].reshape(-1), h, w, bool(flips[b]))
        rs.resample_crop(images[b], t, left, h, w, size, size, 0, 0, expected[b], rs.FILTERS[interpolation],
                         bool(flips[b]))
    orders = {bool(rs.vertical_first(int(h), int(w), size, size)) for h, w in zip(heights, widths)}
    assert orders == {True, False} and (heights < size).any() and (heights > size).any()
    out = resample_canvas(torch.from_numpy(canvas).to(device).permute(0, 3, 1, 2), size, interpolation)
    assert out.shape == (batch, 3, size, size) and out.dtype == torch.uint8 and out.device.type == device
    assert out.is_contiguous(memory_format=torch.channels_last)  # the layout FFCV's ToTorchImage yields
    got = out.permute(0, 2, 3, 1).cpu().numpy()
    assert [b for b in range(batch) if not np.array_equal(got[b], expected[b])] == []


def test_unpack_reads_back_what_pack_wrote():
    canvas = np.zeros((3, 301, 300, 3), dtype=np.uint8)
    boxes = [(1, 300, True), (300, 1, False), (257, 256, True)]
    for b, (h, w, f) in enumerate(boxes):
        pack_box(canvas[b, 300].reshape(-1), h, w, f)
    view, h, w, f = unpack_canvas(torch.from_numpy(canvas).permute(0, 3, 1, 2))
    assert view.shape == (3, 3, 300, 300)
    assert list(zip(h.tolist(), w.tolist(), f.tolist())) == boxes
    with pytest.raises(ValueError, match=r"canvas batch \(B, 3, K \+ 1, K\)"):
        unpack_canvas(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))


@pytest.mark.parametrize("ratio", [(3 / 4, 4 / 3), (0.2, 5.0), (1.0, 1.0)])
def test_canvas_holds_every_box_random_resized_crop_draws(ratio):
    lr0, lr1 = float(np.log(ratio[0])), float(np.log(ratio[1]))
    for height, width in [(256, 256), (256, 341), (256, 1000), (700, 256), (8, 8), (1, 50)]:
        side = canvas_side(np.array([height]), np.array([width]), ratio)
        biggest = 0
        for i in range(3000):
            scale = (0.08, 1.0) if i % 2 else (0.9, 1.0)  # large areas reach the bound and the fallback
            _, _, h, w = rs.random_resized_crop(height, width, *scale, lr0, lr1,
                                                 np.uint64(rs.sample_key(0, 0, 0, i, 0)))
            biggest = max(biggest, h, w)
        assert biggest <= side, (height, width, biggest, side)
        assert side <= max(height, width)


def test_resample_reads_nothing_back_from_the_device():
    side, size, batch = 40, 24, 8
    canvas = torch.randint(0, 256, (batch, side + 1, side, 3), dtype=torch.uint8)
    for b in range(batch):
        pack_box(canvas[b, side].view(-1).numpy(), 1 + 5 * b, side - 4 * b, b % 2 == 0)
    batch_view = canvas.permute(0, 3, 1, 2)
    counter = SyncCounter()
    with counter:
        resample_canvas(batch_view, size, "bicubic")
    assert sum(counter.ops.values()) == 0, counter.ops


def test_filters_other_than_pils_two_are_refused():
    with pytest.raises(ValueError, match="interpolation 'lanczos' is not supported"):
        resample_boxes(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), torch.ones(1, dtype=torch.long),
                       torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.bool), 4, "lanczos")


# --------------------------------------------------------------------- through FFCV, the datamodule and the CLI
@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """An ImageFolder of JPEG photos of varied sizes (some with a shorter side over 256: stored shrunk by
    ``short256``), 2 classes; 36 training and 4 validation images."""
    pytest.importorskip("ffcv")
    from PIL import Image
    from test_ffcv_pixels import photo

    root, rng = tmp_path_factory.mktemp("photos"), np.random.default_rng(3)
    for split, n in (("train", 36), ("val", 4)):
        for i in range(n):
            path = root / split / f"c{i % 2}" / f"{i:03d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo(rng, int(rng.integers(40, 330)), int(rng.integers(40, 330)))).save(path, quality=90)
    return root


def _datamodule(photos: Path, resample_on: str, size: int = 48):  # noqa: ANN202
    from impulsevit.data.loading.datamodule import ImageDataModule

    dm = ImageDataModule("imagefolder", root=str(photos), backend="ffcv", image_size=size, batch_size=8,
                         num_workers=2, cache_dir=str(photos.parent / f"{photos.name}-cache"), seed=5,
                         storage={"preset": "short256"}, resample_on=resample_on)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.mark.ffcv
def test_device_resample_yields_the_workers_training_batches(photos):
    """Same seed, two epochs: every training batch resampled on the device equals the workers' batch byte for byte
    (the canvas decoder draws the same boxes and flips, the resample computes the same pixels)."""
    batches = {}
    for where in ("workers", "device"):
        dm = _datamodule(photos, where)
        loader, out = dm.train_dataloader(), []
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            for images, labels in loader:
                if where == "device":
                    assert images.shape[2] == images.shape[3] + 1 > dm.image_size  # the canvas batch
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    out.append((dm.train_pixels(images).clone(), labels.clone()))
                said = [w for w in seen if "resample_on='device' on a CPU trainer" in str(w.message)]
                assert len(said) == (where == "device" and len(out) == 1)  # said once, on the CPU only
        batches[where] = out
    assert len(batches["workers"]) == len(batches["device"]) == 2 * (36 // 8)
    for (x, y), (xd, yd) in zip(batches["workers"], batches["device"]):
        assert x.shape == xd.shape == (8, 3, 48, 48) and torch.equal(y, yd)
        assert torch.equal(x, xd)
    assert not torch.equal(batches["workers"][0][0], batches["workers"][4][0])  # the epochs differ


@pytest.fixture(scope="module")
def photo_shards(photos) -> Path:
    """``photos`` converted to a litdata shard set at ``short256`` (train and val), as ``impulsevit convert`` writes
    it (its manifest's ``max_size`` sizes the canvas)."""
    import contextlib
    import io

    from impulsevit.data.storage import convert_cli

    dst = photos.parent / f"{photos.name}-shards"
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        for split in ("train", "val"):
            assert convert_cli.main([str(photos), str(dst), "--format", "litdata", "--split", split, "--preset",
                                     "short256", "--no-progress"]) == 0
    return dst


@pytest.mark.parametrize("loader", ["threads", "processes"])
def test_litdata_device_resample_yields_the_workers_training_batches(photo_shards, loader):
    """The litdata backend with ``resample_on='device'``: its loader (threads, or worker processes) hands on canvas
    batches sized by the manifest's ``max_size``, and the datamodule's device resample of each equals the batch the
    same loader builds with ``resample_on='workers'``, byte for byte, over two epochs."""
    from impulsevit.data.loading.datamodule import ImageDataModule
    from impulsevit.data.loading.position import LoaderPosition
    from impulsevit.data.storage.shards import read_shards_manifest

    height, width = read_shards_manifest(str(photo_shards / "train"))["max_size"]
    assert 256 < max(height, width) < 330  # the largest stored sides, per axis: short256 kept a long side
    side = canvas_side(np.array([height]), np.array([width]), (3 / 4, 4 / 3))
    batches = {}
    for where in ("workers", "device"):
        dm = ImageDataModule("imagefolder", root=str(photo_shards), backend="litdata", image_size=48, batch_size=8,
                             num_workers=2, seed=5, storage={"loader": loader}, resample_on=where)
        dm.setup("fit")
        out = []
        for epoch in range(2):
            for images, labels in dm.loader(True, LoaderPosition(epoch=epoch, batches_done=0, rank=0, world_size=1)):
                if where == "device":
                    assert images.shape == (8, 3, side + 1, side)  # the canvas batch
                    images = dm.train_pixels(images)
                out.append((images.clone(), labels.clone()))
        batches[where] = out
    assert len(batches["workers"]) == len(batches["device"]) == 2 * (36 // 8)
    for (x, y), (xd, yd) in zip(batches["workers"], batches["device"]):
        assert x.shape == xd.shape == (8, 3, 48, 48) and torch.equal(y, yd) and torch.equal(x, xd)
    assert not torch.equal(batches["workers"][0][0], batches["workers"][4][0])  # the epochs differ


def test_litdata_device_resample_refuses_what_it_cannot_resample_before_work(photo_shards):
    """Transforms after the crop (RandAugment) run on the crop in the litdata workers: ``resample_on='device'``
    is a one-line ConfigError naming both keys when the datamodule is set up, before any batch."""
    from impulsevit.data.loading.datamodule import ImageDataModule
    from impulsevit.errors import ConfigError

    dm = ImageDataModule("imagefolder", root=str(photo_shards), backend="litdata", image_size=48, batch_size=8,
                         num_workers=0, augment={"auto_augment": "rand-m9-mstd0.5"}, resample_on="device")
    with pytest.raises(ConfigError, match=r"data.resample_on='device' on the litdata backend .*RandAugment.* "
                                          r"use data.resample_on=workers$"):
        dm.setup("fit")


@pytest.mark.ffcv
@pytest.mark.parametrize(("options", "expected"), [
    (dict(resample_on="gpu"), "data.resample_on must be 'workers' or 'device', got 'gpu'"),
    (dict(resample_on="device", backend="torchvision"),
     "data.resample_on='device' needs backend='ffcv' or 'litdata' (the torchvision backend resizes in its workers), "
     "got backend='torchvision'"),
])
def test_bad_resample_on_is_a_config_error_naming_the_key(photos, options, expected):
    from impulsevit.data.loading.datamodule import ImageDataModule
    from impulsevit.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(expected)):
        ImageDataModule("imagefolder", root=str(photos), image_size=32, **{"backend": "ffcv", **options})


class CaptureInputs(L.Callback):
    """Keeps every training batch as the model receives it (after ``on_after_batch_transfer``)."""

    def __init__(self) -> None:
        self.inputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:  # noqa: ANN001
        self.inputs.append((batch[0].detach().clone(), batch[1].clone()))


@pytest.mark.slow  # two short CLI fits on CPU
@pytest.mark.parametrize("backend", [pytest.param("ffcv", marks=pytest.mark.ffcv), "litdata"])
def test_fit_through_the_cli_feeds_the_model_the_same_batches(photos, photo_shards, backend, tmp_path):
    from _cli_helpers import run_cli, tiny

    captured = {}
    for where in ("workers", "device"):
        root, storage = (photos, {"preset": "short256"}) if backend == "ffcv" else (photo_shards, {})
        data = {"class_path": "impulsevit.data.ImageDataModule",
                "init_args": {"dataset": "imagefolder", "root": str(root), "backend": backend, "image_size": 32,
                              "batch_size": 8, "num_workers": 1, "cache_dir": str(tmp_path / "cache"), "seed": 1,
                              "storage": storage, "resample_on": where}}
        cli = run_cli(*tiny(tmp_path / "runs", where, f"--data={json.dumps(data)}", "--trainer.max_epochs=2",
                            "--trainer.limit_val_batches=0", "--trainer.callbacks+=test_device_resample.CaptureInputs"))
        captured[where] = next(c for c in cli.trainer.callbacks if isinstance(c, CaptureInputs)).inputs
    assert len(captured["workers"]) == len(captured["device"]) == 2 * (36 // 8)
    for (x, y), (xd, yd) in zip(captured["workers"], captured["device"]):
        assert x.shape == (8, 3, 32, 32) and torch.equal(y, yd) and torch.equal(x, xd)
