"""DeiT's per-image augmentations on batched tensors, chained for the training device after loading
(:class:`DeviceAugment`).

FFCV decodes, crops and flips on the CPU; what it lacks runs on the whole batch at once, each image with its own random
draws, in the order timm's train transform applies them: RandAugment (:mod:`.rand_augment`), else colour jitter unless
forced (:mod:`.color_jitter`); normalise (:func:`~.ops.normalize`); random erasing on the normalised batch
(:mod:`.random_erasing`). The ops they share are :mod:`.ops`; how they run on a CPU or an accelerator is
:mod:`.strategy`. Mixup/CutMix are not here: the LightningModule applies timm's ``Mixup``. In distribution, the whole
chain against timm's ``transforms_imagenet_train``: ``benchmarks/aug_fidelity.py`` (README: the numbers).

The draws come from a ``torch.Generator`` on the batch's device seeded from ``(seed, epoch, step, rank)``
(:func:`augment_seed`): reproducible, different on every rank, and a resumed run draws what the uninterrupted one drew
at the same step. The names of the parts are re-exported here (their import path before the split).
"""

from __future__ import annotations

import numpy as np
import torch

from impulsevit._compat.timm import fix_timm_posterize
from impulsevit.data.augment.color_jitter import BatchColorJitter
from impulsevit.data.augment.ops import normalize
from impulsevit.data.augment.rand_augment import BatchRandAugment
from impulsevit.data.augment.random_erasing import BatchRandomErasing
from impulsevit.data.augment.strategy import selects_on_host

__all__ = ["BatchColorJitter", "BatchRandAugment", "BatchRandomErasing", "DeviceAugment", "augment_seed",
           "fix_timm_posterize", "normalize", "selects_on_host"]


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
    :meth:`BatchRandAugment.forward`); ``None`` picks it from the batch's device (:func:`~.strategy.selects_on_host`).
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
