"""The litdata backend's training loader on the fast path: threads of the training process fill whole batches, as
FFCV's loader does, instead of ``DataLoader`` worker processes.

Why: per sample a ``DataLoader`` worker of the fast path spends what FFCV's threads spend (the stored bytes from a
memory map, libjpeg-turbo's decode, the numba crop), but each batch then crosses from the worker process to the
training process (stacked into a fresh shared-memory segment, mapped there): 0.2–0.5 ms of wall time per image on a
loaded 2-core machine, a quarter to a third of the litdata row's time at 2,000 images (``docs/benchmarks.md``). Here
each thread writes its batch's images straight into one ``(B, S, S, 3)`` uint8 tensor (pinned when CUDA is
available, as ``DataLoader(pin_memory=True)`` would hand it on) with the GIL released in the hot parts: torchvision's
JPEG decode op (a ``torch.ops`` call, which runs without the GIL) and the numba kernels (compiled ``nogil``).

What stays as it is: the order, the batches and the position. The loader is a
:class:`~impulsevit.data.loading.sampling.ResumableDataLoader` (a ``DataLoader`` to Lightning, with its
:class:`~impulsevit.data.loading.sampling.EpochSampler`, ``len()``, ``state_dict`` / ``load_state_dict``); only the
filling of the batches differs. Batch ``k`` of an epoch holds the sampler's keys ``k·B .. (k+1)·B`` (the last partial
batch dropped), each image :meth:`~impulsevit.data.loading.litdata_backend.ShardDataset.fill`'s — the same function of
(seed, epoch, position, stored sample) as the worker processes' ``__getitem__`` — so the batches are the
``DataLoader`` path's byte for byte (``tests/data/loading/test_threaded_loader.py``), whatever the thread count.

Threads: ``threads`` (``data.num_workers``); 0 fills each batch in the consuming thread when it is asked for. Batches
are handed to the threads in order, at most ``2 · threads`` ahead of the batch the consumer waits for (the
``DataLoader``'s default two batches per worker: the backend's prefetch window, ``lag``, counts on it); each key is
handed to :meth:`~impulsevit.data.loading.litdata_backend.ShardSource.follow` in order, by the thread taking the batch,
so the block order's chunk prefetch and deletion see one process reading in order; its downloads run 2 per thread
(:attr:`~impulsevit.data.loading.litdata_backend.ShardSource.prefetch_streams`), as many as the worker processes'
prefetch threads together. Every batch is a fresh tensor: a
batch the consumer keeps is never overwritten.

Failures: the first exception of a thread (a store that stopped answering: the source's one-line
:class:`~impulsevit.errors.DataError`) is raised by the consumer's next ``next()``, as itself; the other threads stop
after their current image.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch

from impulsevit.data.loading.sampling import EpochSampler, ResumableDataLoader, SampleKey

__all__ = ["ThreadedLoader"]


class ThreadedLoader(ResumableDataLoader):
    """Training batches ``(uint8 (B, 3, S, S) channels-last view, int64 (B,))`` of a
    :class:`~impulsevit.data.loading.litdata_backend.ShardDataset` whose plan has no ``rest`` transforms, filled by
    ``threads`` threads of this process (module docstring). ``num_workers`` reads ``threads`` (Lightning's worker
    check); no worker process is started."""

    def __init__(self, dataset: Any, *, sampler: EpochSampler, batch_size: int, threads: int,
                 pin_memory: bool = False) -> None:
        plan = getattr(dataset, "plan", None)
        if plan is None or plan.rest is not None:
            raise ValueError("ThreadedLoader needs a ShardDataset whose CropPlan has no `rest` transforms")
        if int(threads) < 0:
            raise ValueError(f"ThreadedLoader: threads must be >= 0, got {threads}")
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=0,
                         pin_memory=bool(pin_memory), collate_fn=dataset.collate_fn)
        self.threads = self.num_workers = int(threads)  # set after: DataLoader's check of worker processes
        dataset.source.prefetch_streams = 2 * max(self.threads, 1)  # as many chunk downloads as 2 per worker process

    def _buffers(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty((n, *self.dataset.plan.shape), dtype=torch.uint8, pin_memory=self.pin_memory),
                torch.empty(n, dtype=torch.int64, pin_memory=self.pin_memory))

    def _fill(self, keys: list[SampleKey], stop: threading.Event | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self._buffers(len(keys))
        pixels, classes = images.numpy(), labels.numpy()
        for b, key in enumerate(keys):
            if stop is not None and stop.is_set():
                break
            classes[b] = self.dataset.fill(key, pixels[b])
        return images.permute(0, 3, 1, 2), labels

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        keys = list(self.sampler)
        size = self.batch_size
        batches = [keys[k * size:(k + 1) * size] for k in range(len(keys) // size)]
        follow = self.dataset.source.follow
        if self.threads == 0:
            for batch in batches:
                for key in batch:
                    follow(key.epoch, key.position)
                yield self._fill(batch)
            return
        yield from _Epoch(self, batches, follow).run()


class _Epoch:
    """One epoch of a :class:`ThreadedLoader`: its threads, the batches they filled, the first failure."""

    def __init__(self, loader: ThreadedLoader, batches: list[list[SampleKey]], follow: Any) -> None:
        self.loader, self.batches, self.follow = loader, batches, follow
        self.window = 2 * loader.threads
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.next = 0  # the next batch a thread takes
        self.wanted = 0  # the batch the consumer waits for
        self.done: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.error: BaseException | None = None

    def _take(self) -> int | None:
        """The next batch for the calling thread (its keys handed to ``follow`` in order), None when none is left
        or the epoch stopped."""
        with self.cond:
            self.cond.wait_for(lambda: self.stop.is_set() or self.next >= len(self.batches)
                               or self.next < self.wanted + self.window)
            if self.stop.is_set() or self.next >= len(self.batches):
                return None
            k, self.next = self.next, self.next + 1
            for key in self.batches[k]:
                self.follow(key.epoch, key.position)
            return k

    def _work(self) -> None:
        try:
            while (k := self._take()) is not None:
                batch = self.loader._fill(self.batches[k], self.stop)
                with self.cond:
                    self.done[k] = batch
                    self.cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            with self.cond:
                if self.error is None:
                    self.error = exc
                self.stop.set()
                self.cond.notify_all()

    def run(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        threads = [threading.Thread(target=self._work, name=f"impulsevit-loader-{t}", daemon=True)
                   for t in range(self.loader.threads)]
        for t in threads:
            t.start()
        try:
            for k in range(len(self.batches)):
                with self.cond:
                    self.wanted = k
                    self.cond.notify_all()
                    self.cond.wait_for(lambda k=k: k in self.done or self.error is not None)
                    if self.error is not None:
                        raise self.error
                    batch = self.done.pop(k)
                yield batch
        finally:
            with self.cond:
                self.stop.set()
                self.cond.notify_all()
            if self.error is None:  # a thread stuck on a dead store is left behind (daemon): the error is raised now
                for t in threads:
                    t.join()
