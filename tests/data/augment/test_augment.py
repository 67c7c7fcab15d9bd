"""Device-side augmentation against timm/torchvision on the same inputs: every RandAugment op at fixed magnitudes
(pixel-level), the whole ``rand-m9-mstd0.5-inc1`` policy and colour jitter in distribution (two-sample KS tests),
normalisation, random erasing and per-rank RNG streams."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch
from _scripts import load_script
from PIL import Image
from scipy.stats import ks_2samp
from timm.data.auto_augment import _HPARAMS_DEFAULT, LEVEL_TO_ARG, NAME_TO_OP

from impulsevit.data.augment.color_jitter import BatchColorJitter
from impulsevit.data.augment.device import DeviceAugment
from impulsevit.data.augment.ops import affine, normalize
from impulsevit.data.augment.rand_augment import _GEOMETRIC, BatchRandAugment

MEAN = (0.485, 0.456, 0.406)
FILL = tuple(round(255 * m) for m in MEAN)


def natural_images(n: int, size: int = 32, seed: int = 0) -> np.ndarray:
    """Smooth random images with some texture: (n, size, size, 3) uint8."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 5, 5, generator=g)
    x = torch.nn.functional.interpolate(low, size=(size, size), mode="bicubic", align_corners=False)
    x = (x * 200 + 28 + 12 * torch.randn(n, 3, size, size, generator=g)).clamp(0, 255).round()
    return x.permute(0, 2, 3, 1).to(torch.uint8).numpy()


def to_batch(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(arr).permute(0, 3, 1, 2).float()


def _load_benchmark():
    """``benchmarks/aug_fidelity.py`` as a module (its photos and pipelines are what these tests check)."""
    return load_script("benchmarks/aug_fidelity.py")


BENCH = _load_benchmark()
OPS = BatchRandAugment("rand-m9-mstd0.5-inc1").names  # the 15 ops `inc1` draws from
SIGNED = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel", "ColorIncreasing", "ContrastIncreasing",
          "BrightnessIncreasing", "SharpnessIncreasing")


@pytest.fixture(scope="module")
def photos():
    return BENCH.photos(96)[::4]  # the centred square of each of the three photos


def _timm_args(name: str, magnitude: float, sign: float) -> tuple:
    """timm's op arguments at ``magnitude`` with its random sign draw forced to ``sign``."""
    level_fn = LEVEL_TO_ARG[name]
    if level_fn is None:
        return ()
    draw = random.random
    random.random = (lambda: 0.75) if sign < 0 else (lambda: 0.25)  # _randomly_negate: negative when > 0.5
    try:
        args = level_fn(magnitude, dict(_HPARAMS_DEFAULT, translate_pct=0.45))
    finally:
        random.random = draw
    return (max(1, args[0]),) if name.startswith("Posterize") else args  # Pillow >= 11: at least 1 bit (augment.py)


@pytest.mark.parametrize(("name", "interpolation"), [(n, "bicubic") for n in OPS]
                         + [(n, "bilinear") for n in OPS if n in _GEOMETRIC])
def test_every_op_matches_timms_pil_op_on_photos(name, interpolation, photos):
    """Each op at magnitudes 0, 5, 9, 10 and both signs on real photos vs timm's PIL op with the same interpolation
    and timm's fill colour (the mean): every pixel within one uint8 level and PSNR >= 65 dB. The remaining
    differences are float32 (device) vs PIL's double arithmetic (blend factors, interpolation tap sums) landing on
    the other side of an integer truncation."""
    ra = BatchRandAugment("rand-m9-mstd0.5-inc1", img_mean=MEAN, interpolation=interpolation)
    resample = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}[interpolation]
    x = to_batch(photos)
    for magnitude in (0.0, 5.0, 9.0, 10.0):
        for sign in ((1.0, -1.0) if name in SIGNED else (1.0,)):
            args = _timm_args(name, magnitude, sign)
            expected = np.stack([np.asarray(NAME_TO_OP[name](Image.fromarray(a), *args, fillcolor=FILL,
                                                             resample=resample), dtype=np.float32) for a in photos])
            level = torch.full((len(x),), magnitude / 10, dtype=torch.float64)  # as timm: Python floats
            signs = torch.full((len(x),), sign, dtype=torch.float64)
            if name in _GEOMETRIC:
                got = affine(x, ra._matrix(name, level, signs, *x.shape[-2:]), torch.tensor(FILL).float(),
                              interpolation)
            else:
                got = ra._pointwise(name, x, level, signs)
            diff = got.permute(0, 2, 3, 1).numpy() - expected
            psnr = 10 * np.log10(255**2 / max(float((diff**2).mean()), 1e-12))
            assert np.abs(diff).max() <= 1 and psnr >= 65, (name, magnitude, sign, args, psnr)


