"""FFCV ``Loader`` construction for training and evaluation, and the thin adapter Lightning iterates.

Pipelines (``.beton`` fields ``image`` and ``label`` as written by :mod:`impulsevit.data.convert`):

- train: FFCV's ``RandomResizedCropRGBImageDecoder(S, scale, ratio)`` with the horizontal flip (probability ``p``)
  fused in → ``ToTensor`` → ``ToTorchImage`` (channels-last view) — uint8 ``(B, 3, S, S)``;
- eval: ``CenterCropRGBImageDecoder(S, ratio=crop_pct)`` (crops ``crop_pct`` of the shorter side, resizes to S: the
  same region as timm's resize-to-``S / crop_pct`` + centre crop) → ``ToTensor`` → ``ToTorchImage``;
- label: ``IntDecoder`` → ``ToTensor`` → ``Squeeze`` — int64 ``(B,)``.

Normalisation is not in the FFCV pipeline: the datamodule normalises (and augments) on the training device in
``on_after_batch_transfer``. FFCV's own ``NormalizeImage`` needs cupy on GPU and, on CPU, hangs the ``Loader``
constructor unless placed right after the decoder (design.md §5); keeping uint8 to the device also moves 4× fewer
bytes. The ``Loader`` is built and iterated with torch's thread count saved and restored (FFCV sets it to
``num_workers`` on the calling thread).

Ordering (training): one rank's share of :func:`impulsevit.data.sampling.epoch_sequence` — the same seeded orders
as the torchvision backend (``DistributedSampler``'s shuffle seeded ``seed + epoch``, or repeated augmentation),
through a custom ``TraversalOrder`` — or, single-process and not OS-cached, FFCV's page-aware ``QUASI_RANDOM``
(seeded ``seed * 912300 + epoch``); ``SEQUENTIAL`` for evaluation, ``distributed=True`` when a process group with more
than one rank exists. Every order is a function of (seed, epoch, rank, world size), not of thread scheduling.
:class:`FFCVLoader` exposes ``sampler.set_epoch`` so Lightning sets the epoch (also after a resume), and is stateful
(``state_dict`` / ``load_state_dict``, see :mod:`impulsevit.data.sampling`): a resumed run continues the interrupted
epoch after the batches it had consumed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from impulsevit.data.base import dist_info
from impulsevit.data.sampling import LoaderState, epoch_sequence, resumed_shard

__all__ = ["FFCVLoader", "build_ffcv_loader", "ffcv_available"]


def ffcv_available() -> bool:
    """True when ``ffcv`` imports (it needs OpenCV and libjpeg-turbo at build time)."""
    try:
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

    State (training loaders): ``state_dict()`` is a :class:`~impulsevit.data.sampling.LoaderState` dict — the epoch
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
        with _KeepTorchThreads():
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
        """Training order of one rank: :func:`~impulsevit.data.sampling.epoch_sequence` (``random`` / ``repeated``,
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


def _hflip_inplace(image: np.ndarray) -> None:
    """Mirror an ``(H, W, C)`` uint8 image left-right in place (compiled by FFCV's ``Compiler``)."""
    height, width, channels = image.shape
    for r in range(height):
        for j in range(width // 2):
            k = width - 1 - j
            for c in range(channels):
                t = image[r, j, c]
                image[r, j, c] = image[r, k, c]
                image[r, k, c] = t


def _crop_flip_decoder(output_size: tuple[int, int], scale: tuple[float, float], ratio: tuple[float, float],
                       flip_prob: float):  # noqa: ANN202 - an ffcv Operation
    """FFCV's ``RandomResizedCropRGBImageDecoder`` followed, inside the same compiled stage, by an in-place horizontal
    flip of each image with probability ``flip_prob``.

    The crop is FFCV's own (its compiled decode runs unchanged); the flip rule is that of FFCV's
    ``RandomHorizontalFlip``, which as a separate stage instead copies every image of the batch (flipped or not) into
    a second buffer through a negative-stride loop: at 224 px that copy cost four times the crop + resize of a raw
    image here. In-place mirroring touches only the images that flip.
    """
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.pipeline.compiler import Compiler

    class RandomResizedCropFlipDecoder(RandomResizedCropRGBImageDecoder):
        def __init__(self) -> None:
            super().__init__(output_size, scale=scale, ratio=ratio)
            self.flip_prob = float(flip_prob)

        def generate_code(self):  # noqa: ANN202
            crop = Compiler.compile(super().generate_code())  # FFCV's decode + crop + resize, parallel over images
            flip = Compiler.compile(_hflip_inplace)
            images = Compiler.get_iterator()
            p = self.flip_prob

            def decode_crop_flip(batch_indices, my_storage, metadata, storage_state):  # noqa: ANN001, ANN202
                out = crop(batch_indices, my_storage, metadata, storage_state)
                if p > 0:
                    for ix in images(len(batch_indices)):
                        if np.random.rand() < p:
                            flip(out[ix])
                return out

            decode_crop_flip.is_parallel = True
            return decode_crop_flip

    return RandomResizedCropFlipDecoder()


class _KeepTorchThreads:
    """FFCV's ``Loader`` (constructor and ``iter()``) calls ``torch.set_num_threads(num_workers)`` on the calling
    thread, which silently changes the intra-op thread count of the training process; this restores it."""

    def __enter__(self) -> None:
        self.n = torch.get_num_threads()

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.n)


def fits_in_memory(path: str | os.PathLike, fraction: float = 0.5) -> bool:
    """True when the file is smaller than ``fraction`` of the memory currently available (``psutil``: Linux
    ``MemAvailable``, the platform's equivalent elsewhere)."""
    import psutil

    return os.path.getsize(path) < fraction * psutil.virtual_memory().available


def build_ffcv_loader(path: str | os.PathLike, *, train: bool, image_size: int, batch_size: int, num_workers: int,
                      scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
                      hflip: float = 0.5, crop_pct: float = 0.875, seed: int = 0, in_memory: bool | None = None,
                      repeated_aug: int = 1, drop_last: bool | None = None, batches_ahead: int = 3) -> FFCVLoader:
    """An :class:`FFCVLoader` over ``path`` for training (random crop + flip, shuffled) or evaluation (centre crop,
    in order). Call it after the process group exists (inside the dataloader hooks); the rank and world size are
    read from it. ``in_memory=None`` chooses OS caching when the file fits in half the available memory."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import Squeeze, ToTensor, ToTorchImage

    if not os.path.isfile(path):
        raise FileNotFoundError(f"FFCV file {path} does not exist (run `impulsevit convert` or the datamodule's "
                                f"prepare_data first)")
    rank, world = dist_info()
    distributed = world > 1
    os_cache = fits_in_memory(path) if in_memory is None else bool(in_memory)
    size = (int(image_size), int(image_size))
    if train:
        image_pipe = [_crop_flip_decoder(size, tuple(scale), tuple(ratio), hflip)]
        kind = "repeated" if repeated_aug > 1 else "random" if distributed or os_cache else "quasi_random"
        order = _train_order_factory(kind, repeated_aug, rank, world)
    else:
        image_pipe = [CenterCropRGBImageDecoder(size, ratio=crop_pct)]
        order = OrderOption.SEQUENTIAL
    image_pipe += [ToTensor(), ToTorchImage()]
    with _KeepTorchThreads():
        loader = Loader(str(path), batch_size=batch_size, num_workers=max(1, num_workers), os_cache=os_cache,
                        order=order, distributed=distributed, seed=seed, batches_ahead=batches_ahead,
                        drop_last=train if drop_last is None else drop_last,
                        pipelines={"image": image_pipe, "label": [IntDecoder(), ToTensor(), Squeeze(1)]})
    return FFCVLoader(loader, loader.traversal_order if train else None)
