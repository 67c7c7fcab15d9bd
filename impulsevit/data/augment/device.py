"""DeiT's per-image augmentations on batched tensors, for running on the training device after loading.

FFCV decodes, crops and flips on the CPU; what it lacks (RandAugment, colour jitter, random erasing) runs here on the
whole batch at once, each image with its own random draws. Mixup/CutMix are not here: the LightningModule applies
timm's ``Mixup``.

- :class:`BatchRandAugment` re-implements timm's ``RandAugment`` (``rand-m9-mstd0.5-inc1`` etc.; the config string is
  parsed by timm itself) for ``(B, 3, H, W)`` tensors holding 0–255 values. Per image and per layer it draws the op
  (uniform, with replacement), whether it applies (``p``), the magnitude (Gaussian ``mstd`` noise, clipped to ``[0,
  mmax]``) and the sign, exactly as timm does (:meth:`BatchRandAugment.draw_layer`); every op follows PIL's
  definition on uint8 values, rounding / truncating between ops as PIL does: autocontrast and equalize with
  ``ImageOps``' LUT rules per channel, posterize / solarize / solarize-add LUTs, the ``ImageEnhance`` blends (Contrast
  against the rounded mean of the grey image, Sharpness against PIL's SMOOTH filter with the 1-pixel border kept), and
  the affine maps as ``Image.transform`` computes them (:func:`_affine`: the recipe's ``interpolation`` — PIL's
  bicubic is a cubic convolution with ``a = -1`` — with clamped neighbours, a hard edge to timm's fill colour, the
  mean pixel, and truncation). One deviation: posterize keeps at least 1 bit (timm asks for 0 at magnitude 10, which
  Pillow >= 11 rejects; the torchvision backend is patched the same way by :func:`fix_timm_posterize`).
  Measured on real photos (``tests/data/test_augment.py::test_every_op_matches_timms_pil_op_on_photos``): every op at
  magnitudes 0, 5, 9, 10 and both signs, both interpolations, is within one uint8 level of timm's PIL op on every
  pixel with PSNR >= 65 dB (the rest: float32 blend arithmetic vs PIL's). In distribution, the whole chain
  (RandAugment, colour jitter when forced, erasing) against timm's ``transforms_imagenet_train``:
  ``benchmarks/aug_fidelity.py`` (README: the numbers).
- :class:`BatchColorJitter` is torchvision's ``ColorJitter(b, c, s)`` (what timm builds from ``color_jitter``): random
  factor order per image, factors uniform in ``[max(0, 1 - x), 1 + x]``.
- :func:`normalize` converts 0–255 images to float and normalises them.
- :class:`BatchRandomErasing` is timm's ``RandomErasing`` (same box distribution: 10 area / aspect attempts, the first
  that fits wins; ``pixel`` / ``rand`` / ``const`` fill), vectorised over the batch.
- :class:`DeviceAugment` chains them as timm's train transform does (RandAugment, else colour jitter unless forced;
  normalise; random erasing on the normalised batch). Its draws come from a ``torch.Generator`` on the batch's device
  seeded from ``(seed, epoch, step, rank)``: reproducible, different on every rank, and a resumed run draws what the
  uninterrupted one drew at the same step.

Sync-free on CUDA: every op runs on the whole batch and is selected per image with ``torch.where`` (no
data-dependent shapes: no ``nonzero``, boolean indexing or ``.any()`` reads), every random draw happens on the device,
constants (mean/std, fill colour, op weights) are built on the device once, and the affine maps are built directly in
PIL's output → input form (no matrix inversion and its error check). The price is compute: each layer evaluates every
pointwise op on the whole batch (10 for ``rand-m9-mstd0.5-inc1``) and one float64 resampling of the whole batch (16
``take``s for bicubic) instead of each image's one op (GPU cost not measured here: no GPU was available;
``benchmarks/gpu_check.sh`` is the place to measure it). ``tests/training/test_sync_free.py`` counts the
host-synchronising ops of a training step.

On the CPU (:func:`selects_on_host`) that price buys nothing — indexing with the draws costs no synchronisation there
— and made RandAugment 3–30× dearer than timm's PIL chain per image. There each op runs only on the images that drew
it, and the geometric ops and Equalize call Pillow itself (bit-equal to the batched :func:`_affine` /
:func:`_equalize`): same draws, same pixels (``tests/data/test_augment.py`` compares the two strategies bit for bit on
photos); ``benchmarks/augment_cost.py`` measures both against timm's chain.

Not supported: AutoAugment policies (``original``/``v0``) and AugMix (raise ``ValueError``); RandAugment's weighted
op choice (``-tweights``) is supported, ``3a`` op sets are not; devices without float64 (Apple MPS) for the geometric
ops.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["BatchColorJitter", "BatchRandAugment", "BatchRandomErasing", "DeviceAugment", "augment_seed",
           "fix_timm_posterize", "normalize", "selects_on_host"]

_GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
_SUPPORTED = {
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "PosterizeIncreasing", "PosterizeOriginal", "Solarize",
    "SolarizeIncreasing", "SolarizeAdd", "Color", "ColorIncreasing", "Contrast", "ContrastIncreasing", "Brightness",
    "BrightnessIncreasing", "Sharpness", "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
}
_GRAY = (19595.0, 38470.0, 7471.0)  # PIL's RGB → L weights (0.299, 0.587, 0.114) in 16-bit fixed point


def _posterize_at_least_1bit(img, bits_to_keep, **kwargs):  # noqa: ANN001, ANN202 - timm op signature
    from timm.data.auto_augment import posterize

    return posterize(img, max(1, int(bits_to_keep)), **kwargs)


def fix_timm_posterize(transform) -> None:  # noqa: ANN001 - timm RandAugment or a Compose holding one
    """Pillow >= 11 rejects ``posterize(bits=0)``, which timm's ``PosterizeIncreasing`` requests at magnitude 10
    (reachable with ``m9-mstd0.5``, then the PIL pipeline raises): make the RandAugment ops in ``transform`` keep at
    least 1 bit, as :class:`BatchRandAugment` does. Modifies the given objects only, not timm."""
    from timm.data.auto_augment import RandAugment

    for t in [transform, *getattr(transform, "transforms", [])]:
        if isinstance(t, RandAugment):
            for op in t.ops:
                if op.name.startswith("Posterize"):
                    op.aug_fn = _posterize_at_least_1bit


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


def _gray(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``convert("L")`` of integer-valued 0–255 RGB, ``(B, 1, H, W)``: its fixed-point
    ``(19595 R + 38470 G + 7471 B + 2^15) >> 16``, exact in float32 (every term < 2^24; weights as Python scalars: no
    host tensor)."""
    return torch.floor((x[:, 0:1] * _GRAY[0] + x[:, 1:2] * _GRAY[1] + x[:, 2:3] * _GRAY[2] + 32768.0) / 65536.0)


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL ``Image.blend(degenerate, x, factor)`` per image (``factor`` shape ``(B,)``): clipped to 0–255 and
    truncated to integers as PIL's uint8 blend does."""
    return torch.floor((degenerate + factor.view(-1, 1, 1, 1) * (x - degenerate)).clamp(0, 255))