def test_geometric_fill_and_edges_follow_pil():
    """A sample point outside the image gets the fill colour with a hard edge (PIL), inside the neighbours are
    clamped: translating a constant image by a fraction of a pixel keeps every covered pixel exact."""
    x = torch.full((1, 3, 8, 8), 200.0)
    mats = torch.eye(3).unsqueeze(0).clone()
    mats[0, 0, 2] = 2.5  # output column j samples input x = j + 0.5 + 2.5
    out = affine(x, mats, torch.tensor(FILL).float(), "bicubic")[0]
    assert torch.equal(out[:, :, :5], torch.full((3, 8, 5), 200.0))
    assert torch.equal(out[:, :, 5:], torch.tensor(FILL).float().view(3, 1, 1).expand(3, 8, 3))


@pytest.mark.parametrize("broken", [None, "fill0", "p1", "mstd0"])
def test_fidelity_benchmark_passes_and_catches_wrong_implementations(broken):
    """``benchmarks/aug_fidelity.py`` on 200 samples of 64 px photos (the DeiT policy + erasing): both backends
    within the limit, and the deliberately wrong device pipelines (black fill, every op applied, no magnitude noise)
    beyond it. bilinear-for-bicubic is below what 200 or 400 samples resolve: the per-op test above catches it."""
    ratio = BENCH.compare(200, 64, broken, verbose=False, jitter=(False,), extras=False,
                          torchvision=broken is None)
    assert (ratio <= 1.0) == (broken is None), (broken, ratio)


def test_color_jitter_matches_torchvision_in_distribution():
    from torchvision.transforms import ColorJitter

    n = 400
    imgs = np.repeat(natural_images(8, seed=4), n // 8, axis=0)
    torch.manual_seed(0)
    tv = ColorJitter(0.4, 0.4, 0.4)
    ref = np.stack([np.asarray(tv(Image.fromarray(a))) for a in imgs]).astype(np.float32)
    ours = BatchColorJitter(0.4)(to_batch(imgs), generator=torch.Generator().manual_seed(0)).permute(0, 2, 3, 1).numpy()
    for stat in (lambda x: x.reshape(n, -1).mean(1), lambda x: x.reshape(n, -1).std(1),
                 lambda x: np.abs(x - x.mean(-1, keepdims=True)).reshape(n, -1).mean(1)):  # brightness/contrast/sat.
        assert ks_2samp(stat(ref), stat(ours)).pvalue > 0.01


def test_normalize_and_device_augment_chain():
    x = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8)
    out = normalize(x, MEAN, (0.229, 0.224, 0.225))
    assert out.dtype == torch.float32
    expected = (x[:, 1].float() / 255 - 0.456) / 0.224
    torch.testing.assert_close(out[:, 1], expected)
    plain = DeviceAugment(MEAN, (0.229, 0.224, 0.225))
    torch.testing.assert_close(plain(x), out)
    full = DeviceAugment(MEAN, (0.229, 0.224, 0.225), auto_augment="rand-m9-mstd0.5-inc1", re_prob=1.0)
    state = random.getstate()
    y = full(x)
    assert random.getstate() == state  # random erasing used a private python RNG
    assert y.shape == x.shape and y.dtype == torch.float32 and torch.isfinite(y).all()
    erased = (y - out).abs().amax(dim=1) > 1e-6
    assert erased.flatten(1).any(1).all()  # every image changed somewhere (re_prob=1)


def test_color_jitter_is_off_with_randaugment_unless_forced():
    std = (0.229, 0.224, 0.225)
    assert DeviceAugment(MEAN, std, auto_augment="rand-m9", color_jitter=0.4).color_jitter is None
    assert DeviceAugment(MEAN, std, auto_augment="rand-m9", color_jitter=0.4, force_color_jitter=True).color_jitter
    assert DeviceAugment(MEAN, std, color_jitter=0.4).color_jitter is not None


