"""Small natural images for init tests (not a test module): Fashion-MNIST from Debian's ``dataset-fashion-mnist``
when installed, otherwise smooth random images — :func:`impulsevit.init.coverage.probe_images`."""

from __future__ import annotations

import torch

from impulsevit.init.coverage import probe_images


def real_images(n: int = 4, size: int = 28, seed: int = 0) -> torch.Tensor:
    """``(n, 3, size, size)`` float32, per-image standardised (as a normalised data pipeline would give)."""
    return probe_images(n, size, seed)
