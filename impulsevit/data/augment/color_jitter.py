"""torchvision's ``ColorJitter(b, c, s)`` on batches (:class:`BatchColorJitter`; what timm builds from
``color_jitter``): random factor order per image, factors uniform in ``[max(0, 1 - x), 1 + x]``, the blends of
:mod:`.ops`."""

from __future__ import annotations

import torch

from impulsevit.data.augment import strategy
from impulsevit.data.augment.ops import brightness, contrast, saturation

__all__ = ["BatchColorJitter"]


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
            selected = strategy.selects_on_host(x.device)
        x = x.float()
        b, dev = x.shape[0], x.device
        fns = (brightness, contrast, saturation)
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