def test_ranks_draw_different_augmentations_and_seeds_reproduce():
    x = torch.from_numpy(natural_images(16, seed=5)).permute(0, 3, 1, 2).contiguous()
    kw = dict(mean=MEAN, std=(0.229, 0.224, 0.225), auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)
    a0, a0b, a1 = DeviceAugment(**kw, rank=0), DeviceAugment(**kw, rank=0), DeviceAugment(**kw, rank=1)
    torch.testing.assert_close(a0(x), a0b(x))
    assert not torch.allclose(a0(x), a1(x))


def test_unsupported_policies_are_rejected():
    with pytest.raises(ValueError, match="only RandAugment"):
        BatchRandAugment("original-mstd0.5")
    with pytest.raises(ValueError, match="3a"):
        BatchRandAugment("rand-m9-t3a")


@pytest.mark.parametrize("count", [1, 3])
def test_random_erasing_matches_timm_in_distribution(count):
    from timm.data.random_erasing import RandomErasing

    from impulsevit.data.augment.random_erasing import BatchRandomErasing

    n, size = 600, 24
    x = torch.full((n, 3, size, size), 7.0)
    random.seed(0)
    torch.manual_seed(0)
    ref = RandomErasing(0.5, mode="pixel", max_count=count, device="cpu")(x.clone())
    ours = BatchRandomErasing(0.5, mode="pixel", max_count=count)(x, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, torch.full_like(x, 7.0))  # input untouched
    frac_ref = (ref != 7.0).all(1).flatten(1).float().mean(1).numpy()
    frac_ours = (ours != 7.0).all(1).flatten(1).float().mean(1).numpy()
    assert abs((frac_ref > 0).mean() - (frac_ours > 0).mean()) < 0.08  # erased with p = 0.5
    assert ks_2samp(frac_ref[frac_ref > 0], frac_ours[frac_ours > 0]).pvalue > 0.01
    # each erased region is filled with N(0, 1) noise, as timm's `pixel` mode
    noise = ours[ours != 7.0]
    assert abs(float(noise.mean())) < 0.05 and abs(float(noise.std()) - 1.0) < 0.05


def test_draws_are_a_function_of_seed_epoch_step_rank():
    x = torch.from_numpy(natural_images(8, seed=6)).permute(0, 3, 1, 2).contiguous()
    kw = dict(mean=MEAN, std=(0.229, 0.224, 0.225), auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.5, seed=3)
    run = DeviceAugment(**kw)
    first = [run(x, epoch=e, step=s) for e in (0, 1) for s in (0, 1, 2)]
    resumed = DeviceAugment(**kw)  # a fresh process resuming at epoch 1, step 1
    torch.testing.assert_close(resumed(x, epoch=1, step=1), first[4], rtol=0, atol=0)
    distinct = {tuple(t.flatten()[::97].tolist()) for t in first}
    assert len(distinct) == len(first)  # every (epoch, step) draws anew
    assert not torch.equal(DeviceAugment(**{**kw, "seed": 4})(x, epoch=1, step=1), first[4])


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_datamodule_gives_randaugment_the_recipes_interpolation(interpolation):
    """timm's train transform resamples RandAugment's geometric ops with the recipe's interpolation; the ffcv
    backend's device RandAugment gets the same."""
    from impulsevit.data.loading.datamodule import ImageDataModule

    dm = ImageDataModule(dataset="fashion_mnist", backend="ffcv", interpolation=interpolation,
                         augment={"auto_augment": "rand-m9-mstd0.5-inc1"})
    assert dm.device_augment().rand_augment.interpolation == interpolation
    with pytest.raises(ValueError, match="interpolation"):
        BatchRandAugment("rand-m9-mstd0.5-inc1", interpolation="nearest")


@pytest.mark.parametrize(("config", "interpolation", "size"), [("rand-m9-mstd0.5-inc1", "bicubic", 48),
                                                               ("rand-m9-mstd0.5-inc1", "random", 32),
                                                               ("rand-m10-n3-mstd1", "bilinear", 28)])
