"""The resampling filters' numbers shared by the FFCV workers' resampler (:mod:`impulsevit.data.loading.resample`,
compiled by numba) and the batched one on the training device (:mod:`impulsevit.data.loading.device_resample`,
torch): the filter kinds, their supports and Pillow's fixed-point precision.

A module of its own so that the torch side (imported by every datamodule, whatever the backend) does not import
numba / llvmlite, which come only with the ``ffcv`` extra."""

from __future__ import annotations

__all__ = ["BICUBIC", "BILINEAR", "FILTERS", "PRECISION_BITS", "SUPPORT"]

PRECISION_BITS = 32 - 8 - 2
"""Pillow's fixed-point precision of the filter weights for 8-bit images (22 bits: ``1 << 22`` = 1.0)."""
BILINEAR, BICUBIC = 0, 1
FILTERS = {"bilinear": BILINEAR, "bicubic": BICUBIC}
"""``interpolation`` name -> filter kind."""
SUPPORT = (1.0, 2.0)
"""Filter support in source pixels at scale 1, by filter kind (bilinear: triangle, 1; bicubic: a = -0.5, 2)."""
