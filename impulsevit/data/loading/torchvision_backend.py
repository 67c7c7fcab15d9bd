"""The torchvision backend: the split's source files decoded and augmented by timm's transforms in ``DataLoader``
workers (RandomResizedCrop, flip, RandAugment or colour jitter; random erasing is left to the device, as timm's
prefetcher does). Under DDP the loaders carry their own sampler (:class:`~impulsevit.data.loading.sampling.EpochSampler`
for training, a non-shuffling ``DistributedSampler`` for evaluation).

Determinism: the training order is :func:`~impulsevit.data.loading.sampling.epoch_sequence` of (seed, epoch, rank,
world size); each sample's augmentation draws are seeded from (seed, epoch, position in the epoch) by
:class:`SourceDataset`, independent of the worker count and of a resume.

Not supported: resampling on the device (``resample_on='device'``), ``.beton`` storage (``data.storage``).
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from impulsevit._compat.timm import fix_timm_posterize
from impulsevit.data.loading.backends import Backend, DataSpec, check_train_split
from impulsevit.data.loading.base import worker_init_fn
from impulsevit.data.loading.position import LoaderPosition
from impulsevit.data.loading.sampling import EpochSampler, ResumableDataLoader, SampleKey, sample_seed
from impulsevit.data.sources.image_source import ImageSource, bad_input_report
from impulsevit.errors import DataError

__all__ = ["SourceDataset", "TorchvisionBackend", "seeded_global_rngs", "timm_transforms"]

log = logging.getLogger("impulsevit")


@contextlib.contextmanager
def seeded_global_rngs(words: np.ndarray) -> Iterator[None]:
    """Seed Python's ``random``, numpy's global RNG and torch's CPU generator from four uint32 ``words`` for the block
    (timm's and torchvision's transforms draw from these); in the main process (``num_workers=0``) their previous
    states are restored afterwards, in a worker process they are the worker's own."""
    main = torch.utils.data.get_worker_info() is None
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state()) if main else None
    random.seed((int(words[0]) << 32) | int(words[1]))
    np.random.seed(words)
    torch.default_generator.manual_seed((int(words[2]) << 32) | int(words[3]))
    try:
        yield
    finally:
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


class SourceDataset(Dataset):
    """A torch ``Dataset`` over an :class:`ImageSource`: ``(transform(PIL RGB image), label int)``.

    Indexed by an int, or by a :class:`~impulsevit.data.loading.sampling.SampleKey` (what the training sampler yields):
    the
    transform's random draws are then seeded by :func:`~impulsevit.data.loading.sampling.sample_seed` ``(seed, epoch,
    position)``, so they do not depend on the worker process, the number of workers or a resume."""

    def __init__(self, source: ImageSource, transform=None, seed: int = 0) -> None:  # noqa: ANN001 - any callable
        self.source, self.transform, self.seed = source, transform, int(seed)
        self.bad: dict[int, str] = {}  # index -> why it could not be read (found in this process)

    def __len__(self) -> int:
        return len(self.source)

    def _readable(self, i: int) -> tuple[int, np.ndarray]:
        """``(index, pixels)`` of sample ``i``, or — when its file is corrupt, empty or unreadable — of the next
        readable sample after it (wrapping around), the same one every time, so the batch keeps its size and the
        order stays a function of the seed. Each unreadable file is logged once per process (the loader's worker
        processes each name those they meet), as the FFCV conversion lists and leaves out its bad inputs.

        Raises:
            DataError: no sample of the split can be read."""
        n = len(self.source)
        for step in range(n):
            j = (i + step) % n
            if j in self.bad:
                continue
            try:
                return j, self.source.load(j)
            except (OSError, SyntaxError, ValueError) as exc:  # PIL: truncated, corrupt, empty or not an image
                self.bad[j] = ("not an image file PIL can identify (empty, or another format)"
                               if type(exc).__name__ == "UnidentifiedImageError" else f"{type(exc).__name__}: {exc}")
                log.warning("impulsevit: skipped unreadable image %s (%s); it is replaced by the next readable "
                            "one", self.source.describe(j), self.bad[j])
        raise DataError(f"none of the {n} images of this split can be read (first: {self.source.describe(i)}: "
                        f"{self.bad.get(i, '?')}); check the files under the data root")

    def __getitem__(self, key: int | SampleKey):  # noqa: ANN204
        from PIL import Image

        i = key.index if isinstance(key, SampleKey) else int(key)
        if isinstance(key, SampleKey):
            self.source.follow(key.epoch, key.position)
        i, pixels = self._readable(i)
        img = Image.fromarray(pixels)
        if self.transform is None:
            return img, int(self.source.labels[i])
        if isinstance(key, SampleKey):
            with seeded_global_rngs(sample_seed(self.seed, key.epoch, key.position)):
                return self.transform(img), int(self.source.labels[i])
        return self.transform(img), int(self.source.labels[i])


