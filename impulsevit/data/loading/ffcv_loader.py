"""FFCV ``Loader`` construction for training and evaluation, and the thin adapter Lightning iterates.

Pipelines (``.beton`` fields ``image`` and ``label`` as written by :mod:`impulsevit.data.storage.convert`):

- train: one decoder stage (:func:`~impulsevit.data.loading.ffcv_decoder.resample_decoder`) decodes, draws
  torchvision's RandomResizedCrop box, resamples it to S × S with PIL's ``interpolation`` filter (bicubic or
  bilinear, antialiased when reducing, as timm does) and flips with probability ``p`` → ``ToTensor`` →
  ``ToTorchImage`` (channels-last view) — uint8 ``(B, 3, S, S)``;
  with ``resample_on="device"`` the stage stops after the draws and yields canvas batches uint8 ``(B, 3, K + 1, K)``
  (box + flip recorded per sample) that the consumer resamples on its device to the same pixels
  (:mod:`impulsevit.data.loading.device_resample`);
- eval: the same stage with timm's eval geometry: shorter side resized to ``floor(S / crop_pct)``, centre ``S × S``
  kept (the pixels of ``timm.data.create_transform(S, crop_pct=..., interpolation=...)`` on the stored image);
- label: ``IntDecoder`` → ``ToTensor`` → ``Squeeze`` — int64 ``(B,)``;
- on a CUDA device both end in ``ToDevice(device, non_blocking=True)`` (as ffcv-imagenet's pipelines do).

Augmentation draws are counter-based, a function of ``(seed, epoch, sample index)`` — not of thread scheduling or
thread count (see :func:`~impulsevit.data.loading.ffcv_decoder.resample_decoder`); :class:`FFCVLoader` tells the
compiled decoder the epoch.

Host buffers: FFCV cycles ``batches_ahead + 2`` output slots and may refill the slot of the batch before last while
the consumer holds two batches (Lightning fetches batch k + 1 before running step k); :func:`build_ffcv_loader`
keeps one more slot than FFCV so a batch stays intact until two further batches have been fetched.

Normalisation is not in the FFCV pipeline: the datamodule normalises (and augments) on the training device in
``on_after_batch_transfer``. FFCV's own ``NormalizeImage`` needs cupy on GPU and, on CPU, hangs the ``Loader``
constructor unless placed right after the decoder (FFCV 1.0.2, measured here); keeping uint8 to the device also moves
4× fewer bytes. The ``Loader`` is built and iterated with torch's thread count saved and restored (FFCV sets it to
``num_workers`` on the calling thread).

Ordering (training): one rank's share of :func:`impulsevit.data.loading.sampling.epoch_sequence` — the same seeded
orders
as the torchvision backend (``DistributedSampler``'s shuffle seeded ``seed + epoch``, or repeated augmentation),
through a custom ``TraversalOrder`` — or, single-process and not OS-cached, FFCV's page-aware ``QUASI_RANDOM``
(seeded ``seed * 912300 + epoch``); ``SEQUENTIAL`` for evaluation, ``distributed=True`` when a process group with more
than one rank exists. Every order is a function of (seed, epoch, rank, world size), not of thread scheduling.
:class:`FFCVLoader` exposes ``sampler.set_epoch`` so Lightning sets the epoch (also after a resume), and is stateful
(``state_dict`` / ``load_state_dict``, see :mod:`impulsevit.data.loading.sampling`): a resumed run continues the
interrupted
epoch after the batches it had consumed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from impulsevit.data.loading.ffcv_decoder import resample_decoder
from impulsevit.data.loading.position import dist_info
from impulsevit.data.loading.sampling import LoaderState, epoch_sequence, resumed_shard

__all__ = ["FFCVLoader", "build_ffcv_loader", "ffcv_available"]


def ffcv_available() -> bool:
    """True when ``ffcv`` imports (it needs OpenCV and libjpeg-turbo at build time).

    The first import happens here, inside :func:`keep_torch_threads`: importing FFCV's pipeline compiler calls
    ``torch.set_num_threads(1)``, which would silently make the whole training process run its CPU math on one
    intra-op thread (the datamodule calls this before anything else of FFCV is imported).
    """
    try:
        with keep_torch_threads():
            import ffcv.loader  # noqa: F401
    except ImportError:
        return False
    return True


class _EpochSetter:
    """What Lightning finds as ``dataloader.sampler``: ``set_epoch(e)`` makes the next iteration epoch ``e``."""

    def __init__(self, owner: FFCVLoader) -> None:
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)


class FFCVLoader:
    """Iterable of ``(images uint8 (B, 3, S, S), labels int64 (B,))`` around an ``ffcv.loader.Loader``.

    Not a ``torch.utils.data.DataLoader``, so Lightning never injects a sampler into it: ``use_distributed_sampler``
    has no effect on it and may stay on. ``len()`` is the number of batches per epoch on this rank.

    Epochs: every iteration started before the next ``set_epoch`` call replays the same epoch (Lightning calls
    ``iter()`` more than once per epoch, e.g. to check the loader is iterable); after an iteration runs to the end
    without a new ``set_epoch``, the next one advances by one epoch, so plain ``for epoch ...: for batch in loader``
    loops also see a new order each epoch. FFCV starts decoding at the first ``next()``, not at ``iter()``.

    State (training loaders): ``state_dict()`` is a :class:`~impulsevit.data.loading.sampling.LoaderState` dict — the
    epoch
    and the batches of it consumed on this rank (from ``progress()`` when the datamodule binds Lightning's training
    progress to it, else the batches this loader has yielded); ``load_state_dict()`` makes the next iteration of that
    epoch start right after them (re-sharded when the state was taken on another world size). Evaluation loaders
    report their position but cannot be resumed.
    """

    def __init__(self, loader, order=None, epoch_state: np.ndarray | None = None) -> None:  # noqa: ANN001
        self.loader = loader  # an ffcv.loader.Loader
        self.order = order  # its training order (see _train_order_factory), None for evaluation
        # read by a compiled decoder whose augmentation draws are keyed by the epoch (set before each epoch)
        self.epoch_state = epoch_state
        self.sampler = _EpochSetter(self)
        self.batch_sampler = None  # Lightning's loops probe DataLoader attributes; batching happens inside FFCV
        self.progress: Callable[[], tuple[int, int] | None] | None = None
        self._epoch = 0
        self._completed = False
        self._position = (0, 0)

    def __len__(self) -> int:
        n = len(self.loader)
        r = self.order.resume if self.order is not None else None
        if r is not None and r.world_size != self.order.world:  # the re-sharded epoch, counted from the restored step
            return max(n, r.batches + len(self.order.plan(r.epoch)) // self.loader.batch_size)
        return n

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)
        self._completed = False
        if self.order is not None and self.order.resume is not None and self.order.resume.epoch != self._epoch:
            self.order.resume = None

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will use."""
        return self._epoch + 1 if self._completed else self._epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self._iterate()

    def _iterate(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.epoch
        self._epoch, self._completed = epoch, False
        r = self.order.resume if self.order is not None else None
        done = r.batches if r is not None and r.epoch == epoch else 0
        self._position = (epoch, done)
        self.loader.next_epoch = epoch
        if self.epoch_state is not None:
            self.epoch_state[0] = epoch
        with keep_torch_threads():
            it = iter(self.loader)
        for batch in it:
            done += 1
            self._position = (epoch, done)
            yield batch
        self._completed = True

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """This rank's position as a :class:`LoaderState` dict (epoch, batches, samples, and the order's identity)."""
        pos = self.progress() if self.progress is not None else None
        if pos is None:
            pos = (self._epoch + 1, 0) if self._completed else self._position
        o = self.order
        return LoaderState(
            epoch=int(pos[0]), batches=int(pos[1]), batch_size=int(self.loader.batch_size),
            world_size=o.world if o is not None else dist_info()[1], num_samples=len(self.loader.indices),
            seed=int(self.loader.seed), repeats=o.repeats if o is not None else 1,
            order=o.kind if o is not None else "sequential",
        ).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue epoch ``state['epoch']`` after its first ``state['batches']`` batches (see the class docstring).

        Raises:
            ValueError: the state belongs to another order (batch size, sample count, seed or repeats differ), or
                this is an evaluation loader.
        """
        s = LoaderState.from_dict(state)
        if self.order is None:
            raise ValueError("only training FFCV loaders can be resumed (this one has a sequential order)")
        s.check(batch_size=self.loader.batch_size, num_samples=len(self.loader.indices), seed=self.loader.seed,
                repeats=self.order.repeats)
        self.set_epoch(s.epoch)
        self.order.resume = s if s.batches > 0 else None
        self._position = (s.epoch, s.batches)


def _train_order_factory(kind: str, repeats: int, rank: int, world_size: int):  # noqa: ANN202 - a TraversalOrder
    """FFCV's ``Loader`` accepts a custom order only as a ``TraversalOrder`` instance, which it calls with itself
    (``order(loader)``): the returned factory builds the :class:`_TrainOrder` (``kind``: ``random`` | ``repeated`` |
    ``quasi_random``)."""
    from ffcv.traversal_order.base import TraversalOrder

    class TrainOrder(TraversalOrder):
        """Training order of one rank: :func:`~impulsevit.data.loading.sampling.epoch_sequence` (``random`` /
        ``repeated``,
        the same orders as the torchvision backend) or FFCV's page-aware ``QuasiRandom`` (single process, not
        OS-cached); ``resume`` (a :class:`LoaderState`) makes its epoch yield only the remaining full batches."""

        def __init__(self, loader) -> None:  # noqa: ANN001
            super().__init__(loader)
            self.kind, self.repeats, self.rank, self.world = kind, int(repeats), int(rank), int(world_size)
            self.resume: LoaderState | None = None
            self._quasi = None

        def _quasi_order(self, epoch: int) -> np.ndarray:
            if self._quasi is None:
                from ffcv.traversal_order.quasi_random import QuasiRandom

                # a view of the loader as QuasiRandom wants it (it refuses distributed loaders; a state taken on
                # one process is re-sharded here when the resumed run has several)
                view = SimpleNamespace(indices=self.loader.indices, seed=self.loader.seed, distributed=False,
                                       memory_manager=self.loader.memory_manager, batch_size=self.loader.batch_size)
                self._quasi = QuasiRandom(view)
            return np.asarray(self._quasi.sample_order(epoch), dtype=np.int64)

        def sequence(self, epoch: int, kind: str, world: int) -> tuple[np.ndarray, int]:
            if kind == "quasi_random":
                seq = self._quasi_order(epoch)  # dataset indices; build_ffcv_loader passes no subset, so positions
                return seq, len(seq)
            return epoch_sequence(len(self.indices), epoch=epoch, seed=self.seed, world_size=world,
                                  repeats=self.repeats)

        def plan(self, epoch: int) -> np.ndarray:
            """Positions (into ``self.indices``) this rank visits in ``epoch``; a resumed epoch's remaining full
            batches."""
            r = self.resume
            if r is not None and r.epoch == epoch:
                seq, per_rank = self.sequence(epoch, r.order, r.world_size)
                local, _ = resumed_shard(seq, per_rank, old_world=r.world_size, consumed=r.batches * r.batch_size,
                                         batch_size=r.batch_size, rank=self.rank, world_size=self.world)
                bs = self.loader.batch_size
                return local[: len(local) // bs * bs]  # FFCV yields a last partial batch unless it is cut here
            seq, per_rank = self.sequence(epoch, self.kind, self.world)
            return seq[self.rank::self.world][:per_rank]

        def sample_order(self, epoch: int) -> np.ndarray:
            return self.indices[self.plan(epoch)]

    class Factory(TraversalOrder):
        def __init__(self) -> None:  # deliberately skips TraversalOrder.__init__ (it needs the loader)
            pass

        def __call__(self, loader) -> TrainOrder:  # noqa: ANN001
            return TrainOrder(loader)

        def sample_order(self, epoch: int) -> np.ndarray:
            raise TypeError("the training-order factory is not an order; FFCV's Loader calls it first")

    return Factory()


@contextlib.contextmanager
def keep_torch_threads() -> Iterator[None]:
    """Restore the caller's ``torch.get_num_threads()`` on exit: FFCV's import and its ``Loader`` (constructor and
    ``iter()``) call ``torch.set_num_threads(num_workers)`` on the calling thread, which silently changes the intra-op
    thread count of the training process."""
    n = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(n)


def fits_in_memory(path: str | os.PathLike, fraction: float = 0.5) -> bool:
    """True when the file is smaller than ``fraction`` of the memory currently available (``psutil``: Linux
    ``MemAvailable``, the platform's equivalent elsewhere)."""
    import psutil

    return os.path.getsize(path) < fraction * psutil.virtual_memory().available


def _loader_class():  # noqa: ANN202
    from ffcv.loader import Loader

    from impulsevit._compat.ffcv import replaced_os_cache_manager

    class SlackLoader(Loader):
        """FFCV's ``Loader`` built with one more output slot than its queue needs (``batches_ahead`` is passed + 1,
        the queue is shrunk back at every epoch): FFCV fills slot ``k + batches_ahead + 2`` while the consumer may
        still hold batch ``k`` and ``k + 1``, so without the spare slot the batch Lightning is training on can be
        overwritten by the decoder after Lightning prefetched the next one.

        Built with :func:`impulsevit._compat.ffcv.replaced_os_cache_manager`: FFCV's OS-cache manager would otherwise
        edit numba's shared ``array(uint8, 1d, C)`` type, corrupting the compiled-signature table of every dispatcher
        already holding it (the ``imdecode`` of an earlier loader's decoder then raises ``KeyError`` when collected).
        """

        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - FFCV's Loader arguments
            with replaced_os_cache_manager():
                super().__init__(*args, **kwargs)

        def __iter__(self):  # noqa: ANN204
            iterator = super().__iter__()
            iterator.output_queue.maxsize = max(1, self.batches_ahead - 1)
            return iterator

    return SlackLoader


def build_ffcv_loader(path: str | os.PathLike, *, train: bool, image_size: int, batch_size: int, num_workers: int,
                      scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
                      hflip: float = 0.5, crop_pct: float = 0.875, interpolation: str = "bicubic", seed: int = 0,
                      in_memory: bool | None = None, repeated_aug: int = 1, drop_last: bool | None = None,
                      batches_ahead: int = 3, device: torch.device | str | None = None,
                      resample_on: str = "workers") -> FFCVLoader:
    """An :class:`FFCVLoader` over ``path`` for training (random resized crop + flip, shuffled) or evaluation (timm's
    resize + centre crop, in order), resampled with ``interpolation`` (``bicubic`` | ``bilinear``, PIL's filters).
    Call it after the process group exists (inside the dataloader hooks); the rank and world size are read from it.
    ``in_memory=None`` chooses OS caching when the file fits in half the available memory. ``device``: a CUDA device
    ends both pipelines in FFCV's ``ToDevice(non_blocking=True)`` (FFCV then owns the pinned staging buffers and
    orders their reuse after the copies); None or a CPU device leaves the batches in FFCV's host buffers.
    ``resample_on``: ``workers`` (the threads resample, batches are uint8 ``(B, 3, S, S)``) or ``device`` (training
    only: the threads yield canvas batches uint8 ``(B, 3, K + 1, K)`` that
    :func:`impulsevit.data.loading.device_resample.resample_canvas` turns into the same ``(B, 3, S, S)`` pixels on
    the consumer's device; evaluation loaders ignore it)."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.loader import OrderOption
    from ffcv.transforms import Squeeze, ToDevice, ToTensor, ToTorchImage

    from impulsevit.data.storage.integrity import check_header

    if not os.path.isfile(path):
        raise FileNotFoundError(f"FFCV file {path} does not exist (run `impulsevit convert` or the datamodule's "
                                f"prepare_data first)")
    if resample_on not in ("workers", "device"):
        raise ValueError(f"resample_on must be 'workers' or 'device', got {resample_on!r}")
    check_header(path)  # a truncated / foreign file: one line naming it, not an error deep inside FFCV
    rank, world = dist_info()
    distributed = world > 1
    os_cache = fits_in_memory(path) if in_memory is None else bool(in_memory)
    epoch_state = np.zeros(1, dtype=np.int64)
    decoder = resample_decoder(image_size, train=train, interpolation=interpolation, scale=tuple(scale),
                                ratio=tuple(ratio), flip_prob=hflip if train else 0.0, crop_pct=crop_pct, seed=seed,
                                rank=rank, repeated_aug=repeated_aug if train else 1, epoch_state=epoch_state,
                                canvas=train and resample_on == "device")
    if train:
        kind = "repeated" if repeated_aug > 1 else "random" if distributed or os_cache else "quasi_random"
        order = _train_order_factory(kind, repeated_aug, rank, world)
    else:
        order = OrderOption.SEQUENTIAL
    to_device = [] if device is None or torch.device(device).type == "cpu" else [
        ToDevice(torch.device(device), non_blocking=True)]
    image_pipe = [decoder, ToTensor(), *to_device, ToTorchImage()]
    label_pipe = [IntDecoder(), ToTensor(), Squeeze(1), *to_device]
    with keep_torch_threads():
        loader = _loader_class()(str(path), batch_size=batch_size, num_workers=max(1, num_workers),
                                 os_cache=os_cache, order=order, distributed=distributed, seed=seed,
                                 batches_ahead=max(1, batches_ahead) + 1,
                                 drop_last=train if drop_last is None else drop_last,
                                 pipelines={"image": image_pipe, "label": label_pipe})
    return FFCVLoader(loader, loader.traversal_order if train else None, epoch_state=epoch_state)
