"""``ImageDataModule``: any registry dataset through FFCV (default), torchvision/timm or LitData shard sets (local or in
an object store), with DeiT augmentation.

A thin ``LightningDataModule`` over one of three backends, picked once at construction
(:mod:`impulsevit.data.loading.backends`: :class:`~impulsevit.data.loading.ffcv_backend.FFCVBackend`,
:class:`~impulsevit.data.loading.torchvision_backend.TorchvisionBackend`,
:class:`~impulsevit.data.loading.litdata_backend.LitDataBackend`). The backends never read the trainer: the
Lightning hooks here compute the :class:`~impulsevit.data.loading.position.LoaderPosition` (epoch, batch of the
epoch, rank, world size) from it in one place (:func:`~impulsevit.data.loading.position.loader_position`) and pass
it in; a caller without a trainer uses :meth:`ImageDataModule.loader` and :meth:`ImageDataModule.model_input` with a
position of its own (``impulsevit data preview``).

Both backends yield uint8 ``(B, 3, S, S)`` images and int64 labels from their loaders;
:meth:`~ImageDataModule.model_input` (``on_after_batch_transfer``) turns them into normalised float32 on the device
(training batches also get the device-side augmentations), so the LightningModule always sees ``(images (B, 3, S, S)
float32 normalised, labels (B,) int64)``. Mixup/CutMix and label smoothing are the module's job (timm ``Mixup``),
not the datamodule's.

Backends:

- ``ffcv``: ``prepare_data`` (rank 0 of each node) converts the requested splits to cached ``.beton`` files under
  ``cache_dir``; the loaders are built in the dataloader hooks, after the process group exists, with
  ``distributed=True`` under DDP (see :mod:`impulsevit.data.loading.ffcv_loader`). RandomResizedCrop + flip run in
  FFCV's decoder (with ``resample_on='device'`` the decoder only draws and copies the crop box, and
  ``on_after_batch_transfer`` resamples it on the device first: :mod:`impulsevit.data.loading.device_resample`, the
  same bytes); RandAugment, colour jitter and random erasing run on the device
  (:class:`impulsevit.data.augment.device.DeviceAugment`).
- ``torchvision``: timm's ``create_transform`` pipeline (RandomResizedCrop, flip, RandAugment or colour jitter,
  bicubic) in ``DataLoader`` workers, random erasing on the device (as timm's prefetcher does). Under DDP the
  backend builds a ``DistributedSampler`` itself.
- ``litdata``: the torchvision backend's loaders over LitData shard sets read by index
  (:mod:`impulsevit.data.loading.litdata_backend`): same orders, transforms and (``raw`` preset) pixels.

Neither backend depends on Lightning's ``use_distributed_sampler``: the FFCV loader is not a ``DataLoader`` (Lightning
leaves it alone) and the torchvision loader already carries a ``DistributedSampler``; the recipes set the flag to
False anyway. Repeated augmentation (``augment.repeated_aug > 1``) follows DeiT's RASampler on both backends.

Determinism and resume: the training order of both backends is :func:`impulsevit.data.loading.sampling.epoch_sequence`,
a function of (seed, epoch, rank, world size); the torchvision workers' augmentation draws are seeded per sample from
(seed, epoch, position in the epoch) (:class:`~impulsevit.data.loading.torchvision_backend.SourceDataset`), independent
of the worker count; the FFCV decoder's crop/flip draws are a function of (seed, epoch, sample index); the device-side
augmentation's draws are seeded from (seed, epoch, batch index in the epoch, rank). The training loaders are stateful
(epoch and batches consumed on this rank): the datamodule's ``state_dict`` puts that state in every checkpoint (the
position is Lightning's training progress at the save,
:func:`~impulsevit.data.loading.position.trained_position`), and a resumed run continues the interrupted epoch after
the batches it had trained on — no sample repeated, none skipped; on a different world size the remaining samples are
re-sharded (:mod:`impulsevit.data.loading.sampling`).

Not supported: AutoAugment/AugMix on the ffcv backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from impulsevit.blocks import as_config
from impulsevit.data.augment.device import DeviceAugment
from impulsevit.data.augment.ops import normalize
from impulsevit.data.augment.strategy import selects_on_host
from impulsevit.data.loading.backends import (
    Backend,
    BackendChoice,
    DataOrder,
    DataSpec,
    ResampleOn,
    check_train_split,
    default_cache_dir,
    resolve_spec,
)
from impulsevit.data.loading.base import BaseImageDataModule
from impulsevit.data.loading.config import AugmentConfig, StorageConfig
from impulsevit.data.loading.device_resample import resample_canvas
from impulsevit.data.loading.ffcv_backend import FFCVBackend
from impulsevit.data.loading.position import LoaderPosition, dist_info, loader_position, planned_world_size
from impulsevit.data.loading.torchvision_backend import (
    SourceDataset,
    TorchvisionBackend,
    seeded_global_rngs,
    timm_transforms,
)
from impulsevit.data.sources.image_source import ImageSource
from impulsevit.data.sources.registry import Verify

__all__ = ["ImageDataModule", "SourceDataset", "default_cache_dir", "seeded_global_rngs"]


def make_backend(spec: DataSpec) -> Backend:
    """The backend ``spec.backend`` names, over ``spec``."""
    if spec.backend == "litdata":
        from impulsevit.data.loading.litdata_backend import LitDataBackend

        return LitDataBackend(spec)
    return FFCVBackend(spec) if spec.backend == "ffcv" else TorchvisionBackend(spec)


def _from_spec(name: str) -> property:
    """A read-only attribute of the datamodule that is the resolved setting ``spec.<name>``."""
    return property(lambda self: getattr(self.spec, name), doc=f"The resolved ``{name}`` (``spec.{name}``).")


class ImageDataModule(BaseImageDataModule):
    """Registry dataset → batches for ``ImageClassifier``, through the backend ``backend`` names.

    The resolved settings are :attr:`spec` (:class:`~impulsevit.data.loading.backends.DataSpec`; also readable as
    attributes: ``info``, ``root``, ``train_split``, ``seed``, ...), the backend object :attr:`data_backend`.

    Args:
        dataset: registry name (``fashion_mnist``, ``digits``, ``cifar10``, ``cifar100``, ``stl10``, ``flowers102``,
            ``pets``, ``food101``, ``imagenet``, ``imagenet21k``, ``imagefolder``, or one a plugin module registered
            with :func:`~impulsevit.data.register_dataset`).
        root: the dataset's folder (None: the registry default, e.g. Debian's Fashion-MNIST); for
            ``backend='litdata'`` the shard sets' folder or ``s3://bucket/prefix`` (``<root>/<split>/``, written by
            ``impulsevit convert ... --format litdata``).
        backend: ``auto`` (the default and the recipes': ``ffcv`` where the ``ffcv`` extra is installed, else
            ``torchvision`` with one log line saying so), ``ffcv`` (refused in one line naming the extra where FFCV is
            not installed), ``torchvision`` or ``litdata`` (:mod:`impulsevit.data.loading.litdata_backend`); see
            :func:`~impulsevit.data.loading.backends.resolve_backend`. The resolved name is :attr:`backend` (and
            ``hparams`` of a datamodule built in Python; LightningCLI records the arguments as given).
        image_size: output side S in pixels.
        batch_size: per device. num_workers: FFCV threads / DataLoader worker processes.
        crop_pct: evaluation centre crop as a fraction of the resized side, in ``(0, 1]`` (timm's meaning).
        interpolation: ``bicubic`` | ``bilinear`` (PIL's filters, on both backends and for both the training crop and
            the evaluation resize; the FFCV decoder supports no other).
        train_subset / val_subset: use a seeded random subset of this many images (fast CPU recipes).
        train_split / val_split: override the registry's default splits.
        cache_dir: where converted ``.beton`` files live (default :func:`default_cache_dir` ``/ffcv``), or for
            ``litdata`` where remote chunks are cached (default :func:`default_cache_dir` ``/litdata``; its size is
            ``storage.cache_size``).
        seed: data-order and augmentation seed (epoch order is ``seed + epoch``).
        verify: registry count check on loading the source (``error`` | ``warn`` | ``off``).
        mean / std: override the registry's normalisation statistics (per channel, 0–1 scale).
        download: fetch the dataset with ``torchvision.datasets`` in ``prepare_data`` when its files are missing
            (:mod:`impulsevit.data.sources.download`; CIFAR-10/100, STL-10, Flowers-102, Pets, Food-101, Fashion-MNIST);
            without ``root`` it goes to ``<cache>/datasets/<name>``. A dataset that cannot be fetched
            (``imagefolder``, ``digits``, ImageNet) is read from ``root`` as with ``download=False`` (its root is
            checked); a failed download removes what it created and is one line.
        augment: train-time augmentation (:class:`~impulsevit.data.loading.config.AugmentConfig`: crop scale / ratio,
            flip, RandAugment, colour jitter, random erasing, repeated augmentation); a mapping or None (the defaults).
        resample_on: where the ffcv backend's training crops are resized to S × S: ``workers`` (FFCV's threads,
            the default) or ``device`` (the threads decode and copy the crop box; ``on_after_batch_transfer``
            resamples the batch on the training device, to the same bytes — for GPU runs whose loader threads
            are the bottleneck; on a CPU trainer it costs the training thread the resize, and a warning says
            so). Evaluation always resamples in the threads. Needs ``backend='ffcv'``.
        order: the training order (:mod:`impulsevit.data.loading.sampling`): ``global`` (one permutation of the whole
            set per epoch) or ``block`` (chunks shuffled and dealt to the ranks, samples shuffled within blocks of
            ``storage.block_size``: whole-chunk reads from a store, ``docs/data.md``; needs ``litdata``); ``auto``
            or None (the default): ``block`` on a litdata shard set written shuffled (``convert --shuffle``, read
            from its manifest when the datamodule is built), else ``global``. :attr:`order` is the resolved one.
        storage: ``.beton`` storage of the ffcv backend (:class:`~impulsevit.data.loading.config.StorageConfig`: preset,
            page cache, ready-made ``train_beton`` / ``val_beton``, integrity check, conversion limit); a mapping or
            None (the defaults).
    """

    def __init__(
        self,
        dataset: str = "fashion_mnist",
        root: str | None = None,
        backend: BackendChoice = "auto",
        image_size: int = 224,
        batch_size: int = 64,
        num_workers: int = 2,
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        train_subset: int | None = None,
        val_subset: int | None = None,
        train_split: str | None = None,
        val_split: str | None = None,
        cache_dir: str | None = None,
        seed: int = 0,
        verify: Verify = "error",
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        download: bool = False,
        augment: AugmentConfig | None = None,
        storage: StorageConfig | None = None,
        resample_on: ResampleOn = "workers",
        order: DataOrder | None = None,
    ) -> None:
        aug: AugmentConfig = as_config(AugmentConfig, augment, "augment", section="data")
        store: StorageConfig = as_config(StorageConfig, storage, "storage", section="data")
        spec = resolve_spec(dataset=dataset, root=root, backend=backend, image_size=image_size,
                            num_workers=num_workers, crop_pct=crop_pct, interpolation=interpolation,
                            train_subset=train_subset, val_subset=val_subset, train_split=train_split,
                            val_split=val_split, cache_dir=cache_dir, seed=seed, verify=verify, mean=mean, std=std,
                            download=download, augment=aug, storage=store, resample_on=resample_on,
                            order=order)
        root, backend = spec.root, spec.backend
        super().__init__(spec.num_classes, image_size, batch_size, mean=spec.mean, std=spec.std)
        # save_hyperparameters() records the arguments as they are at this point (``root`` after download's default,
        # ``backend`` resolved), the two blocks as plain dicts, as ImageClassifier does: checkpoints stay loadable
        # with weights_only=True.
        augment, storage = dataclasses.asdict(aug), dataclasses.asdict(store)
        self.save_hyperparameters()
        self.data_backend: Backend = make_backend(spec)  # chosen once
        self.download = spec.download  # resolved: a shard set (litdata) never downloads
        self._device_augment: DeviceAugment | None = None
        self._augment_logged = False
        self._cpu_resample_warned = False
        self.data_backend.check_given()  # given files / shard sets that contradict the run: refused before work

    @property
    def spec(self) -> DataSpec:
        """The resolved settings: the backend's (the litdata backend resolves ``order='auto'`` from the training
        set's manifest when it checks the sets)."""
        return self.data_backend.spec

    info = _from_spec("info")
    root = _from_spec("root")
    backend = _from_spec("backend")
    num_workers = _from_spec("num_workers")
    crop_pct = _from_spec("crop_pct")
    interpolation = _from_spec("interpolation")
    resample_on = _from_spec("resample_on")
    order = _from_spec("order")
    train_subset = _from_spec("train_subset")
    val_subset = _from_spec("val_subset")
    train_split = _from_spec("train_split")
    val_split = _from_spec("val_split")
    cache_dir = _from_spec("cache_dir")
    seed = _from_spec("seed")
    verify = _from_spec("verify")
    augment = _from_spec("augment")
    storage = _from_spec("storage")
    preset = _from_spec("preset")
    betons = _from_spec("betons")

    # ------------------------------------------------------------------ sources and cached files
    def load_source(self, split: str) -> ImageSource:
        """The (subset of the) split as an :class:`ImageSource` (:meth:`DataSpec.load_source
        <impulsevit.data.loading.backends.DataSpec.load_source>`)."""
        return self.spec.load_source(split)

    def prepare_data(self) -> None:
        """``download``: fetch the dataset when missing; then the backend's preparation (FFCV: convert the train and
        val splits to ``.beton`` files unless they are up to date, :meth:`FFCVBackend.prepare
        <impulsevit.data.loading.ffcv_backend.FFCVBackend.prepare>`). Lightning runs this on local rank 0 only."""
        if self.download:
            from impulsevit.data.sources.download import ensure_dataset

            ensure_dataset(self.info, self.root, verify=self.verify)
        self.data_backend.prepare(planned_world_size(getattr(self, "trainer", None)))

    def splits_to_convert(self) -> list[str]:
        """FFCV splits whose ``.beton`` is missing or incomplete (no valid manifest); empty for other backends."""
        return self.data_backend.splits_to_convert()

    def train_samples(self) -> int | None:
        """Training images per epoch, before any conversion or write: a given ``.beton``'s manifest (else its
        header), a complete cached ``.beton``'s manifest, else the split's published count or listing after
        ``train_subset``; None when the split cannot be read yet (``setup`` then says why)."""
        return self.data_backend.train_samples()

    def check_train_loader(self, num_samples: int, world_size: int) -> None:
        check_train_split(self.spec, num_samples, self.batch_size, world_size)

    def setup(self, stage: str | None = None) -> None:
        self.class_names = self.data_backend.setup(stage, self.class_names)

    def eval_data_config(self) -> dict:
        """The evaluation transform of both backends in timm's terms: resize the shorter side to
        ``floor(S / crop_pct)`` with ``interpolation``, centre crop ``S``, normalise with ``mean`` / ``std``."""
        return {**super().eval_data_config(), "interpolation": self.interpolation, "crop_pct": self.crop_pct}

    def describe(self) -> str:
        subsets = "".join(f", {what} subset of {k}" for what, k in (("train", self.train_subset),
                                                                     ("val", self.val_subset)) if k)
        return f"{self.info.name} (train split {self.train_split!r}, val split {self.val_split!r}{subsets})"

    def _timm_transforms(self):  # noqa: ANN202
        """timm's train/eval transforms of the torchvision backend
        (:func:`~impulsevit.data.loading.torchvision_backend.timm_transforms`)."""
        return timm_transforms(self.spec)

    # ------------------------------------------------------------------ loaders
    def loader(self, train: bool, position: LoaderPosition, device: torch.device | None = None) -> Any:
        """The backend's training (``train``) or evaluation loader at ``position`` (epoch, rank, world size), with
        batches of ``batch_size``, on ``device`` where the backend places batches itself (FFCV on CUDA; None: host
        memory). Opens the split first when ``setup`` has not (torchvision). The training loader is not registered
        for checkpoints here (``train_dataloader`` does that)."""
        b = self.data_backend
        if b.needs_setup(train):
            self.setup("fit" if train else "validate")
        return (b.train_loader if train else b.eval_loader)(position, self.batch_size, device)


    # ------------------------------------------------------------------ device side
    def device_augment(self) -> DeviceAugment:
        """The training-batch augmenter, created on first use with this process's rank (so ranks draw differently).
        The ffcv backend runs RandAugment / colour jitter here; the torchvision backend ran them in its workers."""
        if self._device_augment is None:
            on_device, aug = self.data_backend.augments_on_device, self.augment
            self._device_augment = DeviceAugment(
                self.mean, self.std, auto_augment=aug.auto_augment if on_device else None,
                color_jitter=aug.color_jitter if on_device else None, force_color_jitter=aug.force_color_jitter,
                re_prob=aug.re_prob, re_mode=aug.re_mode, re_count=aug.re_count, seed=self.seed,
                rank=dist_info()[0], interpolation=self.interpolation)
        return self._device_augment

    def _log_augment_strategy(self, device: torch.device) -> None:
        """Say once which way the training augmentation runs on ``device`` (the choice is automatic)."""
        aug = self.device_augment()
        if self._augment_logged or (aug.rand_augment is None and aug.color_jitter is None):
            return
        self._augment_logged = True
        how = ("each op on the images that drew it (Pillow for the geometric ops and Equalize)"
               if selects_on_host(device) else "every op on the whole batch, kept per image (sync-free)")
        rank_zero_info(f"augmentation on {device.type}: {how}; same draws and pixels either way")

    def train_pixels(self, images: torch.Tensor) -> torch.Tensor:
        """A training loader's image batch → uint8 ``(B, 3, S, S)``: with ``resample_on='device'`` the FFCV canvas
        batch ``(B, 3, K + 1, K)`` resampled where it lies
        (:func:`~impulsevit.data.loading.device_resample.resample_canvas`, the workers' pixels byte for byte), else
        the batch unchanged."""
        if self.resample_on != "device":
            return images
        if images.device.type == "cpu" and not self._cpu_resample_warned:
            self._cpu_resample_warned = True
            rank_zero_warn("data.resample_on='device' on a CPU trainer: the crop resample runs in the training thread "
                           "with torch, 10-50x the workers' cost per image (docs/benchmarks.md); it is meant for GPU "
                           "runs, 'workers' gives the same pixels faster here")
        return resample_canvas(images, self.image_size, self.interpolation)

    def calibration_pixels(self, batch: Any) -> torch.Tensor:
        """A training batch's images resampled (``resample_on='device'``) and normalised, no batch augmentation:
        ``(B, 3, S, S)`` float32."""
        return normalize(self.train_pixels(batch[0]), self.mean, self.std)

    def batch_augment(self, images: torch.Tensor, labels: torch.Tensor,
                      position: LoaderPosition | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 training batch → augmented, normalised float32 (labels unchanged: mixup is the module's). The draws
        are keyed by ``position`` (epoch, index of the batch in the epoch; None: the trainer's, Lightning's restored
        loop counters on a resumed run). Without a position and without a trainer the draws are not keyed (the
        augmenter's own stream)."""
        if position is None:
            trainer = getattr(self, "trainer", None)
            if trainer is None:
                return self.device_augment()(images), labels
            position = loader_position(trainer)
        self._log_augment_strategy(images.device)
        return self.device_augment()(images, epoch=position.epoch, step=position.batches_done), labels

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):  # noqa: ANN001, ANN201
        """Batches the FFCV pipeline already put on ``device`` (its ``ToDevice`` stage on GPU runs) pass through
        untouched; anything else is moved as Lightning does."""
        if all(isinstance(t, torch.Tensor) and t.device == device for t in batch):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def model_input(self, batch: Any, *, train: bool,
                    position: LoaderPosition | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A loader's batch (on its device) → what the model takes: ``(images float32 (B, 3, S, S) normalised, labels
        int64 (B,))``. ``train``: the training transform (the device resample of ``resample_on='device'``, then
        :meth:`batch_augment` keyed by ``position``); else normalisation only."""
        images, labels = batch[0], batch[1]
        if train:
            images, labels = self.batch_augment(self.train_pixels(images), labels, position)
        else:
            images = normalize(images, self.mean, self.std)
        return images, labels.long()
