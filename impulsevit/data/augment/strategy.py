"""The two evaluation strategies of the batched augmentations (:mod:`.rand_augment`, :mod:`.color_jitter`), which give
the same pixels from the same draws:

- whole batch (accelerators; sync-free on CUDA): every op runs on the whole batch and is selected per image with
  ``torch.where`` (no data-dependent shapes: no ``nonzero``, boolean indexing or ``.any()`` reads), every random draw
  happens on the device, constants (mean/std, fill colour, op weights) are built on the device once, and the affine
  maps are built directly in PIL's output → input form (no matrix inversion and its error check). The price is
  compute: each layer evaluates every pointwise op on the whole batch (10 for ``rand-m9-mstd0.5-inc1``) and one
  float64 resampling of the whole batch (16 ``take``s for bicubic) instead of each image's one op (GPU cost not
  measured here: no GPU was available; ``benchmarks/gpu_check.sh`` is the place to measure it).
  ``tests/training/test_sync_free.py`` counts the host-synchronising ops of a training step.
- selected images (the CPU): that price buys nothing there — indexing with the draws costs no synchronisation — and
  made RandAugment 3–30× dearer than timm's PIL chain per image. Each op runs only on the images that drew it, and the
  geometric ops and Equalize call Pillow itself (:func:`~.ops.pil_affine`, :func:`~.ops.pil_equalize`, bit-equal to
  the batched ones): ``tests/data/augment/test_augment.py`` compares the two strategies bit for bit on photos;
  ``benchmarks/augment_cost.py`` measures both against timm's chain.

:func:`selects_on_host` picks one from the batch's device; the augmentations call it through this module (so a test
can force the accelerator strategy on the CPU by replacing it here).
"""

from __future__ import annotations

import torch

__all__ = ["selects_on_host"]


def selects_on_host(device: torch.device) -> bool:
    """Whether the augmentations on ``device`` compute each op only for the images that drew it (``True`` on the
    CPU, where reading the draws to index the batch costs no synchronisation) or every op on the whole batch and keep
    it with ``torch.where`` (accelerators: sync-free). Both give the same pixels from the same draws."""
    return device.type == "cpu"
