"""The datamodule interface every impulsevit data source implements.

A datamodule builds its loaders at an explicit :class:`~impulsevit.data.loading.position.LoaderPosition`
(:meth:`BaseImageDataModule.loader`) and turns a loader's batch into the model's input with
:meth:`BaseImageDataModule.model_input`; the Lightning hooks here (``train_dataloader``, ``on_after_batch_transfer``,
...) only compute that position from the trainer (:func:`~impulsevit.data.loading.position.loader_position`) and call
them, so code without a trainer (``impulsevit data preview``) uses the same two methods.

The model receives batches ``(images, labels)``: ``images`` float32 ``(B, 3, S, S)`` normalised with the datamodule's
``mean``/``std`` (grayscale sources are replicated to 3 channels), ``labels`` int64 ``(B,)``. Batch-level
augmentation that needs the whole batch (mixup/cutmix, and on-device RandAugment / erasing) runs in
``on_after_batch_transfer`` on the training device; after mixup the labels are soft targets ``(B, num_classes)``
float32, and the LightningModule switches to the soft-target loss when it sees 2-D targets.
"""

from __future__ import annotations

import abc
import functools
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from impulsevit.data.loading.position import LoaderPosition, dist_info, loader_position, trained_position
from impulsevit.errors import ConfigError
from impulsevit.procs import die_with_parent

__all__ = ["BaseImageDataModule", "check_batch_size", "check_num_workers", "check_train_batches", "dist_info",
           "worker_init_fn"]  # dist_info: defined in impulsevit.data.loading.position, kept importable from here


def _only_the_parent_stops_this_worker() -> None:
    """SIGTERM / SIGINT go to the whole process group or job (scancel, a time limit, Ctrl-C): a worker that died of
    them would fail the main process's next fetch ("DataLoader worker ... killed by signal") before it could
    checkpoint. The main process owns the stop (:class:`impulsevit.callbacks.SlurmRequeue`), so this worker waits for
    both signals in a thread (they are blocked in every thread of the worker, which starts with one) and exits only on
    a SIGTERM its parent sent (``multiprocessing``'s ``terminate`` at the parent's exit, PyTorch's shutdown), as
    PyTorch's own worker handler does; others are dropped. A worker also leaves when the parent shuts it down or dies
    (PyTorch's worker loop watches its parent)."""
    stops = {signal.SIGTERM, signal.SIGINT}
    if not hasattr(signal, "sigwaitinfo"):  # not Linux: ignore them (a parent's terminate() then waits for the loop)
        for sig in stops:
            signal.signal(sig, signal.SIG_IGN)
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    parent = os.getppid()

    def wait() -> None:
        while True:
            info = signal.sigwaitinfo(stops)
            if info.si_signo == signal.SIGTERM and info.si_pid == parent:
                os._exit(0)

    threading.Thread(target=wait, name="impulsevit-worker-signals", daemon=True).start()


def _worker_init(rank: int, seed_workers: bool, parent: int, worker_id: int) -> None:
    die_with_parent(parent)  # a worker never outlives the main process (kill -9 included)
    _only_the_parent_stops_this_worker()
    if seed_workers:  # what Lightning installs itself when no worker_init_fn is given (seed_everything(workers=True))
        from lightning.fabric.utilities.seed import pl_worker_init_function

        pl_worker_init_function(worker_id, rank=rank)


def worker_init_fn(rank: int = 0) -> Callable[[int], None]:
    """The ``worker_init_fn`` of every multi-process ``DataLoader`` of impulsevit: workers die with the process that
    built the loader (:func:`impulsevit.procs.die_with_parent`), ignore SIGTERM and SIGINT
    from anyone but their parent (a signal to the process group stops the main process at its next step boundary,
    with a checkpoint, not through a dead worker), then, under ``seed_everything(workers=True)``, Lightning's worker
    seeding for ``rank``. Picklable (spawned workers)."""
    return functools.partial(_worker_init, rank, os.environ.get("PL_SEED_WORKERS", "0") == "1", os.getpid())