def _contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    mean = torch.floor(_gray(x).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
    return _blend(mean.expand_as(x), x, factor)


def _saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(_gray(x).expand_as(x), x, factor)


def _brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(torch.zeros_like(x), x, factor)


@functools.lru_cache(maxsize=16)
def _smooth_kernel(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """PIL's SMOOTH filter (1 1 1 / 1 5 1 / 1 1 1, / 13) as a ``(3, 1, 3, 3)`` depthwise kernel, once per device."""
    kernel = torch.ones(3, 3)
    kernel[1, 1] = 5.0
    return (kernel / 13.0).expand(3, 1, 3, 3).to(device=device, dtype=dtype)


def _sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    kernel = _smooth_kernel(x.device, x.dtype)
    smooth = F.conv2d(x, kernel, groups=3).round()
    degenerate = x.clone()
    degenerate[:, :, 1:-1, 1:-1] = smooth  # PIL's SMOOTH filter leaves the 1-pixel border as it was
    return _blend(degenerate, x, factor)


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    scale = 255.0 / (hi - lo).clamp_min(1.0)
    out = torch.floor((x - lo) * scale).clamp(0, 255)
    return torch.where(hi > lo, out, x)


def _equalize(x: torch.Tensor) -> torch.Tensor:
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


def _posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    shift = (8 - bits.clamp(0, 8)).view(-1, 1, 1, 1).to(x.dtype)
    q = torch.pow(2.0, shift)
    return torch.floor(x / q) * q


def _solarize(x: torch.Tensor, thresh: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= thresh.view(-1, 1, 1, 1), 255.0 - x, x)


def _solarize_add(x: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 128, (x + add.view(-1, 1, 1, 1)).clamp(max=255), x)


def _pil_interpolate(v: list[torch.Tensor], d: torch.Tensor) -> torch.Tensor:
    """One axis of PIL's ``Image.transform`` filter on the neighbours ``v`` (2: bilinear, 4: bicubic) at fractional
    offsets ``d``, with PIL's expressions in PIL's order (``Geometry.c``; the bicubic is a cubic convolution with
    ``a = -1``, not the ``a = -0.5`` of PIL's resize nor torch's ``a = -0.75``)."""
    if len(v) == 2:
        return v[0] + (v[1] - v[0]) * d
    p2 = -v[0] + v[2]
    p3 = 2 * (v[0] - v[1]) + v[2] - v[3]
    p4 = -v[0] + v[1] - v[2] + v[3]
    return v[1] + d * (p2 + d * (p3 + d * p4))


def _affine(x: torch.Tensor, matrices: torch.Tensor, fill: torch.Tensor,
            interpolation: str = "bicubic") -> torch.Tensor:
    """PIL's ``Image.transform(size, AFFINE, data, resample, fillcolor=fill)`` per image, batched: ``x``
    ``(B, C, H, W)`` on the 0–255 scale, ``matrices`` ``(B, 3, 3)`` pixel-space maps from output to input
    coordinates (PIL's convention: the output pixel ``(i, j)`` samples the input at ``M (j + 0.5, i + 0.5)``).
    Returns float32 ``(B, C, H, W)`` with integer values.

    As PIL's ``Geometry.c``, in float64 as PIL computes: a sample point outside ``[0, W) × [0, H)`` gets ``fill`` (a
    hard edge, no blending); inside, the ``bilinear`` (2 × 2) or ``bicubic`` (4 × 4) neighbours are read with their
    indices clamped to the image, interpolated along x then y (:func:`_pil_interpolate`), clipped to 0–255 and
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
        per_row.append(_pil_interpolate(taps, dx))
    out = torch.floor(_pil_interpolate(per_row, dy).clamp(0, 255)).view(b, c, h, w).float()
    return torch.where(inside.unsqueeze(1), out, fill.view(1, c, 1, 1).float())


def selects_on_host(device: torch.device) -> bool:
    """Whether the augmentations on ``device`` compute each op only for the images that drew it (``True`` on the
    CPU, where reading the draws to index the batch costs no synchronisation) or every op on the whole batch and keep
    it with ``torch.where`` (accelerators: sync-free). Both give the same pixels from the same draws."""
    return device.type == "cpu"


def _pil_affine(x: torch.Tensor, matrices: torch.Tensor, fill: torch.Tensor,
                interpolation: str = "bicubic") -> torch.Tensor:
    """:func:`_affine` computed by Pillow itself, one image at a time: ``Image.transform(AFFINE)`` of each
    ``(3, H, W)`` CPU image (integer values 0–255) with the same float64 matrix and fill. Bit-equal to :func:`_affine`
    (``tests/data/test_augment.py`` checks both against each other) and, on the CPU, 5–10× faster than its batched
    gathers: the CPU path of :class:`BatchRandAugment` uses it, :func:`_affine` serves devices Pillow cannot run
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


def _pil_equalize(x: torch.Tensor) -> torch.Tensor:
    """:func:`_equalize` computed by Pillow's ``ImageOps.equalize`` one CPU image at a time: bit-equal (its LUT rule is
    the one :func:`_equalize` implements; ``tests/data/test_augment.py`` compares them) and about 8× cheaper than the
    batched histogram on the CPU at 224 px."""
    from PIL import Image, ImageOps

    pixels = x.to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    out = np.stack([np.asarray(ImageOps.equalize(Image.fromarray(p))) for p in pixels])
    return torch.from_numpy(out).permute(0, 3, 1, 2).to(torch.float32)


class BatchRandAugment(torch.nn.Module):
    """timm's RandAugment for batches: ``forward(x)`` with ``x`` ``(B, 3, H, W)`` on the 0–255 scale (uint8 or float)
    returns float32 on the 0–255 scale (integer values). ``img_mean`` is the 0–1 mean used as the fill colour (timm
    passes the dataset mean); ``interpolation`` is the geometric ops' PIL filter (``bicubic`` / ``bilinear``: the
    recipe's, as timm's ``transforms_imagenet_train`` passes it; ``random``: either per op, timm's default without
    one). Randomness comes from ``generator`` (one per process; ``None``: torch's global RNG)."""

    def __init__(self, config: str = "rand-m9-mstd0.5-inc1", img_mean: tuple[float, ...] = (0.485, 0.456, 0.406),
                 translate_pct: float = 0.45, interpolation: str = "bicubic") -> None:
        super().__init__()
        from timm.data.auto_augment import rand_augment_transform

        if interpolation not in ("bicubic", "bilinear", "random"):
            raise ValueError(f"RandAugment interpolation must be 'bicubic', 'bilinear' or 'random' (timm: either, per "
                             f"op), got {interpolation!r}")
        self.interpolation = interpolation

        if not config.startswith("rand"):
            raise ValueError(f"auto_augment {config!r}: only RandAugment ('rand-...') runs on the device; AutoAugment "
                             f"and AugMix configs are not supported by the ffcv backend (use backend='torchvision')")
        try:
            timm_ra = rand_augment_transform(config, {"translate_pct": translate_pct})
        except AssertionError as exc:
            raise ValueError(f"auto_augment {config!r} is not a valid timm RandAugment string") from exc
        names = [op.name for op in timm_ra.ops]
        unknown = sorted(set(names) - _SUPPORTED)
        if unknown:
            raise ValueError(f"auto_augment {config!r}: ops {unknown} are not implemented on the device")
        op0 = timm_ra.ops[0]
        self.config = config
        self.names = names
        self.num_layers = int(timm_ra.num_layers)
        self.choice_weights = None if timm_ra.choice_weights is None else torch.as_tensor(timm_ra.choice_weights)
        self.prob = float(op0.prob)
        self.magnitude = float(op0.magnitude)
        self.magnitude_std = float(op0.magnitude_std)
        self.magnitude_max = float(op0.magnitude_max or 10.0)
        self.translate_pct = translate_pct
        self.fill = tuple(min(255.0, round(255 * m)) for m in img_mean)
        self._device_constants: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def extra_repr(self) -> str:
        return (f"config={self.config!r}, ops={len(self.names)}, layers={self.num_layers}, "
                f"interpolation={self.interpolation!r}")

    def _magnitudes(self, n: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
        m = torch.full((n,), self.magnitude, device=device)
        if self.magnitude_std == math.inf:
            m = torch.rand(n, device=device, generator=generator) * self.magnitude
        elif self.magnitude_std > 0:
            m = m + self.magnitude_std * torch.randn(n, device=device, generator=generator)
        return m.clamp(0.0, self.magnitude_max)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fill colour ``(3,)`` and the op weights on ``device``, built once per device."""
        key = str(device)
        if key not in self._device_constants:
            fill = torch.tensor(self.fill, dtype=torch.float32).to(device)
            weights = None if self.choice_weights is None else self.choice_weights.to(device)
            self._device_constants[key] = (fill, weights)
        return self._device_constants[key]

    def draw_layer(self, n: int, device: torch.device,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                      torch.Tensor]:
        """One layer's draws for ``n`` images, as timm's ``RandAugment`` / ``AugmentOp`` make them: the op index into
        :attr:`names` (uniform with replacement, or ``-tweights``), whether it applies (``rand <= p``), the level
        (magnitude / 10 after the ``mstd`` noise and the clip to ``[0, mmax]``) and the sign (``-1`` with probability
        0.5, used by the signed ops). Four ``(n,)`` tensors on ``device``."""
        _, weights = self._constants(device)
        if weights is None:
            ops = torch.randint(len(self.names), (n,), device=device, generator=generator)
        else:
            ops = torch.multinomial(weights.expand(n, -1), 1, generator=generator).view(-1)
        apply = torch.rand(n, device=device, generator=generator) <= self.prob
        level = self._magnitudes(n, device, generator) / 10.0
        sign = torch.where(torch.rand(n, device=device, generator=generator) > 0.5, -1.0, 1.0)
        return ops, apply, level, sign

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                selected: bool | None = None) -> torch.Tensor:
        """Two evaluation strategies with the same draws and the same pixels (``tests/data/test_augment.py`` checks they
        are equal bit for bit):

        - whole batch (the default off the CPU): without data-dependent shapes, every op of a layer runs on the
          whole batch and ``torch.where`` keeps it for the images that drew it (one op per image per layer, so the
          order of the ops within a layer is irrelevant); the geometric ops share one resampling with per-image
          matrices (identity for the others). Sync-free on CUDA, at the price of computing every op for every image;
        - selected images (``selected=None`` picks it on the CPU, :func:`selects_on_host`): each op runs only on the
          images that drew it (host-side indexing), about ``len(names)`` times less work, and the geometric ops and
          Equalize are Pillow's own ``Image.transform`` / ``ImageOps.equalize`` (:func:`_pil_affine`,
          :func:`_pil_equalize`: bit-equal to :func:`_affine` / :func:`_equalize`, 5–10× faster on the CPU).
        """
        if selected is None:
            selected = selects_on_host(x.device)
        source, x = x, x.float()
        if selected and x is source:
            x = x.clone()  # the selected strategy writes into x: never into the caller's tensor
        b, dev = x.shape[0], x.device
        h, w = x.shape[-2], x.shape[-1]
        fill, _ = self._constants(dev)
        geo = [k for k, n in enumerate(self.names) if n in _GEOMETRIC]
        for _ in range(self.num_layers):
            ops, apply, level, sign = self.draw_layer(b, dev, generator)
            if selected:
                x = self._layer_selected(x, ops, apply, level, sign, geo, fill, generator)
                continue
            chosen = apply.view(-1, 1, 1, 1)
            for k, name in enumerate(self.names):
                if k not in geo:
                    x = torch.where(chosen & (ops == k).view(-1, 1, 1, 1), self._pointwise(name, x, level, sign), x)
            if geo:
                mats = torch.eye(3, device=dev).expand(b, 3, 3)
                is_geo = torch.zeros(b, dtype=torch.bool, device=dev)
                for k in geo:
                    sel = ops == k
                    mats = torch.where(sel.view(-1, 1, 1), self._matrix(self.names[k], level, sign, h, w), mats)
                    is_geo = is_geo | sel
                if self.interpolation == "random":  # timm: random.choice((BILINEAR, BICUBIC)) per op
                    cubic = (torch.rand(b, device=dev, generator=generator) < 0.5).view(-1, 1, 1, 1)
                    moved = torch.where(cubic, _affine(x, mats, fill, "bicubic"), _affine(x, mats, fill, "bilinear"))
                else:
                    moved = _affine(x, mats, fill, self.interpolation)
                x = torch.where(chosen & is_geo.view(-1, 1, 1, 1), moved, x)
        return x

    def _layer_selected(self, x: torch.Tensor, ops: torch.Tensor, apply: torch.Tensor, level: torch.Tensor,
                        sign: torch.Tensor, geo: list[int], fill: torch.Tensor,
                        generator: torch.Generator | None) -> torch.Tensor:
        """One layer, each op computed only for the images that drew it (host-side indexing: CPU tensors), written into
        ``x`` in place. Draws exactly what the whole-batch path draws, in the same order (the ``random``
        interpolation's coin included)."""
        b, h, w = x.shape[0], x.shape[-2], x.shape[-1]
        for k, name in enumerate(self.names):
            if k in geo:
                continue
            idx = torch.nonzero(apply & (ops == k)).view(-1)
            if idx.numel():
                x[idx] = (_pil_equalize(x[idx]) if name == "Equalize"
                          else self._pointwise(name, x[idx], level[idx], sign[idx]))
        if not geo:
            return x
        cubic = None
        if self.interpolation == "random":
            cubic = torch.rand(b, device=x.device, generator=generator) < 0.5
        for k in geo:
            sel = apply & (ops == k)
            for interp in ("bicubic", "bilinear") if cubic is not None else (self.interpolation,):
                mask = sel if cubic is None else sel & (cubic if interp == "bicubic" else ~cubic)
                idx = torch.nonzero(mask).view(-1)
                if idx.numel():
                    mats = self._matrix(self.names[k], level[idx], sign[idx], h, w)
                    x[idx] = _pil_affine(x[idx], mats, fill, interp)
        return x

    def _pointwise(self, name: str, x: torch.Tensor, lv: torch.Tensor, sg: torch.Tensor) -> torch.Tensor:
        if name == "AutoContrast":
            return _autocontrast(x)
        if name == "Equalize":
            return _equalize(x)
        if name == "Invert":
            return 255.0 - x
        if name.startswith("Posterize"):
            base = torch.floor(lv * 4)
            bits = {"Posterize": base, "PosterizeIncreasing": 4 - base, "PosterizeOriginal": base + 4}[name]
            bits = bits.clamp_min(1)  # Pillow >= 11 rejects 0 bits; the torchvision backend patches timm likewise
            return torch.where((bits >= 8).view(-1, 1, 1, 1), x, _posterize(x, bits))
        if name == "Solarize":
            return _solarize(x, torch.clamp(torch.floor(lv * 256), max=256))
        if name == "SolarizeIncreasing":
            return _solarize(x, 256 - torch.clamp(torch.floor(lv * 256), max=256))
        if name == "SolarizeAdd":
            return _solarize_add(x, torch.clamp(torch.floor(lv * 110), max=128))
        if name.endswith("Increasing"):
            factor = torch.clamp(1.0 + sg * lv * 0.9, min=0.1)
        else:
            factor = lv * 1.8 + 0.1
        fn = {"Color": _saturation, "Contrast": _contrast, "Brightness": _brightness, "Sharpness": _sharpness}[
            name.removesuffix("Increasing")]
        return fn(x, factor)

    def _matrix(self, name: str, lv: torch.Tensor, sg: torch.Tensor, h: int, w: int) -> torch.Tensor:
        n = lv.shape[0]
        mats = torch.eye(3, device=lv.device, dtype=lv.dtype).repeat(n, 1, 1)
        if name == "ShearX":
            mats[:, 0, 1] = sg * lv * 0.3
        elif name == "ShearY":
            mats[:, 1, 0] = sg * lv * 0.3
        elif name == "TranslateXRel":
            mats[:, 0, 2] = sg * lv * self.translate_pct * w
        elif name == "TranslateYRel":
            mats[:, 1, 2] = sg * lv * self.translate_pct * h
        else:  # Rotate: PIL rotates counter-clockwise about the centre; this is the output → input map
            a = torch.deg2rad(-(sg * lv * 30.0))
            cos, sin = torch.cos(a), torch.sin(a)
            cx, cy = w / 2.0, h / 2.0
            mats[:, 0, 0], mats[:, 0, 1] = cos, sin
            mats[:, 1, 0], mats[:, 1, 1] = -sin, cos
            mats[:, 0, 2] = cx - cos * cx - sin * cy
            mats[:, 1, 2] = cy + sin * cx - cos * cy
        return mats


class BatchColorJitter(torch.nn.Module):
    """torchvision ``ColorJitter(brightness=b, contrast=c, saturation=s)`` per image on a 0–255 batch (hue: not
    supported, timm's recipes leave it 0). Returns float32 0–255 with integer values."""

    def __init__(self, jitter: float | tuple[float, float, float]) -> None:
        super().__init__()
        if isinstance(jitter, (int, float)):
            jitter = (float(jitter),) * 3
        if len(jitter) != 3 or min(jitter) < 0:
            raise ValueError(f"color_jitter must be a float or (brightness, contrast, saturation) >= 0, got {jitter}")
        self.jitter = tuple(float(j) for j in jitter)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                selected: bool | None = None) -> torch.Tensor:
        """Off the CPU every factor is applied to the whole batch and kept where it is the image's ``pos``-th (no
        shapes that depend on the draws); on the CPU (``selected=None``) each factor is computed only for the images
        whose ``pos``-th it is. Same draws, same pixels."""
        if selected is None:
            selected = selects_on_host(x.device)
        x = x.float()
        b, dev = x.shape[0], x.device
        fns = (_brightness, _contrast, _saturation)
        order = torch.argsort(torch.rand(b, 3, device=dev, generator=generator), dim=1)
        factors = []
        for j in self.jitter:
            lo, hi = max(0.0, 1.0 - j), 1.0 + j
            factors.append(lo + (hi - lo) * torch.rand(b, device=dev, generator=generator))
        if selected:
            x = x.clone()
        for pos in range(3):
            for k, fn in enumerate(fns):
                if self.jitter[k] == 0:
                    continue
                if selected:
                    idx = torch.nonzero(order[:, pos] == k).view(-1)
                    if idx.numel():
                        x[idx] = fn(x[idx], factors[k][idx])
                else:
                    x = torch.where((order[:, pos] == k).view(-1, 1, 1, 1), fn(x, factors[k]), x)
        return x


class BatchRandomErasing(torch.nn.Module):
    """timm's ``RandomErasing(probability, mode, max_count)`` on a normalised ``(B, C, H, W)`` float batch, vectorised.

    Per image, as timm: erase with probability ``probability``; ``count`` boxes (``max_count`` when ``min_count ==
    max_count``, else uniform in ``[min_count, max_count]``); per box up to 10 attempts of area ``U(min_area,
    max_area) · H·W / count`` and log-uniform aspect ``[min_aspect, 1/min_aspect]``, height / width rounded, the
    first attempt that fits strictly inside the image is placed at a uniform position and filled with per-pixel
    (``pixel``), per-channel (``rand``) normal noise or zeros (``const``). All attempts are drawn at once on the device
    and the first fitting one is selected with ``argmax``: same distribution as timm, no host reads. Returns a new
    tensor. Not supported: ``num_splits`` (timm's AugMix split batches)."""

    def __init__(self, probability: float = 0.5, mode: str = "pixel", min_count: int = 1, max_count: int = 1,
                 min_area: float = 0.02, max_area: float = 1 / 3, min_aspect: float = 0.3,
                 max_aspect: float | None = None) -> None:
        super().__init__()
        if mode not in ("pixel", "rand", "const"):
            raise ValueError(f"re_mode must be 'pixel', 'rand' or 'const', got {mode!r}")
        if not 1 <= min_count <= max_count:
            raise ValueError(f"random erasing needs 1 <= min_count <= max_count, got {min_count}, {max_count}")
        self.probability, self.mode = float(probability), mode
        self.min_count, self.max_count = int(min_count), int(max_count)
        self.min_area, self.max_area = float(min_area), float(max_area)
        max_aspect = max_aspect or 1 / min_aspect
        self.log_aspect = (math.log(min_aspect), math.log(max_aspect))

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        b, c, h, w = x.shape
        dev = x.device

        def uniform(*shape: int, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
            return lo + (hi - lo) * torch.rand(*shape, device=dev, generator=generator)

        erase = uniform(b) <= self.probability
        if self.min_count == self.max_count:
            count = torch.full((b,), float(self.min_count), device=dev)
        else:
            count = torch.randint(self.min_count, self.max_count + 1, (b,), device=dev, generator=generator).float()
        rows = torch.arange(h, device=dev).view(1, h, 1)
        cols = torch.arange(w, device=dev).view(1, 1, w)
        for box in range(self.max_count):
            area = uniform(b, 10, lo=self.min_area, hi=self.max_area) * (h * w) / count[:, None]
            aspect = torch.exp(uniform(b, 10, lo=self.log_aspect[0], hi=self.log_aspect[1]))
            bh = torch.round(torch.sqrt(area * aspect))
            bw = torch.round(torch.sqrt(area / aspect))
            fits = (bw < w) & (bh < h)
            first = torch.argmax(fits.int(), dim=1, keepdim=True)  # first fitting attempt (0 when none fits)
            bh, bw = bh.gather(1, first).view(b), bw.gather(1, first).view(b)
            top = torch.floor(uniform(b) * (h - bh + 1))  # timm: random.randint(0, h - bh)
            left = torch.floor(uniform(b) * (w - bw + 1))
            active = erase & fits.any(dim=1) & (box < count)
            inside = ((rows >= top.view(b, 1, 1)) & (rows < (top + bh).view(b, 1, 1))
                      & (cols >= left.view(b, 1, 1)) & (cols < (left + bw).view(b, 1, 1)))
            mask = (inside & active.view(b, 1, 1)).unsqueeze(1)
            if self.mode == "pixel":
                noise = torch.randn(b, c, h, w, device=dev, generator=generator, dtype=x.dtype)
            elif self.mode == "rand":
                noise = torch.randn(b, c, 1, 1, device=dev, generator=generator, dtype=x.dtype)
            else:
                noise = torch.zeros((), device=dev, dtype=x.dtype)
            x = torch.where(mask, noise, x)
        return x


def augment_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """The 64-bit generator seed of one training batch: a hash (NumPy ``SeedSequence``) of ``(seed, epoch, step,
    rank)`` — a function of where the batch is in the run only, so a resumed run redraws the uninterrupted one's
    augmentations and ranks draw independent streams."""
    words = [int(v) % 2**64 for v in (seed, epoch, step, rank)]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0])


class DeviceAugment(torch.nn.Module):
    """The train-time chain after decode/crop/flip: RandAugment (or colour jitter), normalise, random erasing.

    ``forward(images, epoch, step)`` takes uint8 ``(B, 3, H, W)`` and returns normalised float32. Colour jitter is
    skipped when RandAugment is on unless ``force_color_jitter`` (timm's rule). Every draw comes from one
    ``torch.Generator`` on the images' device, re-seeded per batch with :func:`augment_seed` ``(seed, epoch, step,
    rank)``: replicas draw differently, and a run resumed at any step redraws exactly what the uninterrupted run drew
    (nothing to checkpoint). ``epoch`` / ``step`` default to 0 / the number of earlier calls. Seeding is a host-side
    operation: no device synchronisation. ``interpolation``: RandAugment's geometric filter (the datamodule passes its
    own ``interpolation``, as timm does). ``selected``: the evaluation strategy (see
    :meth:`BatchRandAugment.forward`); ``None`` picks it from the batch's device (:func:`selects_on_host`).
    """

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...], auto_augment: str | None = None,
                 color_jitter: float | tuple[float, float, float] | None = None, force_color_jitter: bool = False,
                 re_prob: float = 0.0, re_mode: str = "pixel", re_count: int = 1, seed: int = 0, rank: int = 0,
                 interpolation: str = "bicubic", selected: bool | None = None) -> None:
        super().__init__()
        self.selected = selected
        self.mean, self.std = tuple(mean), tuple(std)
        self.rand_augment = (BatchRandAugment(auto_augment, img_mean=self.mean, interpolation=interpolation)
                             if auto_augment else None)
        use_jitter = color_jitter is not None and color_jitter != 0 and (not auto_augment or force_color_jitter)
        self.color_jitter = BatchColorJitter(color_jitter) if use_jitter else None
        self.re_prob, self.re_mode, self.re_count = float(re_prob), re_mode, int(re_count)
        self.erasing = (BatchRandomErasing(self.re_prob, mode=re_mode, max_count=self.re_count)
                        if self.re_prob > 0 else None)
        self.seed, self.rank = int(seed), int(rank)
        self._generators: dict[str, torch.Generator] = {}
        self._calls = 0

    def generator(self, device: torch.device, epoch: int, step: int) -> torch.Generator:
        """This process's generator on ``device``, seeded for batch ``(epoch, step)``."""
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device)
        return self._generators[key].manual_seed(augment_seed(self.seed, epoch, step, self.rank))

    def forward(self, images: torch.Tensor, epoch: int | None = None, step: int | None = None) -> torch.Tensor:
        if step is None:
            step = self._calls
        self._calls += 1
        g = self.generator(images.device, 0 if epoch is None else epoch, step)
        x = images
        if self.rand_augment is not None:
            x = self.rand_augment(x, generator=g, selected=self.selected)
        if self.color_jitter is not None:
            x = self.color_jitter(x, generator=g, selected=self.selected)
        x = normalize(x, self.mean, self.std)
        if self.erasing is not None:
            x = self.erasing(x, generator=g)
        return x
