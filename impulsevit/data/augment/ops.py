"""The per-image operations of DeiT's augmentations, on batches: ``(B, 3, H, W)`` float tensors holding integer 0–255
values (uint8 accepted where noted), each op with a per-image factor ``(B,)``. Every op follows PIL's definition on
uint8 values, rounding / truncating as PIL does: autocontrast and equalize with ``ImageOps``' LUT rules per channel,
posterize / solarize / solarize-add LUTs, the ``ImageEnhance`` blends (Contrast against the rounded mean of the grey
image, Sharpness against PIL's SMOOTH filter with the 1-pixel border kept), and the affine maps as ``Image.transform``
computes them (:func:`affine`: PIL's bicubic is a cubic convolution with ``a = -1`` — with clamped neighbours, a hard
edge to the fill colour, and truncation). :func:`pil_affine` / :func:`pil_equalize` are the same two ops computed by
Pillow itself one CPU image at a time (bit-equal; the CPU strategy, :mod:`.strategy`, uses them). :func:`normalize`
turns 0–255 batches into normalised float32.

Used by :mod:`.rand_augment` and :mod:`.color_jitter`. Not supported: devices without float64 (Apple MPS) for the
geometric ops.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["GRAY_WEIGHTS", "affine", "autocontrast", "blend", "brightness", "contrast", "equalize", "gray", "normalize",
           "pil_affine", "pil_equalize", "posterize", "saturation", "sharpness", "solarize", "solarize_add"]

GRAY_WEIGHTS = (19595.0, 38470.0, 7471.0)  # PIL's RGB → L weights (0.299, 0.587, 0.114) in 16-bit fixed point


def normalize(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """``(B, 3, H, W)`` uint8 (or float on the 0–255 scale), any memory layout (FFCV's batches are channels-last
    views) → a new contiguous float32 ``(x - 255 mean) / (255 std)``.

    One allocation and in-place arithmetic (bit-identical to ``(x.float() - m) / s``): on CPU at 224 px this is 2.5×
    faster than the three-temporary form, and converting a channels-last input to the contiguous layout first avoids
    the slow broadcast over an innermost size-3 dimension."""
    m, s = _scaled_mean_std(tuple(mean), tuple(std), images.device)
    out = torch.empty(images.shape, device=images.device, dtype=torch.float32)
    return out.copy_(images).sub_(m).div_(s)


@functools.lru_cache(maxsize=16)
def _scaled_mean_std(mean: tuple[float, ...], std: tuple[float, ...],
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``255 mean`` and ``255 std`` as ``(1, C, 1, 1)`` float32 tensors on ``device``, built once per device (a host
    tensor copied to a GPU on every call would cost a synchronising transfer per batch)."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1).to(device) * 255.0
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1).to(device) * 255.0
    return m, s


def gray(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``convert("L")`` of integer-valued 0–255 RGB, ``(B, 1, H, W)``: its fixed-point
    ``(19595 R + 38470 G + 7471 B + 2^15) >> 16``, exact in float32 (every term < 2^24; weights as Python scalars: no
    host tensor)."""
    r, g, b = GRAY_WEIGHTS
    return torch.floor((x[:, 0:1] * r + x[:, 1:2] * g + x[:, 2:3] * b + 32768.0) / 65536.0)


def blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL ``Image.blend(degenerate, x, factor)`` per image (``factor`` shape ``(B,)``): clipped to 0–255 and
    truncated to integers as PIL's uint8 blend does."""
    return torch.floor((degenerate + factor.view(-1, 1, 1, 1) * (x - degenerate)).clamp(0, 255))


def contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    mean = torch.floor(gray(x).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
    return blend(mean.expand_as(x), x, factor)


def saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return blend(gray(x).expand_as(x), x, factor)


def brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return blend(torch.zeros_like(x), x, factor)


@functools.lru_cache(maxsize=16)
def smooth_kernel(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """PIL's SMOOTH filter (1 1 1 / 1 5 1 / 1 1 1, / 13) as a ``(3, 1, 3, 3)`` depthwise kernel, once per device."""
    kernel = torch.ones(3, 3)
    kernel[1, 1] = 5.0
    return (kernel / 13.0).expand(3, 1, 3, 3).to(device=device, dtype=dtype)


def sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    kernel = smooth_kernel(x.device, x.dtype)
    smooth = F.conv2d(x, kernel, groups=3).round()
    degenerate = x.clone()
    degenerate[:, :, 1:-1, 1:-1] = smooth  # PIL's SMOOTH filter leaves the 1-pixel border as it was
    return blend(degenerate, x, factor)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    scale = 255.0 / (hi - lo).clamp_min(1.0)
    out = torch.floor((x - lo) * scale).clamp(0, 255)
    return torch.where(hi > lo, out, x)


def equalize(x: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    flat = x.reshape(b * c, h * w).long().clamp(0, 255)
    hist = torch.zeros(b * c, 256, device=x.device, dtype=torch.long).scatter_add_(1, flat, torch.ones_like(flat))
    nonzero = hist > 0
    last = 255 - torch.argmax(nonzero.flip(1).long(), dim=1)  # index of the last non-empty bin
    step = (h * w - hist.gather(1, last[:, None]).squeeze(1)) // 255
    cum = torch.cumsum(hist, dim=1) - hist  # exclusive prefix sum
    lut = (step[:, None] // 2 + cum) // step.clamp_min(1)[:, None]
    out = lut.clamp(0, 255).gather(1, flat).reshape(b, c, h, w).to(x.dtype)
    keep = (step == 0).view(b, c, 1, 1)
    return torch.where(keep, x, out)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    shift = (8 - bits.clamp(0, 8)).view(-1, 1, 1, 1).to(x.dtype)
    q = torch.pow(2.0, shift)
    return torch.floor(x / q) * q


def solarize(x: torch.Tensor, thresh: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= thresh.view(-1, 1, 1, 1), 255.0 - x, x)


def solarize_add(x: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 128, (x + add.view(-1, 1, 1, 1)).clamp(max=255), x)


def pil_interpolate(v: list[torch.Tensor], d: torch.Tensor) -> torch.Tensor:
    """One axis of PIL's ``Image.transform`` filter on the neighbours ``v`` (2: bilinear, 4: bicubic) at fractional
    offsets ``d``, with PIL's expressions in PIL's order (``Geometry.c``; the bicubic is a cubic convolution with
    ``a = -1``, not the ``a = -0.5`` of PIL's resize nor torch's ``a = -0.75``)."""
    if len(v) == 2:
        return v[0] + (v[1] - v[0]) * d
    p2 = -v[0] + v[2]
    p3 = 2 * (v[0] - v[1]) + v[2] - v[3]
    p4 = -v[0] + v[1] - v[2] + v[3]
    return v[1] + d * (p2 + d * (p3 + d * p4))


def affine(x: torch.Tensor, matrices: torch.Tensor, fill: torch.Tensor,
            interpolation: str = "bicubic") -> torch.Tensor:
    """PIL's ``Image.transform(size, AFFINE, data, resample, fillcolor=fill)`` per image, batched: ``x``
    ``(B, C, H, W)`` on the 0–255 scale, ``matrices`` ``(B, 3, 3)`` pixel-space maps from output to input
    coordinates (PIL's convention: the output pixel ``(i, j)`` samples the input at ``M (j + 0.5, i + 0.5)``).
    Returns float32 ``(B, C, H, W)`` with integer values.

    As PIL's ``Geometry.c``, in float64 as PIL computes: a sample point outside ``[0, W) × [0, H)`` gets ``fill`` (a
    hard edge, no blending); inside, the ``bilinear`` (2 × 2) or ``bicubic`` (4 × 4) neighbours are read with their
    indices clamped to the image, interpolated along x then y (:func:`pil_interpolate`), clipped to 0–255 and
    truncated to an integer. Fixed shapes: each tap is one ``take`` over the whole batch (no data-dependent
    indexing)."""
    b, c, h, w = x.shape
    dev, dt = x.device, torch.float64
    m = matrices.to(dt)
    cols = torch.arange(w, device=dev, dtype=dt).view(1, 1, w) + 0.5
    rows = torch.arange(h, device=dev, dtype=dt).view(1, h, 1) + 0.5
    sx = m[:, 0, 0].view(b, 1, 1) * cols + m[:, 0, 1].view(b, 1, 1) * rows + m[:, 0, 2].view(b, 1, 1)
    sy = m[:, 1, 0].view(b, 1, 1) * cols + m[:, 1, 1].view(b, 1, 1) * rows + m[:, 1, 2].view(b, 1, 1)
    inside = (sx >= 0) & (sx < w) & (sy >= 0) & (sy < h)
    fx, fy = sx - 0.5, sy - 0.5
    x0, y0 = torch.floor(fx), torch.floor(fy)
    dx, dy = (fx - x0).view(b, 1, h * w), (fy - y0).view(b, 1, h * w)
    offsets = (0, 1) if interpolation == "bilinear" else (-1, 0, 1, 2)
    x0, y0 = x0.long().view(b, 1, h * w), y0.long().view(b, 1, h * w)
    flat = x.to(dt).contiguous().view(-1)
    # element offset of each (image, channel) plane: a tap is one torch.take of (B, C, H·W) indices
    planes = (torch.arange(b, device=dev) * (c * h * w)).view(b, 1, 1) + (torch.arange(c, device=dev) * (h * w)).view(
        1, c, 1)
    cols_at = [(x0 + o).clamp(0, w - 1) for o in offsets]
    per_row = []
    for oy in offsets:
        row = (y0 + oy).clamp(0, h - 1) * w + planes
        taps = [torch.take(flat, row + cx) for cx in cols_at]
        per_row.append(pil_interpolate(taps, dx))
    out = torch.floor(pil_interpolate(per_row, dy).clamp(0, 255)).view(b, c, h, w).float()
    return torch.where(inside.unsqueeze(1), out, fill.view(1, c, 1, 1).float())


def pil_affine(x: torch.Tensor, matrices: torch.Tensor, fill: torch.Tensor,
                interpolation: str = "bicubic") -> torch.Tensor:
    """:func:`affine` computed by Pillow itself, one image at a time: ``Image.transform(AFFINE)`` of each
    ``(3, H, W)`` CPU image (integer values 0–255) with the same float64 matrix and fill. Bit-equal to :func:`affine`
    (``tests/data/augment/test_augment.py`` checks both against each other) and, on the CPU, 5–10× faster than its
    batched gathers: the CPU path of :class:`BatchRandAugment` uses it, :func:`affine` serves devices Pillow cannot run
    on."""
    from PIL import Image

    resample = Image.Resampling.BICUBIC if interpolation == "bicubic" else Image.Resampling.BILINEAR
    colour = tuple(int(v) for v in fill.tolist())
    pixels = x.to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    rows = matrices[:, :2, :].to(torch.float64).tolist()
    out = np.empty_like(pixels)
    for i, (m0, m1) in enumerate(rows):
        image = Image.fromarray(pixels[i])
        out[i] = np.asarray(image.transform(image.size, Image.Transform.AFFINE, (*m0, *m1), resample,
                                            fillcolor=colour))
    return torch.from_numpy(out).permute(0, 3, 1, 2).to(torch.float32)


def pil_equalize(x: torch.Tensor) -> torch.Tensor:
    """:func:`equalize` computed by Pillow's ``ImageOps.equalize`` one CPU image at a time: bit-equal (its LUT rule is
    the one :func:`equalize` implements; ``tests/data/augment/test_augment.py`` compares them) and about 8× cheaper than
    the batched histogram on the CPU at 224 px."""
    from PIL import Image, ImageOps

    pixels = x.to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    out = np.stack([np.asarray(ImageOps.equalize(Image.fromarray(p))) for p in pixels])
    return torch.from_numpy(out).permute(0, 3, 1, 2).to(torch.float32)
