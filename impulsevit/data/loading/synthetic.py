"""Synthetic, learnable images for tests and smoke runs: no files, deterministic for a seed."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from impulsevit.data.loading.base import (
    BaseImageDataModule,
    check_num_workers,
    check_train_batches,
    worker_init_fn,
)
from impulsevit.data.loading.position import LoaderPosition
from impulsevit.data.loading.sampling import EpochSampler, ResumableDataLoader

__all__ = ["SyntheticDataModule"]


class SyntheticDataModule(BaseImageDataModule):
    """Class-conditional Gaussian blobs: class ``c`` has a fixed random mean image plus noise, so a model can learn it.

    Args:
        num_classes: number of classes.
        image_size: side in pixels.
        num_train / num_val: samples per split (the test split reuses the validation samples).
        batch_size: per device.
        seed: data seed (independent of the model's init seed).
        noise: std of the per-sample noise relative to the class means (std 1).
    """

    def __init__(
        self,
        num_classes: int = 10,
        image_size: int = 32,
        num_train: int = 256,
        num_val: int = 128,
        batch_size: int = 32,
        seed: int = 0,
        noise: float = 1.0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(num_classes, image_size, batch_size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
        self.num_train, self.num_val, self.seed, self.noise = num_train, num_val, seed, noise
        self.num_workers = check_num_workers(num_workers)
        self.class_names = [f"blob_{c}" for c in range(num_classes)]

    def describe(self) -> str:
        return (f"synthetic Gaussian blobs ({self.num_classes} classes, {self.num_train} train / {self.num_val} val "
                f"images, seed {self.seed})")

    def train_samples(self) -> int:
        return int(self.num_train)

    def check_train_loader(self, num_samples: int, world_size: int) -> None:
        check_train_batches(num_samples, self.batch_size, world_size, what="the synthetic training split "
                            "(data.num_train)", more="raise data.num_train")

    def _split(self, n: int, offset: int) -> TensorDataset:
        g = torch.Generator().manual_seed(self.seed)
        means = torch.randn(self.num_classes, 3, self.image_size, self.image_size, generator=g)
        g.manual_seed(self.seed * 1000 + offset + 1)
        labels = torch.randint(0, self.num_classes, (n,), generator=g)
        images = means[labels] + self.noise * torch.randn(n, 3, self.image_size, self.image_size, generator=g)
        return TensorDataset(images, labels)

    def setup(self, stage: str | None = None) -> None:
        self.train_set = self._split(self.num_train, 0)
        self.val_set = self._split(self.num_val, 1)

    def loader(self, train: bool, position: LoaderPosition, device: torch.device | None = None) -> DataLoader:
        # The order is a function of (seed, epoch), and the epoch is set here: on a resumed run Lightning prefetches
        # the first batch before its own set_epoch call, so a resumed epoch sees the same batches as an uninterrupted
        # one. A DistributedSampler (sharded by rank under DDP) is left in place by Lightning.
        # The training loader is stateful (a resumed run continues the interrupted epoch, see
        # impulsevit.data.loading.sampling).
        rank, world = position.rank, position.world_size
        if not train:
            return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers,
                              worker_init_fn=worker_init_fn(rank))
        self.check_train_loader(len(self.train_set), world)
        sampler = EpochSampler(self.train_set, num_replicas=world, rank=rank, seed=self.seed,
                               batch_size=self.batch_size, keys=False)
        sampler.set_epoch(position.epoch)
        return ResumableDataLoader(
            self.train_set, batch_size=self.batch_size, sampler=sampler, drop_last=True, num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(self.seed * 1_000_003 + rank), worker_init_fn=worker_init_fn(rank))

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.val_set.tensors[0]), batch_size=self.batch_size)
