"""timm's RandAugment on batches (:class:`BatchRandAugment`): ``rand-m9-mstd0.5-inc1`` etc., the config string
parsed by timm itself, for ``(B, 3, H, W)`` tensors holding 0–255 values. Per image and per layer it draws the op
(uniform, with replacement), whether it applies (``p``), the magnitude (Gaussian ``mstd`` noise, clipped to ``[0,
mmax]``) and the sign, exactly as timm does (:meth:`BatchRandAugment.draw_layer`); the ops are :mod:`.ops` (PIL's
definitions), the fill colour the mean pixel, the geometric filter the recipe's ``interpolation``. One deviation:
posterize keeps at least 1 bit (timm asks for 0 at magnitude 10, which Pillow >= 11 rejects; the torchvision backend
is patched the same way by :func:`impulsevit._compat.timm.fix_timm_posterize`). Measured on real photos
(``tests/data/augment/test_augment.py::test_every_op_matches_timms_pil_op_on_photos``): every op at magnitudes 0, 5, 9,
10 and both signs, both interpolations, is within one uint8 level of timm's PIL op on every pixel with PSNR >= 65 dB
(the
rest: float32 blend arithmetic vs PIL's). In distribution: ``benchmarks/aug_fidelity.py``.

Not supported: AutoAugment policies (``original``/``v0``) and AugMix (raise ``ValueError``); RandAugment's weighted
op choice (``-tweights``) is supported, ``3a`` op sets are not.
"""

from __future__ import annotations

import math

import torch

from impulsevit.data.augment import strategy
from impulsevit.data.augment.ops import (
    affine,
    autocontrast,
    brightness,
    contrast,
    equalize,
    pil_affine,
    pil_equalize,
    posterize,
    saturation,
    sharpness,
    solarize,
    solarize_add,
)

__all__ = ["BatchRandAugment"]

_GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
_SUPPORTED = {
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "PosterizeIncreasing", "PosterizeOriginal", "Solarize",
    "SolarizeIncreasing", "SolarizeAdd", "Color", "ColorIncreasing", "Contrast", "ContrastIncreasing", "Brightness",
    "BrightnessIncreasing", "Sharpness", "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
}


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
        """Two evaluation strategies with the same draws and the same pixels (``tests/data/augment/test_augment.py``
        checks they are equal bit for bit):

        - whole batch (the default off the CPU): without data-dependent shapes, every op of a layer runs on the
          whole batch and ``torch.where`` keeps it for the images that drew it (one op per image per layer, so the
          order of the ops within a layer is irrelevant); the geometric ops share one resampling with per-image
          matrices (identity for the others). Sync-free on CUDA, at the price of computing every op for every image;
        - selected images (``selected=None`` picks it on the CPU, :func:`~.strategy.selects_on_host`): each op runs
          only on the images that drew it (host-side indexing), about ``len(names)`` times less work, and the geometric
          ops and Equalize are Pillow's own ``Image.transform`` / ``ImageOps.equalize`` (:func:`pil_affine`,
          :func:`pil_equalize`: bit-equal to :func:`affine` / :func:`equalize`, 5–10× faster on the CPU).
        """
        if selected is None:
            selected = strategy.selects_on_host(x.device)
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
                    moved = torch.where(cubic, affine(x, mats, fill, "bicubic"), affine(x, mats, fill, "bilinear"))
                else:
                    moved = affine(x, mats, fill, self.interpolation)
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
                x[idx] = (pil_equalize(x[idx]) if name == "Equalize"
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
                    x[idx] = pil_affine(x[idx], mats, fill, interp)
        return x

    def _pointwise(self, name: str, x: torch.Tensor, lv: torch.Tensor, sg: torch.Tensor) -> torch.Tensor:
        if name == "AutoContrast":
            return autocontrast(x)
        if name == "Equalize":
            return equalize(x)
        if name == "Invert":
            return 255.0 - x
        if name.startswith("Posterize"):
            base = torch.floor(lv * 4)
            bits = {"Posterize": base, "PosterizeIncreasing": 4 - base, "PosterizeOriginal": base + 4}[name]
            bits = bits.clamp_min(1)  # Pillow >= 11 rejects 0 bits; the torchvision backend patches timm likewise
            return torch.where((bits >= 8).view(-1, 1, 1, 1), x, posterize(x, bits))
        if name == "Solarize":
            return solarize(x, torch.clamp(torch.floor(lv * 256), max=256))
        if name == "SolarizeIncreasing":
            return solarize(x, 256 - torch.clamp(torch.floor(lv * 256), max=256))
        if name == "SolarizeAdd":
            return solarize_add(x, torch.clamp(torch.floor(lv * 110), max=128))
        if name.endswith("Increasing"):
            factor = torch.clamp(1.0 + sg * lv * 0.9, min=0.1)
        else:
            factor = lv * 1.8 + 0.1
        fn = {"Color": saturation, "Contrast": contrast, "Brightness": brightness, "Sharpness": sharpness}[
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
