"""Augmentation cost per image: ``DeviceAugment`` (the ffcv backend's batched RandAugment + erasing) vs timm's PIL
pipeline (what the torchvision backend's workers run), side by side in one process.

Contenders, per image size ``S`` (the recipes' sizes: 28 px ``cpu_deit_aug_backends``, 32 px the CIFAR-size
recipes, 224 px the ImageNet-style ones), with the recipes' augmentation ``auto_augment=rand-m9-mstd0.5-inc1`` and
``re_prob=0.25``:

- ``device``: :class:`~.device.DeviceAugment` on a uint8 ``(B, 3, S, S)`` batch — RandAugment, normalise, random
  erasing — on ``--device`` (the CPU the CPU recipes train on by default; ``cuda`` times it with a synchronisation per
  batch), ``--threads`` intra-op threads, in the strategy it picks on that device: on the CPU each op runs on the
  images that drew it (``selected``), elsewhere every op runs on the whole batch (sync-free);
- ``whole batch``: the same on the same device with every op evaluated on the whole batch (the GPU strategy; same
  draws and pixels), for comparison;
- ``timm``: ``timm.data.create_transform(S, is_training=True, auto_augment=..., re_prob=...)`` (bicubic) on one
  ``S × S`` PIL image at a time, one thread — RandomResizedCrop, flip, RandAugment, to tensor, normalise, erasing:
  the whole per-image chain of the torchvision backend (whose workers run it without the erasing, which then runs
  batched in the training process).

Both are the median over ``--rounds`` timed passes (after one warm-up) of ``--batches`` batches / as many images,
reported in µs per image. The crop in timm's chain is a near no-op at the image's own size; the ffcv backend does its
crop in the loader (``benchmarks/loader_speed.py``), so the ``device`` column is the augmentation alone.

    python benchmarks/augment_cost.py [--sizes 28 32 224] [--device cpu] [--threads 1] [--smoke]

The last line is ``ratio: X`` = timm's µs per image / DeviceAugment's (in the strategy it picks) at the first size
(> 1: the device augmentation costs less per image than timm's PIL chain).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np
import torch
from PIL import Image

from impulsevit._compat.timm import fix_timm_posterize
from impulsevit.data.augment.device import DeviceAugment
from impulsevit.memory import reuse_large_allocations

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def photos(n: int, size: int, seed: int = 0) -> np.ndarray:
    """``n`` smooth-plus-noise ``(size, size, 3)`` uint8 images (as ``benchmarks/loader_speed.py`` makes them)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        low = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(low).resize((size, size), Image.Resampling.BICUBIC), dtype=np.int16)
        out[i] = np.clip(img + rng.integers(-20, 21, img.shape), 0, 255)
    return out


def median_seconds(fn: Callable[[], object], rounds: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def augment_batches(aug: DeviceAugment, batches: list[torch.Tensor], steps: Iterator[int]) -> None:
    """``aug`` on every batch, each with the next step number (fresh draws per batch, as in training)."""
    for b in batches:
        aug(b, epoch=0, step=next(steps))


def transform_images(tf: Callable[[Image.Image], torch.Tensor], images: list[Image.Image]) -> None:
    for im in images:
        tf(im)


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[28, 32, 224])
    p.add_argument("--batch-size", type=int, nargs="+", default=[128, 128, 32],
                   help="DeviceAugment batch per size (the recipes' per-device batches; last one repeats)")
    p.add_argument("--batches", type=int, default=2, help="batches (and batch-size × batches timm images) per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads for DeviceAugment on the CPU")
    p.add_argument("--auto-augment", default="rand-m9-mstd0.5-inc1")
    p.add_argument("--re-prob", type=float, default=0.25)
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = p.parse_args(argv)
    if args.smoke:  # one round of one batch of 8 images at 28 px
        args.sizes, args.batch_size, args.batches, args.rounds = [28], [8], 1, 1
    from timm.data import create_transform

    torch.set_num_threads(args.threads)
    # the malloc setting `impulsevit fit` applies (impulsevit/memory.py): a 224 px batch's float intermediates are
    # reused instead of mmap'ed and page-faulted in again by every RandAugment op
    heap_reuse = reuse_large_allocations()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    aug = DeviceAugment(MEAN, STD, auto_augment=args.auto_augment, re_prob=args.re_prob)
    whole = DeviceAugment(MEAN, STD, auto_augment=args.auto_augment, re_prob=args.re_prob, selected=False)
    print(f"augmentation {args.auto_augment} + erasing {args.re_prob}; DeviceAugment on {device} "
          f"({args.threads} intra-op threads on the CPU), timm's PIL chain on 1 CPU thread; median of {args.rounds}; "
          f"malloc: {'large blocks reused (as `impulsevit fit` sets it)' if heap_reuse else 'glibc defaults'}")
    print(f"{'size':>5} {'batch':>6} {'device µs/img':>14} {'whole batch µs/img':>19} {'timm µs/img':>12} "
          f"{'timm / device':>14}")
    ratios = []
    for k, size in enumerate(args.sizes):
        batch = args.batch_size[min(k, len(args.batch_size) - 1)]
        imgs = photos(batch * args.batches, size)
        batches = [torch.from_numpy(imgs[i * batch:(i + 1) * batch]).permute(0, 3, 1, 2).contiguous().to(device)
                   for i in range(args.batches)]
        tf = create_transform(size, is_training=True, auto_augment=args.auto_augment, re_prob=args.re_prob,
                              interpolation="bicubic", mean=MEAN, std=STD)
        fix_timm_posterize(tf)  # as the torchvision backend does (PIL 13 refuses posterize to 0 bits)
        pils = [Image.fromarray(a) for a in imgs]
        run_device = partial(augment_batches, aug, batches, iter(range(10**9)))
        run_whole = partial(augment_batches, whole, batches, iter(range(10**9)))
        run_timm = partial(transform_images, tf, pils)
        torch.set_num_threads(args.threads)
        dev_us = median_seconds(run_device, args.rounds, sync) / len(pils) * 1e6
        whole_us = median_seconds(run_whole, args.rounds, sync) / len(pils) * 1e6
        torch.set_num_threads(1)
        timm_us = median_seconds(run_timm, args.rounds, lambda: None) / len(pils) * 1e6
        ratios.append(timm_us / dev_us)
        print(f"{size:>5} {batch:>6} {dev_us:>14.1f} {whole_us:>19.1f} {timm_us:>12.1f} {ratios[-1]:>14.2f}")
    print(f"ratio: {ratios[0]:.2f}")
    return ratios[0]


if __name__ == "__main__":
    main()
