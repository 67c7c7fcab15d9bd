"""Loader speed: FFCV (impulsevit's default backend) vs torchvision ImageFolder + DataLoader, side by side.

Generates a few thousand JPEGs (ImageNet-like sizes, 10 classes) in a temp folder, converts them with
``impulsevit.data.convert`` for each preset (reporting images/s and ``.beton`` size), then times one training epoch
of each loader at 64 and 224 px with the same workers, batch size and augmentation (RandomResizedCrop + horizontal
flip → uint8 batch → normalise). JIT/worker warm-up is excluded (a first epoch runs untimed). FFCV reads the
``res256`` file (max side 256, half JPEG) — its intended use; torchvision decodes the original JPEGs.

    python benchmarks/loader_speed.py [--num-images 2000] [--workers 2] [--batch-size 64]

The last line is ``ratio: X`` = torchvision time / FFCV time at 224 px (X > 1: FFCV faster).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from impulsevit.data.augment import normalize
from impulsevit.data.convert import PRESETS, convert_split
from impulsevit.data.ffcv_loader import build_ffcv_loader
from impulsevit.data.sources import image_folder_source

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_jpegs(root: Path, n: int, seed: int = 0) -> None:
    """``n`` smooth-plus-noise JPEGs of 400–500 × 300–375 px (quality 90), 10 class folders."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = int(rng.integers(400, 501)), int(rng.integers(300, 376))
        low = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(low).resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
        img = np.clip(img + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)
        path = root / f"class_{i % 10}" / f"{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(path, quality=90)


def time_epoch(loader, epochs: int = 1) -> tuple[float, int]:  # noqa: ANN001
    start, n = time.perf_counter(), 0
    for _ in range(epochs):
        for images, _labels in loader:
            normalize(images, MEAN, STD)
            n += images.shape[0]
    return time.perf_counter() - start, n


def torchvision_loader(root: Path, size: int, workers: int, batch: int) -> torch.utils.data.DataLoader:
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                             transforms.PILToTensor()])
    ds = datasets.ImageFolder(str(root), transform=tf)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                       persistent_workers=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-images", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--presets", nargs="+", default=["res256", "res400", "res512"])
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="loader-speed-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        make_jpegs(tmp / "jpegs", args.num_images)
        src_bytes = sum(f.stat().st_size for f in (tmp / "jpegs").rglob("*.jpg"))
        print(f"generated {args.num_images} JPEGs ({src_bytes / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s; "
              f"{os.cpu_count()} CPUs, {args.workers} workers, batch {args.batch_size}")
        source = image_folder_source(tmp / "jpegs")
        print(f"\n{'preset':<8} {'convert img/s':>14} {'total img/s':>12} {'.beton MiB':>11} {'expected MiB':>13}")
        for name in args.presets:
            t = time.perf_counter()
            m = convert_split(source, tmp / f"{name}.beton", PRESETS[name], workers=args.workers, progress=False,
                              log=lambda _: None)
            total = args.num_images / (time.perf_counter() - t)
            print(f"{name:<8} {m['write_images_per_second']:>14.0f} {total:>12.0f} {m['bytes'] / 2**20:>11.1f} "
                  f"{m['expected_bytes'] / 2**20:>13.1f}")
        beton = tmp / "res256.beton"
        if not beton.exists():
            convert_split(source, beton, PRESETS["res256"], workers=args.workers, progress=False, log=lambda _: None)
        print(f"\n{'size':>5} {'ffcv img/s':>11} {'torchvision img/s':>18} {'ratio':>6}")
        ratio = float("nan")
        for size in (64, 224):
            ffcv = build_ffcv_loader(beton, train=True, image_size=size, batch_size=args.batch_size,
                                     num_workers=args.workers, in_memory=True)
            tv = torchvision_loader(tmp / "jpegs", size, args.workers, args.batch_size)
            time_epoch(ffcv)  # warm-up: numba JIT, page cache
            time_epoch(tv)  # warm-up: worker start, page cache
            tf, nf = time_epoch(ffcv)
            tt, nt = time_epoch(tv)
            ratio = (tt / nt) / (tf / nf)
            print(f"{size:>5} {nf / tf:>11.0f} {nt / tt:>18.0f} {ratio:>6.2f}")
            del tv
    print(f"ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
