"""timm's ``RandomErasing`` on batches (:class:`BatchRandomErasing`): the same box distribution (10 area / aspect
attempts, the first that fits wins; ``pixel`` / ``rand`` / ``const`` fill), vectorised over the batch, on the
normalised batch."""

from __future__ import annotations

import math

import torch

__all__ = ["BatchRandomErasing"]


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
