"""FFCV internals impulsevit uses (see :mod:`impulsevit._compat`). FFCV is optional: these import it when called."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

__all__ = ["replaced_writer_worker", "resized_crop_decoder_base"]


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
