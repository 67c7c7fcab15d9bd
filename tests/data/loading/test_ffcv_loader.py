"""build_ffcv_loader on real .beton files: the fused crop + resample + flip decoder mirrors exactly the images it draws
(with the requested probability) and crops with torchvision's RandomResizedCrop geometry; the loader and FFCV's import
leave torch's thread count alone; and
``normalize`` gives the reference values, contiguous, for FFCV's channels-last batches."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest
import torch

pytest.importorskip("ffcv")

from impulsevit.data.augment.device import normalize  # noqa: E402
from impulsevit.data.loading.ffcv_loader import build_ffcv_loader  # noqa: E402
from impulsevit.data.sources.image_source import ArraySource  # noqa: E402
from impulsevit.data.storage.convert import PRESETS, Preset, convert_split  # noqa: E402

pytestmark = [pytest.mark.ffcv, pytest.mark.slow]
N, S = 96, 24


@pytest.fixture(scope="module")
def asymmetric(tmp_path_factory) -> tuple[str, np.ndarray]:
    """``N`` random S×S images (no image equals its mirror), label = index, stored raw."""
    imgs = np.random.default_rng(0).integers(0, 256, (N, S, S, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("ffcv-loader") / "asym.beton"
    convert_split(ArraySource(imgs, np.arange(N), [str(i) for i in range(N)], "asym"), path, PRESETS["raw"],
                  workers=1, progress=False, log=lambda _: None)
    return str(path), imgs


def _full_crop_epoch(path: str, hflip: float, workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    loader = build_ffcv_loader(path, train=True, image_size=S, batch_size=16, num_workers=workers, hflip=hflip,
                               scale=(1.0, 1.0), ratio=(1.0, 1.0), in_memory=True, drop_last=False)
    xs, ys = zip(*[(x.permute(0, 2, 3, 1).numpy().copy(), y.numpy().copy()) for x, y in loader])
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("hflip", [0.0, 1.0])
def test_full_crop_is_the_image_or_its_mirror(asymmetric, hflip):
    path, imgs = asymmetric
    x, y = _full_crop_epoch(path, hflip)
    assert sorted(y.tolist()) == list(range(N))
    expected = imgs[y] if hflip == 0 else imgs[y][:, :, ::-1]
    np.testing.assert_array_equal(x, expected)


def test_flip_probability_and_per_image_draws(asymmetric):
    path, imgs = asymmetric
    x, y = _full_crop_epoch(path, 0.5, workers=2)
    same = np.array([np.array_equal(a, imgs[i]) for a, i in zip(x, y)])
    mirrored = np.array([np.array_equal(a, imgs[i][:, ::-1]) for a, i in zip(x, y)])
    assert np.all(same ^ mirrored)  # every image is exactly one of the two
    assert 0.3 * N < mirrored.sum() < 0.7 * N


def test_random_crops_match_ffcv_geometry(tmp_path):
    """Constant-colour columns: whatever the crop, each output column keeps one source colour, and the crop sizes
    vary (the scale range is honoured) — the decoder's crop sampler and separable resize."""
    cols = np.repeat(np.arange(0, 256, 4, dtype=np.uint8)[None, :, None], 64, axis=0)  # 64 x 64, column = 4 * j
    imgs = np.repeat(np.repeat(cols, 3, axis=2)[None], 32, axis=0)
    path = tmp_path / "cols.beton"
    convert_split(ArraySource(imgs, np.zeros(32, dtype=np.int64), ["a"], "cols"), path, PRESETS["raw"], workers=1,
                  progress=False, log=lambda _: None)
    loader = build_ffcv_loader(path, train=True, image_size=16, batch_size=32, num_workers=1, hflip=0.0,
                               scale=(0.1, 1.0), in_memory=True)
    x = next(iter(loader))[0]
    assert x.shape == (32, 3, 16, 16) and x.dtype == torch.uint8
    assert torch.equal(x, x[:, :, :1].expand_as(x))  # rows identical: vertical structure kept
    spans = (x[:, 0, 0, -1].int() - x[:, 0, 0, 0].int()).tolist()
    assert min(spans) > 0 and max(spans) - min(spans) > 40  # left-to-right increasing, crop widths differ


