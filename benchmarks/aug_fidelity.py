"""DeiT's train-time augmentation on both backends against timm's own pipeline, in distribution, on real photos.

Sources: square crops of the photos that ship with matplotlib (``grace_hopper.jpg``) and scikit-learn (``china.jpg``,
``flower.jpg``), resized to S px (PIL bicubic). Sample ``i`` augments source ``i mod (number of sources)`` in every
pipeline. The crop and flip are switched off (``scale = ratio = (1, 1)``, ``hflip = 0``: an identity on an S px
source) so that only what follows differs:

- ``timm``: ``timm.data.transforms_factory.transforms_imagenet_train`` (PIL RandAugment, torchvision ColorJitter when
  forced, ``Normalize``, ``RandomErasing``), one image at a time; reference.
- ``timm-timm``: the same with another seed: the noise floor of every distance.
- ``ffcv``: what the ffcv backend runs after decoding, ``ImageDataModule(backend="ffcv").device_augment()`` on uint8
  batches (:class:`impulsevit.data.augment.device.DeviceAugment`).
- ``torchvision``: ``ImageDataModule(backend="torchvision")``'s worker transform (timm's, PIL) then its
  ``device_augment()`` (normalise + erasing on the batch).

Per-sample statistics of the augmented image (de-normalised to 0–1) against its source: mean absolute change, fraction
of pixels changed by more than 4/255, mean, standard deviation, saturation (mean |pixel − its grey|); per policy
``rand-m9-mstd0.5-inc1`` + erasing 0.25 (DeiT) and the same with colour jitter 0.4 forced. Plus: the erased area
(each pipeline's erasing on a constant image), the RandAugment op frequency (op applied per layer, or none; total
variation distance instead of KS), the magnitudes of the applied ops, and timm ``Mixup`` (DeiT: mixup 0.8, cutmix
1.0, switch 0.5) λ and CutMix box area as the LightningModule builds it from ``MixupConfig`` vs timm built directly.
Each distance is compared with its limit ``max(2 × floor, 0.12)`` (at 400 samples; see :func:`compare`); the last
line is ``ratio: X``, the worst distance / limit (``<= 1``: equal in distribution).

Usage: ``python benchmarks/aug_fidelity.py [--n 400] [--size 224] [--break fill0|p1|bilinear|mstd0] [--smoke]``
(``--break`` deliberately damages the ffcv pipeline, to show that the benchmark catches it: ``fill0``, ``p1`` and
``mstd0`` exceed the limit; ``bilinear`` for bicubic changes too few pixels to show in these statistics, which is what
``tests/data/augment/test_augment.py``'s per-op comparison with PIL is for).
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy.stats import ks_2samp
from timm.data.auto_augment import LEVEL_TO_ARG

POLICY = "rand-m9-mstd0.5-inc1"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RE_PROB = 0.25
BREAKS = ("fill0", "p1", "bilinear", "mstd0")


def photo_paths() -> list[Path]:
    """The real photographs that ship with matplotlib and scikit-learn (both dependencies of the dev extra)."""
    import matplotlib
    import sklearn

    return [Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg",
            Path(sklearn.__file__).parent / "datasets" / "images" / "flower.jpg",
            Path(sklearn.__file__).parent / "datasets" / "images" / "china.jpg"]


def photos(size: int = 224) -> np.ndarray:
    """``(12, size, size, 3)`` uint8: from each photo the centred square and three squares of 60 % of its short side
    (top-left, bottom-right, centre), resized with PIL bicubic."""
    out = []
    for path in photo_paths():
        im = Image.open(path).convert("RGB")
        w, h = im.size
        s = min(w, h)
        t = int(0.6 * s)
        boxes = [((w - s) // 2, (h - s) // 2, s), (0, 0, t), (w - t, h - t, t), ((w - t) // 2, (h - t) // 2, t)]
        for x, y, side in boxes:
            out.append(np.asarray(im.crop((x, y, x + side, y + side)).resize((size, size), Image.BICUBIC)))
    return np.stack(out)


def _augment_cfg(jitter: bool) -> dict:
    return dict(scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0, auto_augment=POLICY,
                color_jitter=0.4 if jitter else None, force_color_jitter=jitter, re_prob=RE_PROB)


class _OpLog:
    """Records the RandAugment ops a timm transform applied (its ``aug_fn`` runs only when the op applies)."""

    def __init__(self, transform) -> None:  # noqa: ANN001 - a timm Compose
        from timm.data.auto_augment import RandAugment

        self.layers: list[list[str]] = []
        self.magnitudes: list[float] = []
        ra = next(t for t in transform.transforms if isinstance(t, RandAugment))
        self.num_layers = ra.num_layers
        for op in ra.ops:
            op.aug_fn = self._wrap(op.name, op.aug_fn)
            if op.level_fn is not None:  # called with the drawn magnitude (noise added, clipped) when the op applies
                op.level_fn = self._wrap_level(op.level_fn)

    def _wrap_level(self, fn):  # noqa: ANN001, ANN202
        def logged(magnitude, hparams):  # noqa: ANN001, ANN202
            self.magnitudes.append(float(magnitude))
            return fn(magnitude, hparams)
        return logged

    def _wrap(self, name: str, fn):  # noqa: ANN001, ANN202
        def logged(img, *args, **kwargs):  # noqa: ANN001, ANN202
            self.current.append(name)
            return fn(img, *args, **kwargs)
        return logged

    def start(self) -> None:
        self.current: list[str] = []
        self.layers.append(self.current)

    def frequencies(self, names: list[str]) -> np.ndarray:
        """Fraction of layers that applied each op, and (last) none."""
        counts = np.zeros(len(names) + 1)
        for applied in self.layers:
            for n in applied:
                counts[names.index(n)] += 1
            counts[-1] += self.num_layers - len(applied)
        return counts / counts.sum()


Draws = tuple[np.ndarray, np.ndarray, np.ndarray]


def timm_pipeline(n: int, size: int, jitter: bool, seed: int, src: np.ndarray) -> Draws:
    """timm's train transform on ``n`` samples: ``(n, 3, S, S)`` float 0–1 (de-normalised), the op frequencies and
    the magnitudes of the applied ops that take one."""
    from timm.data.transforms_factory import transforms_imagenet_train

    from impulsevit._compat.timm import fix_timm_posterize

    cfg = _augment_cfg(jitter)
    tf = transforms_imagenet_train(size, scale=cfg["scale"], ratio=cfg["ratio"], hflip=0.0, interpolation="bicubic",
                                   auto_augment=POLICY, color_jitter=cfg["color_jitter"], force_color_jitter=jitter,
                                   mean=MEAN, std=STD, re_prob=RE_PROB, re_mode="pixel", re_count=1)
    fix_timm_posterize(tf)  # Pillow >= 11 rejects posterize(0 bits); both backends keep 1 bit (augment.py)
    log = _OpLog(tf)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    out = []
    for i in range(n):
        log.start()
        out.append(tf(Image.fromarray(src[i % len(src)])))
    return _denorm(torch.stack(out)), log.frequencies(_op_names()), np.array(log.magnitudes)


def _op_names() -> list[str]:
    from impulsevit.data.augment.device import BatchRandAugment

    return BatchRandAugment(POLICY).names


def _denorm(x: torch.Tensor) -> np.ndarray:
    m = torch.tensor(MEAN).view(1, 3, 1, 1)
    s = torch.tensor(STD).view(1, 3, 1, 1)
    return (x * s + m).numpy()


def _datamodule(backend: str, jitter: bool, seed: int, size: int):  # noqa: ANN202
    from impulsevit.data.loading.datamodule import ImageDataModule

    # the dataset only names the class count here: the images come from ``photos()``, the settings from the arguments
    return ImageDataModule(dataset="fashion_mnist", backend=backend, image_size=size, interpolation="bicubic",
                           seed=seed, mean=MEAN, std=STD, augment=_augment_cfg(jitter))


def damage(augment, kind: str) -> None:  # noqa: ANN001 - a DeviceAugment
    """Deliberately wrong variants of the device RandAugment: ``fill0`` (black instead of the mean colour), ``p1``
    (every op applies), ``bilinear`` (instead of the recipe's bicubic), ``mstd0`` (no magnitude noise)."""
    ra = augment.rand_augment
    if kind == "fill0":
        ra.fill = (0.0, 0.0, 0.0)
        ra._device_constants.clear()
    elif kind == "p1":
        ra.prob = 1.0
    elif kind == "bilinear":
        ra.interpolation = "bilinear"
    elif kind == "mstd0":
        ra.magnitude_std = 0.0
    else:
        raise ValueError(f"--break must be one of {BREAKS}, got {kind!r}")


def ffcv_pipeline(n: int, size: int, jitter: bool, seed: int, src: np.ndarray,
                  broken: str | None = None) -> Draws:
    """The ffcv backend's device chain on uint8 batches of 50 (as FFCV delivers them after decode, crop and flip):
    de-normalised ``(n, 3, S, S)`` and the op frequencies of its draws (:meth:`BatchRandAugment.draw_layer`)."""
    dm = _datamodule("ffcv", jitter, seed, size)
    aug = dm.device_augment()
    if broken:
        damage(aug, broken)
    idx = np.arange(n) % len(src)
    out = []
    for step, start in enumerate(range(0, n, 50)):
        batch = torch.from_numpy(src[idx[start:start + 50]]).permute(0, 3, 1, 2).contiguous()
        out.append(aug(batch, epoch=0, step=step))
    ra = aug.rand_augment
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros(len(ra.names) + 1)
    magnitudes = []
    with_level = torch.tensor([LEVEL_TO_ARG[name] is not None for name in ra.names])
    for _ in range(ra.num_layers):
        ops, apply, level, _ = ra.draw_layer(n, torch.device("cpu"), g)
        counts += np.bincount(torch.where(apply, ops, len(ra.names)).numpy(), minlength=len(ra.names) + 1)
        magnitudes.append((10 * level)[apply & with_level[ops]].numpy())
    return _denorm(torch.cat(out)), counts / counts.sum(), np.concatenate(magnitudes)


def torchvision_pipeline(n: int, size: int, jitter: bool, seed: int, src: np.ndarray) -> Draws:
    """The torchvision backend: its worker transform (timm's, prefetcher mode: uint8 out) per image, then its device
    chain (normalise + erasing) on batches of 50."""
    dm = _datamodule("torchvision", jitter, seed, size)
    tf, _ = dm._timm_transforms()
    log = _OpLog(tf)
    aug = dm.device_augment()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    images = []
    for i in range(n):
        log.start()
        images.append(tf(Image.fromarray(src[i % len(src)])))
    batch = torch.stack(images)
    out = [aug(batch[s:s + 50], epoch=0, step=k) for k, s in enumerate(range(0, n, 50))]
    return _denorm(torch.cat(out)), log.frequencies(_op_names()), np.array(log.magnitudes)


def sample_stats(out: np.ndarray, src: np.ndarray) -> dict[str, np.ndarray]:
    """Per-sample statistics of de-normalised outputs ``(n, 3, S, S)`` against their sources (uint8 ``(k, S, S, 3)``,
    sample ``i`` from source ``i mod k``)."""
    n = len(out)
    # on the 1/255 grid: normalising and de-normalising leaves ~1e-8 float noise on an unchanged pixel, different per
    # pipeline (timm divides by 255 first, the device subtracts 255·mean first), which KS would count as a difference
    out = np.round(out * 255) / 255
    ref = src[np.arange(n) % len(src)].transpose(0, 3, 1, 2) / 255.0
    diff = np.abs(out - ref).reshape(n, -1)
    grey = out.mean(1, keepdims=True)
    return {"mean |change|": diff.mean(1), "frac changed > 4/255": (diff > 4 / 255).mean(1),
            "mean": out.reshape(n, -1).mean(1), "std": out.reshape(n, -1).std(1),
            "saturation": np.abs(out - grey).reshape(n, -1).mean(1)}


def erased_area(n: int, size: int, which: str, seed: int) -> np.ndarray:
    """Fraction of each image that random erasing replaced: timm's ``RandomErasing`` or a backend's device erasing
    on a constant image."""
    x = torch.full((n, 3, size, size), 7.0)
    if which == "timm":
        from timm.data.random_erasing import RandomErasing

        random.seed(seed)
        torch.manual_seed(seed)
        er = RandomErasing(RE_PROB, mode="pixel", max_count=1, device="cpu")
        out = torch.stack([er(img.clone()) for img in x])
    else:
        er = _datamodule(which, False, seed, size).device_augment().erasing
        out = er(x, generator=torch.Generator().manual_seed(seed))
    return (out != 7.0).any(1).reshape(n, -1).float().mean(1).numpy()


def mixup_draws(n: int, size: int, which: str, seed: int) -> dict[str, np.ndarray]:
    """``n`` batches of two images (zeros, ones) through Mixup/CutMix: per batch λ (the weight of the image's own
    target) and the CutMix box area (0 for a mixup batch). ``module``: built as :class:`ImageClassifier` builds it
    from :class:`MixupConfig` (the same on both backends); ``timm``: DeiT's arguments given to timm directly."""
    from timm.data import Mixup

    from impulsevit.training.config import MixupConfig

    if which == "module":
        m = MixupConfig()
        fn = Mixup(mixup_alpha=m.mixup_alpha, cutmix_alpha=m.cutmix_alpha, prob=m.prob, switch_prob=m.switch_prob,
                   mode=m.mode, label_smoothing=0.0, num_classes=2)
    else:
        fn = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode="batch", label_smoothing=0.0,
                   num_classes=2)
    np.random.seed(seed)
    x = torch.stack([torch.zeros(3, size, size), torch.ones(3, size, size)])
    lam, box = [], []
    for _ in range(n):
        mixed, targets = fn(x.clone(), torch.tensor([0, 1]))
        lam.append(float(targets[0, 0]))
        img = mixed[0, 0]
        box.append(float((img == 1.0).float().mean()) if bool(((img == 0) | (img == 1)).all()) else 0.0)
    return {"mixup λ": np.array(lam), "cutmix box area": np.array(box)}