def test_cpu_strategy_equals_the_whole_batch_strategy_bit_for_bit(config, interpolation, size):
    """The CPU runs each op on the images that drew it (Pillow's transform for the geometric ops); accelerators run
    every op on the whole batch. Same draws must give the same pixels, on real photos, every op reached."""
    x = to_batch(BENCH.photos(size))
    x = torch.cat([x, x.flip(0), x.flip(3)])  # 36 images: every op is drawn by some image in 3 layers x 2 seeds
    ra = BatchRandAugment(config, interpolation=interpolation)
    seen = set()
    for seed in (0, 1):
        whole = ra(x, torch.Generator().manual_seed(seed), selected=False)
        picked = ra(x, torch.Generator().manual_seed(seed), selected=True)
        assert torch.equal(whole, picked), (seed, (whole - picked).abs().max())
        g = torch.Generator().manual_seed(seed)
        for _ in range(ra.num_layers):
            ops, apply, _, _ = ra.draw_layer(x.shape[0], x.device, g)
            seen |= set(ops[apply].tolist())
            if interpolation == "random":
                torch.rand(x.shape[0], generator=g)
    assert len(seen) >= len(ra.names) - 2  # nearly every op was exercised
    jitter = BatchColorJitter(0.4)
    torch.testing.assert_close(jitter(x, torch.Generator().manual_seed(0), selected=True),
                               jitter(x, torch.Generator().manual_seed(0), selected=False), rtol=0, atol=0)
    kw = dict(mean=MEAN, std=(0.229, 0.224, 0.225), auto_augment=config, re_prob=0.25, interpolation=interpolation)
    auto = DeviceAugment(**kw)(x.to(torch.uint8), epoch=2, step=5)  # on the CPU: the selected strategy
    torch.testing.assert_close(auto, DeviceAugment(**kw, selected=False)(x.to(torch.uint8), epoch=2, step=5),
                               rtol=0, atol=0)


def test_pillow_affine_and_equalize_equal_the_batched_ops_and_a_wrong_matrix_is_caught():
    from impulsevit.data.augment.ops import pil_affine

    x = to_batch(BENCH.photos(40))
    ra = BatchRandAugment("rand-m9-mstd0.5-inc1")
    g = torch.Generator().manual_seed(3)
    level, sign = torch.rand(x.shape[0], generator=g), torch.where(torch.rand(x.shape[0], generator=g) > 0.5, -1., 1.)
    fill = torch.tensor(FILL, dtype=torch.float32)
    for name in _GEOMETRIC:
        mats = ra._matrix(name, level, sign, 40, 40)
        for interpolation in ("bicubic", "bilinear"):
            torch.testing.assert_close(pil_affine(x, mats, fill, interpolation), affine(x, mats, fill, interpolation),
                                       rtol=0, atol=0)
    from impulsevit.data.augment.ops import equalize, pil_equalize

    torch.testing.assert_close(pil_equalize(x), equalize(x), rtol=0, atol=0)
    mats = ra._matrix("Rotate", level, sign, 40, 40)
    nudged = mats.clone()
    nudged[:, 0, 2] += 0.25  # a quarter-pixel shift: the comparison above would notice it
    assert not torch.equal(pil_affine(x, nudged, fill), affine(x, mats, fill))


def test_datamodule_says_once_how_the_augmentation_runs(caplog):
    from impulsevit.data.loading.datamodule import ImageDataModule

    dm = ImageDataModule(dataset="fashion_mnist", backend="ffcv", augment={"auto_augment": "rand-m9-mstd0.5-inc1"})
    with caplog.at_level(logging.INFO):
        dm._log_augment_strategy(torch.device("cpu"))
        dm._log_augment_strategy(torch.device("cpu"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("augmentation on cpu")]
    assert lines == ["augmentation on cpu: each op on the images that drew it (Pillow for the geometric ops and "
                     "Equalize); same draws and pixels either way"]
    plain = ImageDataModule(dataset="fashion_mnist", backend="ffcv", augment={"auto_augment": None})
    with caplog.at_level(logging.INFO):
        plain._log_augment_strategy(torch.device("cpu"))  # nothing to choose: no RandAugment, no jitter
    assert len([r for r in caplog.records if r.getMessage().startswith("augmentation on")]) == 1


def test_cpu_strategy_leaves_the_callers_batch_untouched():
    x = to_batch(BENCH.photos(24))
    before = x.clone()
    BatchRandAugment("rand-m10-n3-mstd1")(x, torch.Generator().manual_seed(0), selected=True)
    BatchColorJitter(0.4)(x, torch.Generator().manual_seed(0), selected=True)
    assert torch.equal(x, before)