def check_train_batches(num_samples: int, batch_size: int, world_size: int = 1, *, repeats: int = 1,
                        what: str = "the training data", more: str = "use more training samples") -> None:
    """Raise :class:`ConfigError` when a training epoch over ``num_samples`` samples would have no step: fewer samples
    per rank than one batch of ``batch_size`` (both backends drop the last partial training batch; under
    ``world_size`` processes each rank gets its share, see :func:`~impulsevit.data.loading.sampling.samples_per_rank`).
    The message names ``what`` (the split), its count, the batch size × processes and the fix (a smaller
    ``data.batch_size``, or ``more``). A run that would "finish" without a step or checkpoint is refused instead."""
    from impulsevit.data.loading.sampling import samples_per_rank, train_batches

    if train_batches(num_samples, batch_size, world_size, repeats) > 0:
        return
    per_rank = samples_per_rank(num_samples, world_size, repeats) if num_samples > 0 else 0
    procs = f"{world_size} processes" if world_size != 1 else "1 process"
    share = f" ({per_rank} per process)" if world_size != 1 else ""
    aug = f" with data.augment.repeated_aug={repeats}" if repeats > 1 else ""
    fix = f"set data.batch_size to at most {per_rank}, or {more}" if per_rank > 0 else more
    raise ConfigError(f"{what} has {num_samples} sample(s){share}{aug}, fewer than one batch of data.batch_size "
                      f"{batch_size} x {procs}: an epoch would have no training step (the last partial batch is "
                      f"dropped) and the run would end without a checkpoint; {fix}")


def check_batch_size(batch_size: int) -> int:
    """``batch_size`` as an int; :class:`ConfigError` when it is below 1."""
    if int(batch_size) < 1:
        raise ConfigError(f"data.batch_size must be >= 1 (images per device), got {batch_size}")
    return int(batch_size)


def check_num_workers(num_workers: int) -> int:
    """``num_workers`` as an int; :class:`ConfigError` when it is negative (0: load in the training process)."""
    if int(num_workers) < 0:
        raise ConfigError(f"data.num_workers must be >= 0 (0: load in the training process), got {num_workers}")
    return int(num_workers)