def _tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


_TIMM_CACHE: dict[tuple[int, int, bool, int], Draws] = {}


def _timm_cached(n: int, size: int, jitter: bool, seed: int, src: np.ndarray) -> Draws:
    key = (n, size, jitter, seed)
    if key not in _TIMM_CACHE:
        _TIMM_CACHE[key] = timm_pipeline(n, size, jitter, seed, src)
    return _TIMM_CACHE[key]


def compare(n: int = 400, size: int = 224, broken: str | None = None, verbose: bool = True,
            jitter: tuple[bool, ...] = (False, True), extras: bool = True, torchvision: bool = True) -> float:
    """Runs the comparisons (the DeiT policy without / with forced colour jitter; ``extras``: erased area and
    Mixup / CutMix; ``torchvision``: that backend too), prints the table, returns the worst distance / limit. The
    limit of a statistic is ``max(2 × floor, 0.12 · sqrt(400 / n))``: 0.12 at the default 400 samples (two samples
    of 400 from one distribution exceed a KS distance of 0.115 with probability 1 %), scaled as KS noise for other
    ``n``."""
    src = photos(size)
    rows: list[tuple[str, float, float, float]] = []  # statistic, floor, ffcv, torchvision
    for jit in jitter:
        tag = " (+jitter)" if jit else ""
        ref, f_ref, m_ref = _timm_cached(n, size, jit, 0, src)
        ref2, f_ref2, m_ref2 = _timm_cached(n, size, jit, 1, src)
        ffcv, f_ffcv, m_ffcv = ffcv_pipeline(n, size, jit, 2, src, broken)
        tv, f_tv, m_tv = torchvision_pipeline(n, size, jit, 3, src) if torchvision else (ref2, f_ref2, m_ref2)
        s_ref, s_ref2, s_ffcv, s_tv = (sample_stats(o, src) for o in (ref, ref2, ffcv, tv))
        for key in s_ref:
            rows.append((key + tag, ks_2samp(s_ref[key], s_ref2[key]).statistic,
                         ks_2samp(s_ref[key], s_ffcv[key]).statistic, ks_2samp(s_ref[key], s_tv[key]).statistic))
            if verbose and key == "mean |change|":
                q = [25, 50, 75, 95]
                print(f"quantiles {q} of mean |change|{tag}: timm {np.percentile(s_ref[key], q).round(3).tolist()} "
                      f"ffcv {np.percentile(s_ffcv[key], q).round(3).tolist()} "
                      f"torchvision {np.percentile(s_tv[key], q).round(3).tolist()}")
        rows.append(("op frequency (TV)" + tag, _tv(f_ref, f_ref2), _tv(f_ref, f_ffcv), _tv(f_ref, f_tv)))
        rows.append(("op magnitude" + tag, ks_2samp(m_ref, m_ref2).statistic, ks_2samp(m_ref, m_ffcv).statistic,
                     ks_2samp(m_ref, m_tv).statistic))
    if extras:
        area = {"timm": erased_area(n, size, "timm", 0), "timm2": erased_area(n, size, "timm", 1),
                "ffcv": erased_area(n, size, "ffcv", 2), "torchvision": erased_area(n, size, "torchvision", 3)}
        rows.append(("erased area", ks_2samp(area["timm"], area["timm2"]).statistic,
                     ks_2samp(area["timm"], area["ffcv"]).statistic,
                     ks_2samp(area["timm"], area["torchvision"]).statistic))
        mt, mt2, mm = mixup_draws(n, 32, "timm", 0), mixup_draws(n, 32, "timm", 1), mixup_draws(n, 32, "module", 2)
        for key in mt:
            d = ks_2samp(mt[key], mm[key]).statistic
            rows.append((key + " (both backends)", ks_2samp(mt[key], mt2[key]).statistic, d, d))
    worst = 0.0
    if verbose:
        print(f"{'statistic (KS distance vs timm)':34s} {'timm-timm':>9s} {'limit':>6s} {'ffcv':>6s} "
              f"{'torchvision':>11s}")
    for key, floor, d_ffcv, d_tv in rows:
        limit = max(2 * floor, 0.12 * math.sqrt(400 / n))
        worst = max(worst, d_ffcv / limit, d_tv / limit if torchvision else 0.0)
        if verbose:
            print(f"{key:34s} {floor:9.3f} {limit:6.3f} {d_ffcv:6.3f} {d_tv:11.3f}")
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=400, help="samples per pipeline (default 400)")
    ap.add_argument("--size", type=int, default=224, help="image side in px (default 224)")
    ap.add_argument("--break", dest="broken", choices=BREAKS, default=None,
                    help="damage the ffcv pipeline on purpose (the ratio should exceed 1)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = ap.parse_args()
    if args.smoke:  # 20 samples of 32 px: every pipeline and statistic, limits scaled to the sample size
        args.n, args.size = 20, 32
    torch.set_num_threads(min(torch.get_num_threads(), 4))
    ratio = compare(args.n, args.size, args.broken)
    print(f"ratio: {ratio:.3f}")


if __name__ == "__main__":
    main()