def test_jpeg_images_decode_through_the_fused_decoder(tmp_path):
    imgs = np.repeat(np.linspace(0, 255, 40, dtype=np.uint8)[None, None, :, None], 32, axis=1).repeat(3, 3)
    imgs = np.repeat(imgs, 8, axis=0)  # 8 images 32 x 40, horizontal ramp
    path = tmp_path / "jpg.beton"
    convert_split(ArraySource(imgs, np.zeros(8, dtype=np.int64), ["a"], "ramp"), path, Preset("jpg", "jpg"),
                  workers=1, progress=False, log=lambda _: None)
    for hflip, sign in ((0.0, 1), (1.0, -1)):
        loader = build_ffcv_loader(path, train=True, image_size=16, batch_size=8, num_workers=1, hflip=hflip,
                                   scale=(1.0, 1.0), ratio=(1.25, 1.25), in_memory=True)
        x = next(iter(loader))[0].float()
        slope = (x[..., -1] - x[..., 0]).mean().item()
        assert sign * slope > 150, (hflip, slope)


def test_loader_keeps_torch_thread_count(asymmetric):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        loader = build_ffcv_loader(asymmetric[0], train=True, image_size=S, batch_size=16, num_workers=1,
                                   in_memory=True)
        assert torch.get_num_threads() == 3
        for _ in loader:
            assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_normalize_channels_last_batch():
    x = torch.randint(0, 256, (4, 9, 7, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x = x.permute(0, 3, 1, 2)  # what FFCV's ToTorchImage returns
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    m = torch.tensor(mean).view(1, 3, 1, 1) * 255
    s = torch.tensor(std).view(1, 3, 1, 1) * 255
    out = normalize(x, mean, std)
    assert out.dtype == torch.float32 and out.is_contiguous() and out.shape == (4, 3, 9, 7)
    assert torch.equal(out, (x.float() - m) / s)
    assert torch.equal(x, x.clone())  # input untouched (uint8 stays uint8)
    f = x.float()
    assert torch.equal(normalize(f, mean, std), out) and torch.equal(f, x.float())  # float input not modified


def test_os_cached_loader_leaves_numba_types_alone(asymmetric):
    """Building an OS-cached loader must not edit numba's interned types: a function compiled before for a writable
    uint8 array still finds its compiled signature (FFCV's own OS-cache manager sets ``mutable = False`` on the shared
    ``array(uint8, 1d, C)``, which changes the hash of every key holding it)."""
    import numba

    probe = numba.njit(lambda a: a[0])
    probe(np.zeros(4, dtype=np.uint8))
    (signature,) = probe.overloads
    build_ffcv_loader(asymmetric[0], train=False, image_size=S, batch_size=16, num_workers=1, in_memory=True)
    assert signature in probe.overloads
    assert numba.uint8[::1].mutable


def test_dropped_loaders_leave_no_finalizer_errors(asymmetric, monkeypatch):
    """Iterating one OS-cached loader, building a second (train + validation, as a fit does) and dropping both
    reports no exception from a finalizer: before the fix the first decoder's compiled ``imdecode`` raised
    ``KeyError`` in numba's dispatcher finalizer when collected (``Exception ignored in: <finalize object ...>``)."""
    errors = []
    monkeypatch.setattr(sys, "unraisablehook", errors.append)
    kw = dict(image_size=8, batch_size=16, num_workers=1, in_memory=True)
    first = build_ffcv_loader(asymmetric[0], train=True, **kw)
    for _ in first:  # a whole epoch: FFCV's reader thread ends and lets the loader go
        pass
    second = build_ffcv_loader(asymmetric[0], train=False, **kw)
    collected = weakref.ref(first.loader)
    del first, second
    gc.collect()
    assert collected() is None  # the first loader and its compiled pipeline (FFCV's imdecode included) are gone
    assert not errors, [f"{e.exc_type.__name__}: {e.exc_value} ({e.err_msg} {e.object!r})" for e in errors]


@pytest.mark.ffcv
def test_building_an_ffcv_datamodule_keeps_the_process_thread_count():
    """Importing FFCV sets ``torch.set_num_threads(1)``; the training process must keep its own count (checked in a
    fresh interpreter, where FFCV is not imported yet)."""
    code = ("import torch; torch.set_num_threads(2); from impulsevit.data import ImageDataModule; "
            "ImageDataModule(dataset='digits', backend='ffcv', image_size=8); import ffcv.loader; "
            "print(torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split()[-1] == "2"