def timm_transforms(spec: DataSpec) -> tuple[Any, Any]:
    """timm's ImageNet ``(train, eval)`` transforms of ``spec`` (what ``create_transform`` builds; called directly
    because ``create_transform`` does not pass ``force_color_jitter``), in prefetcher mode: uint8 CHW tensors out,
    no normalisation and no random erasing (both run on the device)."""
    from timm.data.transforms_factory import transforms_imagenet_eval, transforms_imagenet_train

    common = dict(interpolation=spec.interpolation, mean=spec.mean, std=spec.std, use_prefetcher=True)
    aug = spec.augment
    train = transforms_imagenet_train(spec.image_size, scale=aug.scale, ratio=aug.ratio, hflip=aug.hflip,
                                      color_jitter=aug.color_jitter or None,
                                      force_color_jitter=aug.force_color_jitter, auto_augment=aug.auto_augment,
                                      re_prob=0.0, **common)
    evaluate = transforms_imagenet_eval(spec.image_size, crop_pct=spec.crop_pct, **common)
    fix_timm_posterize(train)
    return train, evaluate


class TorchvisionBackend(Backend):
    """:class:`~impulsevit.data.loading.backends.Backend` over the source files (module docstring). ``sets`` holds
    the opened splits (``train``, ``val``: :class:`SourceDataset`) once :meth:`setup` ran."""

    name: ClassVar = "torchvision"
    augments_on_device: ClassVar = False

    def __init__(self, spec: DataSpec) -> None:
        super().__init__(spec)
        self.sets: dict[str, SourceDataset] = {}

    def open_source(self, split: str) -> ImageSource:
        """The (subset of the) split the loaders read: the source files here
        (:meth:`~impulsevit.data.loading.backends.DataSpec.load_source`). The bad inputs found while listing it (an
        empty class folder, a file that is not an image) are logged as the conversions log them
        (:func:`~impulsevit.data.sources.image_source.bad_input_report`)."""
        source = self.spec.load_source(split)
        for line in bad_input_report(source.problems, f"dataset {self.spec.info.name!r}, split {split!r}"):
            log.warning(line)
        return source

    def setup(self, stage: str | None, known_classes: list[str] | None) -> list[str] | None:
        spec = self.spec
        train_tf, eval_tf = timm_transforms(spec)
        if stage in (None, "fit"):
            self.sets["train"] = SourceDataset(self.open_source(spec.train_split), train_tf, seed=spec.seed)
        self.sets["val"] = SourceDataset(self.open_source(spec.val_split), eval_tf)
        return list(self.sets["train" if "train" in self.sets else "val"].source.classes)

    def needs_setup(self, train: bool) -> bool:
        return ("train" if train else "val") not in self.sets

    def _common(self, position: LoaderPosition, batch_size: int, ds: Dataset) -> dict[str, Any]:
        # Explicit generators: a DataLoader without one draws its worker base seed from torch's global RNG at every
        # iter(), which would shift the training stream (drop path, mixup) between fresh and resumed runs.
        generator = torch.Generator().manual_seed(self.spec.seed * 1_000_003 + position.rank)
        workers = self.spec.num_workers
        return dict(batch_size=batch_size, num_workers=workers, generator=generator,
                    persistent_workers=workers > 0, pin_memory=torch.cuda.is_available(),
                    worker_init_fn=worker_init_fn(position.rank), collate_fn=getattr(ds, "collate_fn", None))

    def train_loader(self, position: LoaderPosition, batch_size: int,
                     device: torch.device | None = None) -> ResumableDataLoader:
        ds = self.sets["train"]
        sampler = self.train_sampler(position, batch_size)
        return ResumableDataLoader(ds, sampler=sampler, drop_last=True, **self._common(position, batch_size, ds))

    def train_sampler(self, position: LoaderPosition, batch_size: int) -> EpochSampler:
        """The training order of ``position``'s rank (:class:`~impulsevit.data.loading.sampling.EpochSampler`, set
        to ``position``'s epoch), after checking that an epoch has a step."""
        ds = self.sets["train"]
        check_train_split(self.spec, len(ds), batch_size, position.world_size)
        # The order is a function of (seed, epoch) and the epoch is set here: on a resumed run Lightning fetches
        # the first batch before its own set_epoch call.
        sampler = EpochSampler(ds, num_replicas=position.world_size, rank=position.rank, seed=self.spec.seed,
                               repeats=self.spec.augment.repeated_aug, batch_size=batch_size,
                               **self.order_arguments(position, batch_size))
        sampler.set_epoch(position.epoch)
        return sampler

    def order_arguments(self, position: LoaderPosition, batch_size: int) -> dict[str, Any]:
        """Extra :class:`~impulsevit.data.loading.sampling.EpochSampler` arguments of the training order: none here
        (the global order); the litdata backend's block order adds its chunk sizes and block size."""
        return {}

    def eval_loader(self, position: LoaderPosition, batch_size: int, device: torch.device | None = None) -> DataLoader:
        ds = self.sets["val"]
        world = position.world_size
        sampler = DistributedSampler(ds, num_replicas=world, rank=position.rank, shuffle=False,
                                     seed=self.spec.seed) if world > 1 else None
        return DataLoader(ds, sampler=sampler, drop_last=False, **self._common(position, batch_size, ds))
