"""The FFCV path feeds the model timm's pixels: the decoder's resampler equals Pillow's, the eval tensors of a real
.beton match ``timm.data.create_transform`` on the source files (32 px images enlarged to 224, and full-size photos
stored with the large-image recipes' preset), train and eval share the kernel, augmentation draws are a function of
(seed, epoch, sample index) only, and a batch survives the next ``next()``."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

pytest.importorskip("ffcv")

from impulsevit.data.loading.datamodule import ImageDataModule  # noqa: E402
from impulsevit.data.loading.ffcv_loader import build_ffcv_loader  # noqa: E402
from impulsevit.data.loading.resample import BICUBIC, BILINEAR, resample_crop  # noqa: E402
from impulsevit.data.sources.image_source import ArraySource  # noqa: E402
from impulsevit.data.storage.convert import PRESETS, convert_split  # noqa: E402

pytestmark = [pytest.mark.ffcv, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]


def photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A photo-like ``(h, w, 3)`` uint8 image: smooth colour field, a few hard-edged shapes, mild noise."""
    low = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(low).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float64)
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(4):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(0.1, 0.3) * min(h, w)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.integers(0, 256, 3)
    x0 = int(rng.integers(0, w // 2))
    img[:, x0:x0 + max(2, w // 20)] = rng.integers(0, 256, 3)
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def timm_eval(path: Path, size: int, crop_pct: float, interpolation: str) -> np.ndarray:
    """timm's reference eval transform (uint8 CHW in prefetcher mode) on the file → ``(S, S, 3)``."""
    from timm.data import create_transform

    tf = create_transform(size, is_training=False, interpolation=interpolation, crop_pct=crop_pct,
                          use_prefetcher=True)
    with Image.open(path) as im:
        return tf(im.convert("RGB")).permute(1, 2, 0).numpy()


def val_epoch(dm: ImageDataModule) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = zip(*[(x.permute(0, 2, 3, 1).numpy().copy(), y.numpy().copy()) for x, y in dm.val_dataloader()])
    return np.concatenate(xs), np.concatenate(ys)


def image_folder(root: Path, shapes: list[tuple[int, int]], fmt: str = "png", seed: int = 0) -> list[Path]:
    """``root/{train,val}/c{0,1}/*.{fmt}`` with one image per shape in val (sorted paths returned), 2 in train."""
    rng = np.random.default_rng(seed)
    paths = []
    for split, items in (("val", shapes), ("train", shapes[:2])):
        for i, (h, w) in enumerate(items):
            p = root / split / f"c{i % 2}" / f"{i:03d}.{fmt}"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo(rng, h, w)).save(p, **({"quality": 95} if fmt == "jpg" else {}))
            if split == "val":
                paths.append(p)
    return sorted(paths, key=lambda q: (q.parent.name, q.name))


def recipe_data_args(name: str) -> dict:
    return dict(yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())["data"]["init_args"])


# ------------------------------------------------------------------------------------------------ resampler vs Pillow
def test_resampler_equals_pillow_on_crops():
    rng = np.random.default_rng(0)
    for trial in range(60):
        H, W = (int(v) for v in rng.integers(4, 90, 2))
        img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
        top, left = int(rng.integers(0, H)), int(rng.integers(0, W))
        h, w = int(rng.integers(1, H - top + 1)), int(rng.integers(1, W - left + 1))
        oh, ow = (int(v) for v in rng.integers(1, 120, 2))
        kind = (BICUBIC, BILINEAR)[trial % 2]
        pil = Image.Resampling.BICUBIC if kind == BICUBIC else Image.Resampling.BILINEAR
        ref = np.asarray(Image.fromarray(img).crop((left, top, left + w, top + h)).resize((ow, oh), pil))
        out = np.zeros((oh, ow, 3), np.uint8)
        resample_crop(img, top, left, h, w, oh, ow, 0, 0, out, kind)
        if oh < h and ow < w:  # Pillow 13 picks the pass order by its own rule here: a few levels at most
            assert psnr(out, ref) > 40, (trial, H, W, h, w, oh, ow)
        else:
            np.testing.assert_array_equal(out, ref, err_msg=str((trial, H, W, top, left, h, w, oh, ow, kind)))


@pytest.mark.parametrize("out_shape", [(40, 56), (20, 11), (30, 64), (30, 17), (64, 17), (20, 64)],
                         ids=["enlarge", "shrink-both", "width-only", "none", "height-only", "shrink-h-enlarge-w"])
def test_flipped_resample_equals_pillow_flip(out_shape):
    """``flip=True`` is the unflipped output mirrored left-right (Pillow's resize then ``FLIP_LEFT_RIGHT``), whichever
    passes run: both (either order), horizontal or vertical alone, or none."""
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)
    top, left, h, w = 7, 5, 30, 17
    oh, ow = out_shape
    for kind, pil in ((BICUBIC, Image.Resampling.BICUBIC), (BILINEAR, Image.Resampling.BILINEAR)):
        plain = np.zeros((oh, ow, 3), np.uint8)
        flipped = np.zeros((oh, ow, 3), np.uint8)
        resample_crop(img, top, left, h, w, oh, ow, 0, 0, plain, kind)
        resample_crop(img, top, left, h, w, oh, ow, 0, 0, flipped, kind, True)
        np.testing.assert_array_equal(flipped, plain[:, ::-1])
        ref = np.asarray(Image.fromarray(img).crop((left, top, left + w, top + h)).resize((ow, oh), pil)
                         .transpose(Image.Transpose.FLIP_LEFT_RIGHT))
        if not (oh < h and ow < w):  # see test_resampler_equals_pillow_on_crops for Pillow's own pass order
            np.testing.assert_array_equal(flipped, ref)


# ------------------------------------------------------------------------------------------------ eval pixels vs timm
def test_small_images_enlarged_like_timm(tmp_path):
    """32 px photos → 224 with vit_tiny_cifar10's data settings (dataset switched to an ImageFolder; stored raw as
    that recipe's CIFAR-10 is): FFCV val tensors vs timm's bicubic reference."""
    paths = image_folder(tmp_path / "imgs", [(32, 32)] * 12)
    args = recipe_data_args("vit_tiny_cifar10")
    dm = ImageDataModule("imagefolder", root=str(tmp_path / "imgs"), backend=args["backend"],
                         image_size=args["image_size"], crop_pct=args["crop_pct"],
                         interpolation=args["interpolation"], batch_size=8, num_workers=1,
                         storage={"preset": "raw"}, cache_dir=str(tmp_path / "cache"))
    assert dm.backend == "ffcv"
    dm.prepare_data()
    dm.setup("validate")
    x, y = val_epoch(dm)
    assert x.shape == (12, 224, 224, 3)
    ref = np.stack([timm_eval(p, 224, args["crop_pct"], args["interpolation"]) for p in paths])
    np.testing.assert_array_equal(y, [int(p.parent.name[1:]) for p in paths])
    scores = [psnr(a, b) for a, b in zip(x, ref)]
    assert np.median(scores) >= 38 and min(scores) >= 32, scores


def test_full_size_photos_keep_the_eval_resolution(tmp_path):
    """Photos of 300–1400 px, several aspect ratios, through deit_base_in1k's data settings (its preset, crop_pct,
    interpolation): the stored short side × crop_pct reaches 224 for every image whose short side is ≥ 256, and the
    val tensors match timm's reference on the source JPEGs."""
    from ffcv.reader import Reader

    shapes = [(300, 400), (375, 500), (500, 333), (1400, 300), (640, 1280), (256, 256), (480, 640), (1000, 750),
              (333, 500), (720, 960)]
    paths = image_folder(tmp_path / "imgs", shapes, fmt="jpg")
    args = recipe_data_args("deit_base_in1k")
    dm = ImageDataModule("imagefolder", root=str(tmp_path / "imgs"), backend=args["backend"],
                         image_size=args["image_size"], crop_pct=args["crop_pct"],
                         interpolation=args["interpolation"], storage={"preset": args["storage"]["preset"]},
                         batch_size=8, num_workers=1, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    dm.setup("validate")
    meta = Reader(str(dm.data_backend.beton_path(dm.val_split))).metadata["f0"]
    for p, stored_h, stored_w in zip(paths, meta["height"], meta["width"]):
        with Image.open(p) as im:
            source_short = min(im.size)
        if source_short >= 256:
            assert min(stored_h, stored_w) * args["crop_pct"] >= 224, (p.name, im.size, stored_h, stored_w)
    x, _ = val_epoch(dm)
    scores = [psnr(a, timm_eval(p, 224, args["crop_pct"], args["interpolation"])) for a, p in zip(x, paths)]
    assert np.median(scores) >= 30 and min(scores) >= 25, scores


# ------------------------------------------------------------------------------------------------ train pipeline
@pytest.fixture(scope="module")
def squares(tmp_path_factory) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(1)
    imgs = np.stack([photo(rng, 40, 40) for _ in range(24)])
    path = tmp_path_factory.mktemp("pixels") / "sq.beton"
    convert_split(ArraySource(imgs, np.arange(24), [str(i) for i in range(24)], "sq"), path, PRESETS["raw"],
                  workers=1, progress=False, log=lambda _: None)
    return str(path), imgs


def _by_label(loader) -> dict[int, np.ndarray]:  # noqa: ANN001
    return {int(b): a.permute(1, 2, 0).numpy().copy() for x, y in loader for a, b in zip(x, y)}


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_train_full_crop_equals_eval_resize(squares, interpolation):
    """scale = ratio = 1 and no flip: the train output is the eval-style resize of the whole image (same kernel),
    which is PIL's resize of it."""
    path, imgs = squares
    kw = dict(image_size=64, batch_size=8, num_workers=1, in_memory=True, interpolation=interpolation)
    train = _by_label(build_ffcv_loader(path, train=True, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0,
                                        drop_last=False, **kw))
    evaluate = _by_label(build_ffcv_loader(path, train=False, crop_pct=1.0, **kw))
    assert sorted(train) == sorted(evaluate) == list(range(24))
    pil = Image.Resampling.BICUBIC if interpolation == "bicubic" else Image.Resampling.BILINEAR
    for i in range(24):
        np.testing.assert_array_equal(train[i], evaluate[i])
        np.testing.assert_array_equal(train[i], np.asarray(Image.fromarray(imgs[i]).resize((64, 64), pil)))


def _epoch_digest(path: str, workers: int, epoch: int) -> str:
    loader = build_ffcv_loader(path, train=True, image_size=32, batch_size=8, num_workers=workers, in_memory=True,
                               seed=3)
    loader.set_epoch(epoch)
    h = hashlib.sha256()
    for x, y in loader:
        h.update(x.contiguous().numpy().tobytes())
        h.update(y.numpy().tobytes())
    return h.hexdigest()


@pytest.mark.slow  # numba compiles the 2-thread (parallel) decoder: ~30-60 s on 2 busy cores
def test_draws_depend_on_seed_epoch_and_index_only(squares):
    path, _ = squares
    one = _epoch_digest(path, 1, 0)
    assert _epoch_digest(path, 2, 0) == one  # thread count and scheduling do not matter
    assert _epoch_digest(path, 1, 1) != one  # a new epoch draws anew
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from test_ffcv_pixels import _epoch_digest; "
            "print(_epoch_digest(sys.argv[2], 1, 0))")
    here = str(Path(__file__).resolve().parent)  # this file's folder: the child imports it
    fresh = subprocess.run([sys.executable, "-c", code, here, path], capture_output=True, text=True, check=True,
                           timeout=300)
    assert fresh.stdout.strip().splitlines()[-1] == one  # and the same in a fresh process


def test_same_image_gets_independent_draws_within_an_epoch(squares):
    """Crops differ between samples and epochs (the keys are not degenerate); flips happen about half the time."""
    path, _ = squares
    loader = build_ffcv_loader(path, train=True, image_size=32, batch_size=8, num_workers=1, in_memory=True)
    a = _by_label(loader)
    b = _by_label(loader)  # next epoch
    assert sum(not np.array_equal(a[i], b[i]) for i in a) == len(a)


def test_batch_survives_the_next_fetch(squares):
    """Lightning holds batch k while it fetches k + 1: FFCV's decoder must not refill batch k's buffer meanwhile
    (the producer is given time to run as far ahead as it can)."""
    path, _ = squares
    loader = build_ffcv_loader(path, train=True, image_size=32, batch_size=4, num_workers=1, in_memory=True,
                               batches_ahead=1)
    it = iter(loader)
    held, copies = [], []
    for _ in range(len(loader)):
        batch = next(it)
        held.append(batch)
        copies.append((batch[0].clone(), batch[1].clone()))
        time.sleep(0.05)
        if len(held) == 2:
            x, y = held.pop(0)
            cx, cy = copies.pop(0)
            assert torch.equal(x, cx) and torch.equal(y, cy)


def test_short_side_preset_caps_the_shorter_side(tmp_path):
    """``short256`` (the CLI default for image folders): shorter side 256 when longer, aspect kept, small images
    untouched; the stored pixels are PIL's bicubic resize of the source (raw-stored images exactly)."""
    from ffcv.reader import Reader

    from impulsevit.data.storage.convert import manifest_path
    from impulsevit.data.storage.convert_cli import main

    rng = np.random.default_rng(2)
    shapes = [(300, 520), (700, 400), (200, 100)]
    imgs = [photo(rng, h, w) for h, w in shapes]
    for j, img in enumerate(imgs):
        p = tmp_path / "src" / "x" / f"{j}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p)
    assert main([str(tmp_path / "src"), str(tmp_path / "o.beton"), "--jpeg-proportion", "0", "--no-progress",
                 "--workers", "1"]) == 0
    assert json.loads(manifest_path(tmp_path / "o.beton").read_text())["preset"]["name"] == "short256+custom"
    reader = Reader(str(tmp_path / "o.beton"))
    meta = reader.metadata["f0"]
    assert list(zip(meta["height"], meta["width"])) == [(256, 444), (448, 256), (200, 100)]
    loader = build_ffcv_loader(tmp_path / "o.beton", train=False, image_size=64, batch_size=3, num_workers=1,
                               crop_pct=1.0, in_memory=True)
    x = next(iter(loader))[0].permute(0, 2, 3, 1).numpy()
    for img, out in zip(imgs, x):  # eval of the stored image == timm's eval of the source, via the stored resize
        stored = PRESETS["short256"].shrink(img)
        ref = np.asarray(Image.fromarray(stored).resize((64 * stored.shape[1] // min(stored.shape[:2]), 64)
                                                        if stored.shape[0] <= stored.shape[1] else
                                                        (64, 64 * stored.shape[0] // min(stored.shape[:2])),
                                                        Image.Resampling.BICUBIC))
        top, left = int(round((ref.shape[0] - 64) / 2.0)), int(round((ref.shape[1] - 64) / 2.0))  # torchvision
        assert psnr(out, ref[top:top + 64, left:left + 64]) > 40


@pytest.mark.parametrize("backend", ["torchvision", "ffcv"])
def test_16_bit_pngs_are_scaled_not_clipped(tmp_path, backend):
    """Real 16-bit grayscale PNGs (PIL mode ``I;16``): the pixels reach the model as round(v / 257) on both backends,
    not clipped at 255 (which made nearly every pixel white)."""
    rng = np.random.default_rng(0)
    expected = []
    for split in ("train", "val"):
        for c in ("a", "b"):
            for j in range(2):
                p = tmp_path / "imgs" / split / c / f"{j}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                wide = rng.integers(0, 65536, (32, 32), dtype=np.uint16)
                Image.fromarray(wide).save(p)
                if split == "val":
                    expected.append(np.rint(wide / 257.0).astype(np.uint8))
    with Image.open(tmp_path / "imgs" / "val" / "a" / "0.png") as im:
        assert im.mode.startswith("I")  # what PIL makes of a 16-bit PNG
    dm = ImageDataModule("imagefolder", root=str(tmp_path / "imgs"), backend=backend, image_size=32, crop_pct=1.0,
                         batch_size=8, num_workers=0 if backend == "torchvision" else 1, storage={"preset": "raw"},
                         cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    dm.setup("validate")
    x, y = val_epoch(dm)
    np.testing.assert_array_equal(y, [0, 0, 1, 1])
    for got, want in zip(x, expected):
        for channel in range(3):
            np.testing.assert_array_equal(got[:, :, channel], want)