class BaseImageDataModule(L.LightningDataModule, abc.ABC):
    """Common attributes: ``num_classes``, ``image_size`` (pixels, square), ``mean``/``std`` (per channel, 0–1 scale),
    ``batch_size`` (per device). Subclasses implement :meth:`loader` (and ``setup``); the ``*_dataloader`` hooks are
    built on it here."""

    def __init__(
        self,
        num_classes: int,
        image_size: int,
        batch_size: int,
        mean: tuple[float, float, float] = (0.485, 0.456, 0.406),
        std: tuple[float, float, float] = (0.229, 0.224, 0.225),
    ) -> None:
        super().__init__()
        if int(image_size) < 1:
            raise ConfigError(f"data.image_size must be >= 1 (pixels), got {image_size}")
        check_batch_size(batch_size)
        self._num_classes = int(num_classes)
        self.image_size = int(image_size)
        self.batch_size = int(batch_size)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.class_names: list[str] | None = None  # index = label; set by subclasses that know them (at setup)
        self._train_loader: Any = None  # the stateful training loader, once built
        self._loader_state: dict[str, Any] | None = None  # from a checkpoint, applied to the next training loader

    @property
    def num_classes(self) -> int:
        return self._num_classes

    def eval_data_config(self) -> dict[str, Any]:
        """The evaluation transform in timm's data-config terms (what ``timm.data.create_transform`` takes):
        ``input_size`` ``(3, S, S)``, ``mean`` / ``std`` (0–1 scale), ``interpolation``, ``crop_pct`` and
        ``crop_mode``. Here: no resize (``crop_pct`` 1.0, bicubic); datamodules that resize override it."""
        return {"input_size": (3, self.image_size, self.image_size), "mean": self.mean, "std": self.std,
                "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "center"}

    def describe(self) -> str:
        """A short description of the data for model cards (the class name here)."""
        return type(self).__name__

    # ------------------------------------------------------------------ checks before work
    def train_samples(self) -> int | None:
        """Training samples per epoch (before sharding), as known before any data is prepared or file written; None
        when it is not known then (the training loader checks its real count, :meth:`check_train_loader`)."""
        return None

    def check_fits_batch(self, world_size: int = 1) -> None:
        """:class:`ConfigError` when a training epoch under ``world_size`` processes would have no step (fewer
        samples per process than one batch; :func:`check_train_batches`). ``impulsevit fit`` calls it before it
        writes anything; the training loaders check again with their real count."""
        n = self.train_samples()
        if n is not None:
            self.check_train_loader(n, world_size)

    def check_train_loader(self, num_samples: int, world_size: int) -> None:
        """:func:`check_train_batches` for this datamodule's batch size, repeats and wording (subclasses name their
        split and the key that adds samples)."""
        check_train_batches(num_samples, self.batch_size, world_size)

    # ------------------------------------------------------------------ loaders at a position
    @abc.abstractmethod
    def loader(self, train: bool, position: LoaderPosition, device: torch.device | None = None) -> Any:
        """The training (``train``: shuffled by :func:`~impulsevit.data.loading.sampling.epoch_sequence` of
        ``position``'s epoch, rank and world size, last partial batch dropped, stateful) or evaluation loader, with
        batches of ``batch_size``; ``device``: where the loader may place batches itself (None: host memory). Not
        registered for checkpoints (``train_dataloader`` does that). Every subclass implements it (abstract: a
        subclass without it cannot be instantiated)."""

    def _position(self) -> LoaderPosition:
        return loader_position(getattr(self, "trainer", None))

    def _device(self) -> torch.device | None:
        return getattr(getattr(getattr(self, "trainer", None), "strategy", None), "root_device", None)

    def train_dataloader(self):  # noqa: ANN201 - the subclass's loader
        return self.stateful_train_loader(self.loader(True, self._position(), self._device()))

    def val_dataloader(self):  # noqa: ANN201
        return self.loader(False, self._position(), self._device())

    def test_dataloader(self):  # noqa: ANN201
        return self.val_dataloader()

    def predict_dataloader(self):  # noqa: ANN201
        return self.val_dataloader()

    def calibration_images(self, n: int) -> torch.Tensor:
        """The first ``n`` training images in epoch 0's order of a one-process run (the training loader at
        ``LoaderPosition()``: its crops and flips, no batch augmentation), as the model takes them
        (:meth:`calibration_pixels`): ``(n, 3, S, S)`` float32 on the CPU. For an init that asks for a calibration
        batch (:func:`impulsevit.init.api.calibration_size`); reads ``ceil(n / batch_size)`` batches.

        Raises:
            ConfigError: the training split has fewer than ``n`` images (whole batches).
        """
        if n < 1:
            raise ValueError(f"calibration_images: n must be >= 1, got {n}")
        position = LoaderPosition()
        taken: list[torch.Tensor] = []
        have = 0
        for batch in self.loader(True, position, None):
            images = self.calibration_pixels(batch).detach().float().cpu()
            taken.append(images)
            have += images.shape[0]
            if have >= n:
                break
        if have < n:
            raise ConfigError(f"calibration batch: the training split gave {have} images, the init asks for {n}; "
                              f"set model.init.options.calibration_images to at most {have}")
        return torch.cat(taken)[:n]

    def calibration_pixels(self, batch: Any) -> torch.Tensor:
        """A training loader's batch → its images as the model takes them, without batch augmentation (here the
        batch's first element as it is; :class:`~impulsevit.data.loading.datamodule.ImageDataModule` resamples and
        normalises)."""
        return batch[0] if isinstance(batch, list | tuple) else batch

    # ------------------------------------------------------------------ training-loader state in checkpoints
    def stateful_train_loader(self, loader: Any) -> Any:
        """Register ``loader`` (with ``state_dict`` / ``load_state_dict`` / ``progress``, e.g.
        :class:`~impulsevit.data.loading.sampling.ResumableDataLoader`) as the training loader: its position follows
        Lightning's training progress (:func:`~impulsevit.data.loading.position.trained_position`), and a state
        loaded from a checkpoint is applied to it. Returns ``loader``."""
        loader.progress = lambda: trained_position(getattr(self, "trainer", None))
        if self._loader_state is not None:
            loader.load_state_dict(self._loader_state)
            self._loader_state = None
        self._train_loader = loader
        return loader

    def state_dict(self) -> dict[str, Any]:
        """``{"train_loader": LoaderState dict}`` once a stateful training loader exists (Lightning stores it in
        every checkpoint); its epoch and batches are Lightning's training progress at the save.

        This is the copy that restores the position. Lightning's fit loop saves the same dict
        (``loops.fit_loop.state_dict.combined_loader``) but applies it only to a loader built after the loops' state
        is loaded; ours is built before, by ``trainer.estimated_stepping_batches`` in ``configure_optimizers``
        (Lightning-AI/pytorch-lightning#20550), so that copy is inert (``tests/house/test_one_source.py`` proves
        which)."""
        if self._train_loader is None:
            return {}
        return {"train_loader": self._train_loader.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the checkpoint's loader state for the training loader (built later, in ``train_dataloader``)."""
        self._loader_state = state_dict.get("train_loader")

    def batch_augment(self, images: torch.Tensor, labels: torch.Tensor,
                      position: LoaderPosition | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Training-batch augmentation on the device, its draws keyed by ``position`` (None: the trainer's); identity
        here. Returns (images, labels or soft targets)."""
        return images, labels

    def model_input(self, batch: Any, *, train: bool, position: LoaderPosition | None = None) -> Any:
        """A loader's batch (on its device) → what the model takes: ``train``: :meth:`batch_augment` at ``position``;
        else the batch as it is (subclasses normalise here)."""
        if train:
            images, labels = batch
            return self.batch_augment(images, labels, position)
        return batch

    def on_after_batch_transfer(self, batch, dataloader_idx: int):  # noqa: ANN001 - Lightning hook signature
        trainer = getattr(self, "trainer", None)
        return self.model_input(batch, train=trainer is not None and trainer.training)
