"""Device-side augmentation against timm/torchvision on the same inputs: every RandAugment op at fixed magnitudes
(pixel-level), the whole ``rand-m9-mstd0.5-inc1`` policy and colour jitter in distribution (two-sample KS tests),
normalisation, random erasing and per-rank RNG streams."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import ks_2samp
from timm.data.auto_augment import _HPARAMS_DEFAULT, LEVEL_TO_ARG, NAME_TO_OP, rand_augment_transform

from impulsevit.data.augment import (
    BatchColorJitter,
    BatchRandAugment,
    DeviceAugment,
    _affine,
    fix_timm_posterize,
    normalize,
)

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


POINTWISE = ["AutoContrast", "Equalize", "Invert", "PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd",
             "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"]
GEOMETRIC = ["Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]


def timm_args(name: str, magnitude: float, seed: int) -> tuple[tuple, float]:
    """timm's op arguments for ``magnitude`` (its own random sign draw) and the sign it drew."""
    level_fn = LEVEL_TO_ARG[name]
    if level_fn is None:
        return (), 1.0
    random.seed(seed)
    args = level_fn(magnitude, dict(_HPARAMS_DEFAULT, translate_pct=0.45))
    if name.endswith("Increasing") and name[:-10] in ("Color", "Contrast", "Brightness", "Sharpness"):
        return args, 1.0 if args[0] >= 1.0 else -1.0
    return args, -1.0 if args[0] < 0 else 1.0


@pytest.mark.parametrize("name", POINTWISE)
@pytest.mark.parametrize("magnitude", [3.0, 9.0])
def test_pointwise_ops_match_pil(name, magnitude):
    imgs = natural_images(4, seed=1)
    ra = BatchRandAugment("rand-m9-mstd0.5-inc1", img_mean=MEAN)
    for k, arr in enumerate(imgs):
        args, sign = timm_args(name, magnitude, seed=k)
        if name.startswith("Posterize"):
            args = (max(1, args[0]),)
        expected = np.asarray(NAME_TO_OP[name](Image.fromarray(arr), *args), dtype=np.float32)
        got = ra._pointwise(name, to_batch(arr[None]), torch.tensor([magnitude / 10]), torch.tensor([sign]))
        got = got[0].permute(1, 2, 0).numpy()
        diff = np.abs(got - expected)
        assert diff.max() <= 1.0 + 1e-4, (name, magnitude, diff.max())
        assert diff.mean() < 0.2, (name, magnitude, diff.mean())


@pytest.mark.parametrize("name", GEOMETRIC)
def test_geometric_ops_match_pil(name):
    imgs = natural_images(4, seed=2)
    ra = BatchRandAugment("rand-m9-mstd0.5-inc1", img_mean=MEAN)
    for k, arr in enumerate(imgs):
        args, sign = timm_args(name, 9.0, seed=k)
        expected = np.asarray(NAME_TO_OP[name](Image.fromarray(arr), *args, fillcolor=FILL,
                                               resample=Image.Resampling.BILINEAR), dtype=np.float32)
        mats = ra._matrix(name, torch.tensor([0.9]), torch.tensor([sign]), 32, 32)
        got = _affine(to_batch(arr[None]), mats, torch.tensor(FILL, dtype=torch.float32))[0].permute(1, 2, 0).numpy()
        diff = np.abs(got - expected)
        assert diff[2:-2, 2:-2].mean() < 3.0, (name, diff[2:-2, 2:-2].mean())  # same map: only resampling differs
        assert np.median(diff) < 2.0, (name, np.median(diff))


def _mean_abs_change(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    return np.abs(after.astype(np.float32) - before.astype(np.float32)).reshape(len(before), -1).mean(1)


def test_full_policy_matches_timm_in_distribution():
    n = 400
    imgs = np.repeat(natural_images(8, seed=3), n // 8, axis=0)
    timm_ra = rand_augment_transform("rand-m9-mstd0.5-inc1", {"img_mean": FILL, "translate_pct": 0.45,
                                                              "interpolation": Image.Resampling.BILINEAR})
    fix_timm_posterize(timm_ra)
    random.seed(0)
    np.random.seed(0)
    ref = np.stack([np.asarray(timm_ra(Image.fromarray(a))) for a in imgs])
    ours = BatchRandAugment("rand-m9-mstd0.5-inc1", img_mean=MEAN)(to_batch(imgs),
                                                                   generator=torch.Generator().manual_seed(0))
    ours = ours.permute(0, 2, 3, 1).numpy()
    d_ref, d_ours = _mean_abs_change(imgs, ref), _mean_abs_change(imgs, ours)
    assert ks_2samp(d_ref, d_ours).pvalue > 0.01, (np.percentile(d_ref, [25, 50, 75]), np.percentile(d_ours,
                                                                                                        [25, 50, 75]))
    unchanged_ref, unchanged_ours = (d_ref < 0.01).mean(), (d_ours < 0.01).mean()
    assert abs(unchanged_ref - unchanged_ours) < 0.08, (unchanged_ref, unchanged_ours)
    assert 0.2 < unchanged_ours < 0.45  # both layers skipped (p = 0.25) or identity-like ops
    m_ref, m_ours = ref.reshape(n, -1).mean(1), ours.reshape(n, -1).mean(1)
    assert ks_2samp(m_ref, m_ours).pvalue > 0.01


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

    from impulsevit.data.augment import BatchRandomErasing

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
