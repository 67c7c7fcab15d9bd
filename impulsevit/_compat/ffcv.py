"""FFCV internals impulsevit uses (see :mod:`impulsevit._compat`). FFCV is optional: these import it when called."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np

__all__ = ["replaced_os_cache_manager", "replaced_writer_worker", "resized_crop_decoder_base"]


@contextlib.contextmanager
def replaced_writer_worker(worker: Callable[..., Any], sleep: Callable[[float], None]) -> Iterator[None]:
    """Within the block, FFCV's ``DatasetWriter`` runs ``worker`` in its writer processes instead of
    ``ffcv.writer.worker_job_indexed_dataset`` (same signature) and waits with ``sleep`` instead of ``time.sleep``
    (it polls its workers with ``sleep(0.1)``; a ``sleep`` that raises aborts the wait). Both are restored on exit.
    Not supported: two writes in threads of one process at the same time (the module globals are shared).

    Reaches: ``ffcv.writer.worker_job_indexed_dataset`` and ``ffcv.writer.sleep`` (module globals, patched)
    Checked on: ffcv==1.0.2
    Waits for: a worker-failure callback or timeout in ``DatasetWriter.from_indexed_dataset`` (FFCV waits forever
    for a worker that died).
    """
    import ffcv.writer as fw

    with mock.patch.object(fw, "worker_job_indexed_dataset", worker), mock.patch.object(fw, "sleep", sleep):
        yield


def resized_crop_decoder_base() -> type:
    """A base class for an RGB-image decoder that replaces the decoding code of FFCV's
    ``ResizedCropRGBImageDecoder`` with its own (``generate_code``), keeping that decoder's memory plan.

    What a subclass's ``generate_code`` may rely on (FFCV 1.0.2's decoder, not a documented contract): the compiled
    function is called as ``decode(batch_indices, (destination, temp_storage), metadata, storage_state)`` with
    ``destination`` ``(B, H, W, 3)`` uint8 for the size given to ``__init__`` and ``temp_storage`` one flat buffer per
    sample large enough for the biggest stored image; ``metadata[i]`` has the fields ``mode`` (``IMAGE_MODES``:
    ``jpg`` / ``raw``), ``width``, ``height``, ``data_ptr``; ``self.memory_read(ptr, storage_state)`` returns the
    sample's bytes; ``Compiler.get_iterator()`` is the parallel range. ``get_crop_generator`` (abstract in FFCV, read
    only by the replaced ``generate_code``) is None here. ``declare_state_and_memory`` finds ``self.metadata`` (the
    file's per-image ``height`` / ``width`` arrays) set and reads ``self.output_size`` then, so a subclass may size
    its output from the stored sizes there before calling it (the canvas decoder of ``data.resample_on=device``).

    Reaches: ``ffcv.fields.rgb_image.ResizedCropRGBImageDecoder.generate_code`` (overridden) and the memory layout of
    its ``declare_state_and_memory``
    Checked on: ffcv==1.0.2
    Waits for: a documented decoder API for custom crops/resamplers (FFCV's public ``Operation`` API works on decoded
    images only, after the fixed-size crop).
    """
    from ffcv.fields.rgb_image import ResizedCropRGBImageDecoder

    class CustomCodeRGBDecoder(ResizedCropRGBImageDecoder):
        @property
        def get_crop_generator(self):  # noqa: ANN202
            return None

    return CustomCodeRGBDecoder


@contextlib.contextmanager
def replaced_os_cache_manager() -> Iterator[None]:
    """Within the block, ``ffcv.loader.Loader(..., os_cache=True)`` builds its memory manager from a subclass of
    FFCV's ``OSCacheManager`` that types its file reader without editing numba's types; restored on exit.
    Not supported: ``Loader`` constructions in two threads of one process at the same time (the module global is
    shared).

    Why: FFCV 1.0.2's ``OSCacheManager.state_type`` sets ``mutable = False`` on the object ``numba.uint8[::1]``
    returns, which is numba's interned ``array(uint8, 1d, C)`` — the one instance of that type the whole process
    shares. An array type hashes by ``(dtype, ndim, layout, mutable, aligned)``, so every dictionary that already
    holds it inside a key loses that entry: a dispatcher compiled earlier for a writable uint8 array (FFCV's
    ``imdecode`` as compiled for the previous loader's decoder) raises ``KeyError`` in its finalizer once collected
    (``Exception ignored in: <finalize object ...>``), and numba no longer finds that compiled signature. The
    subclass types the memory map (opened read-only) as its own ``readonly array(uint8, 1d, C)`` and returns that
    type from the reader: the signature FFCV's reader ends up with, with numba's shared types left as they were.

    Reaches: ``ffcv.loader.loader.OSCacheManager`` (module global, patched); ``OSCacheManager.state_type`` and
    ``compile_reader`` (overridden; the reader's code is FFCV's)
    Checked on: ffcv==1.0.2
    Waits for: an FFCV release whose ``OSCacheManager.state_type`` builds a read-only array type instead of editing
    the shared one.
    """
    import ffcv.loader.loader as fl
    import numba as nb
    from ffcv.memory_managers.os_cache import OSCacheManager
    from ffcv.pipeline.compiler import Compiler

    data = nb.types.Array(nb.types.uint8, 1, "C", readonly=True)  # np.memmap(..., mode="r") of the whole file
    index = nb.types.Array(nb.types.uint64, 1, "C")  # the sample pointers and sizes

    class ReadOnlyTypedOSCacheManager(OSCacheManager):
        @property
        def state_type(self):  # noqa: ANN202 - a numba type
            return nb.types.Tuple([data, index, index])

        def compile_reader(self):  # noqa: ANN202 - a numba dispatcher
            def read(address, mem_state):  # noqa: ANN001, ANN202
                size = mem_state[2][np.searchsorted(mem_state[1], address)]
                return mem_state[0][address:address + size]

            return Compiler.compile(read, data(nb.types.uint64, self.state_type))

    with mock.patch.object(fl, "OSCacheManager", ReadOnlyTypedOSCacheManager):
        yield
