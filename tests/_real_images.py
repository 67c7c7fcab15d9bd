"""Small natural images for init tests (not a test module): Fashion-MNIST from Debian's ``dataset-fashion-mnist``
when installed, otherwise smooth random images (low-pass filtered noise, the same statistics every run)."""

from __future__ import annotations

import gzip
from pathlib import Path

import torch
import torch.nn.functional as F

FASHION = Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")


def real_images(n: int = 4, size: int = 28, seed: int = 0) -> torch.Tensor:
    """``(n, 3, size, size)`` float32, per-image standardised (as a normalised data pipeline would give)."""
    if FASHION.exists():
        with gzip.open(FASHION, "rb") as f:
            f.read(16)
            raw = f.read(28 * 28 * (n + 100))
        imgs = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(-1, 1, 28, 28).float()[100 : 100 + n] / 255
    else:
        g = torch.Generator().manual_seed(seed)
        imgs = F.avg_pool2d(torch.rand(n, 1, 36, 36, generator=g), 9, stride=1)
    imgs = F.interpolate(imgs, size=(size, size), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    mean, std = imgs.mean((1, 2, 3), keepdim=True), imgs.std((1, 2, 3), keepdim=True)
    return (imgs - mean) / std.clamp_min(1e-6)
