"""The FFCV image decoder of both pipelines (:func:`resample_decoder`): decode, draw the crop and flip, and resample
with PIL's filter straight into FFCV's batch slot, compiled by numba in FFCV's worker threads; beside the resample
kernels it runs (:mod:`impulsevit.data.loading.resample`) and the device-side resample it can hand the batch to
(:mod:`impulsevit.data.loading.device_resample`). The loader that builds it is
:mod:`impulsevit.data.loading.ffcv_loader`.

FFCV, numba and llvmlite are imported inside the functions, when a decoder is built: importing this module needs
neither.
"""

from __future__ import annotations

import numpy as np

__all__ = ["resample_decoder"]


def _epoch_reader(state: np.ndarray):  # noqa: ANN202 - a function for numba
    """A function, compilable by numba, returning ``state[0]`` as it is *when called*. numba freezes arrays captured
    by compiled code as constants, so the value is read through its address (copied with FFCV's ``memcpy``);
    ``state`` must outlive the compiled code (the :class:`~impulsevit.data.loading.ffcv_loader.FFCVLoader` holds it)."""
    from ffcv.libffcv import ctypes_memcopy

    if state.dtype != np.int64 or state.shape != (1,) or not state.flags.c_contiguous:
        raise TypeError("the epoch state must be a contiguous int64 array of shape (1,)")
    address = state.ctypes.data

    def read_epoch():  # noqa: ANN202
        out = np.zeros(1, dtype=np.int64)
        ctypes_memcopy(address, out.ctypes.data, 8)
        return out[0]

    return read_epoch


def resample_decoder(output_size: int, *, train: bool, interpolation: str, scale: tuple[float, float] = (0.08, 1.0),
                     ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_prob: float = 0.0, crop_pct: float = 0.875,
                     seed: int = 0, rank: int = 0, repeated_aug: int = 1,
                     epoch_state: np.ndarray | None = None, canvas: bool = False):  # noqa: ANN202 - an ffcv Operation
    """The image decoder of both pipelines: decode (JPEG via FFCV's libjpeg-turbo call, or raw), crop and resample
    with PIL's filter (:mod:`impulsevit.data.loading.resample`) straight into the ``(S, S, 3)`` batch slot, in FFCV's
    worker threads.

    - train: torchvision's ``RandomResizedCrop(S, scale, ratio, interpolation)`` geometry, then a horizontal flip
      with probability ``flip_prob``, as timm's train transform orders them (the resample writes the flipped
      columns directly, see :func:`impulsevit.data.loading.resample.resample_crop`);
    - eval: timm's ``Resize(floor(S / crop_pct))`` + ``CenterCrop(S)`` (only the kept window is computed).

    Draws (crop box, flip) are a function of ``(seed, epoch, sample index, occurrence)``: each sample hashes those
    into its own key (:func:`impulsevit.data.loading.resample.sample_key`); ``occurrence`` counts earlier copies of the
    same
    index in the batch. With ``repeated_aug > 1`` the key also takes ``rank`` and the batch's first index, so the
    copies of an image (on other ranks, or straddling a batch boundary on the same rank) draw differently; then the
    draws depend on the batch layout too. The epoch is read at the start of every batch from ``epoch_state[0]``,
    which :class:`~impulsevit.data.loading.ffcv_loader.FFCVLoader` sets before each epoch's first batch is decoded.

    ``canvas`` (train only; ``data.resample_on: device``): the same decode and the same draws, but the crop box is
    copied unresampled to the top-left of a ``K × K`` canvas and the box and flip are written into an extra row
    (:func:`impulsevit.data.loading.device_resample.pack_box`): the output is ``(K + 1, K, 3)`` per sample, ``K``
    = :func:`~impulsevit.data.loading.device_resample.canvas_side` of the stored sizes and ``ratio`` (known when
    FFCV hands the decoder the file's metadata). The training device then resamples the batch
    (:func:`~impulsevit.data.loading.device_resample.resample_canvas`), byte-identical to this decoder's own
    resample.

    Why both: a PIL-exact resample costs a worker core more than the decode (about 340 µs vs 236 µs per stored image
    at 224 px, measured), so with it in the threads the loader reaches about a third of the decode-only rate per core.
    On a GPU run the resample can move to the device instead: an exact integer resample (float64 coefficients as
    Pillow computes them, int32 gather-multiply-add passes) answers the lack of a ``grid_sample`` equivalent of
    PIL's antialiased reduction, and the workers only decode and copy (``benchmarks/loader_speed.py``: 0.75 of the
    decode limit per core, against 0.30 with the resample in the workers). Its costs: every sample travels as a fixed
    ``K × K`` canvas (for ``short256`` and ratio ``4/3``, K <= 344: up to 2.4× the bytes of a 224 px batch), and the
    device spends the resample (unmeasured here: no GPU). On CPU trainers (tests, small recipes) the training thread
    would pay a resize far slower than numba's (``benchmarks/device_resample_speed.py``), so the workers' resample
    stays the default.
    """
    from ffcv.fields.rgb_image import IMAGE_MODES
    from ffcv.libffcv import imdecode
    from ffcv.pipeline.compiler import Compiler

    from impulsevit._compat.ffcv import resized_crop_decoder_base
    from impulsevit.data.loading import resample as rs
    from impulsevit.data.loading.device_resample import canvas_side, pack_box

    if interpolation not in rs.FILTERS:
        raise ValueError(f"interpolation {interpolation!r} is not supported by the FFCV decoder; use one of "
                         f"{sorted(rs.FILTERS)}")
    kind = rs.FILTERS[interpolation]
    size = int(output_size)
    s0, s1 = (float(v) for v in scale)
    if not 0 < s0 <= s1 <= 1 or not 0 < ratio[0] <= ratio[1]:
        raise ValueError(f"need 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1]; got scale={scale}, "
                         f"ratio={ratio}")
    lr0, lr1 = float(np.log(ratio[0])), float(np.log(ratio[1]))
    p = float(flip_prob)
    crop = float(crop_pct)
    seed_, rank_ = int(seed), int(rank) if repeated_aug > 1 else 0
    batch_tag = repeated_aug > 1
    state = np.zeros(1, dtype=np.int64) if epoch_state is None else epoch_state
    if canvas and not train:
        raise ValueError("the canvas output is for training pipelines (evaluation resamples in the workers)")

    class ResampleDecoder(resized_crop_decoder_base()):  # FFCV's decoder with our decode code (see its contract)
        def __init__(self) -> None:
            super().__init__((size, size))
            self.epoch_state = state  # keeps the array the compiled code reads alive

        def declare_state_and_memory(self, previous_state):  # noqa: ANN001, ANN202
            if canvas:  # FFCV has set self.metadata (the file's per-image fields) by now
                side = canvas_side(self.metadata["height"], self.metadata["width"], ratio)
                self.output_size = (side + 1, side)
            return super().declare_state_and_memory(previous_state)

        def generate_code(self):  # noqa: ANN202
            jpg = IMAGE_MODES["jpg"]
            mem_read = self.memory_read
            my_range = Compiler.get_iterator()
            imdecode_c = Compiler.compile(imdecode)
            read_epoch = Compiler.compile(_epoch_reader(state))
            resample_crop, rrc, copy_box = rs.resample_crop, rs.random_resized_crop, rs.copy_window
            key_of, uniform, center = rs.sample_key, rs.uniform, rs.resize_short_crop_center
            pack = Compiler.compile(pack_box)
            to_canvas = canvas

            def decode(batch_indices, my_storage, metadata, storage_state):  # noqa: ANN001, ANN202
                destination, temp_storage = my_storage
                epoch = read_epoch()
                n = len(batch_indices)
                first = np.int64(batch_indices[0]) + 1 if batch_tag else np.int64(0)
                for dst_ix in my_range(n):
                    source_ix = batch_indices[dst_ix]
                    field = metadata[source_ix]
                    image_data = mem_read(field["data_ptr"], storage_state)
                    height = np.int64(field["height"])
                    width = np.int64(field["width"])
                    if field["mode"] == jpg:
                        temp = temp_storage[dst_ix]
                        h32, w32 = np.uint32(height), np.uint32(width)
                        imdecode_c(image_data, temp, h32, w32, h32, w32, 0, 0, 1, 1, False, False)
                        image = temp.reshape(-1)[:3 * height * width].reshape(height, width, 3)
                    else:
                        image = image_data.reshape(height, width, 3)
                    out = destination[dst_ix]
                    if train:
                        occurrence = np.int64(0)
                        for k in range(dst_ix):
                            if batch_indices[k] == source_ix:
                                occurrence += 1
                        key = key_of(seed_, epoch, rank_, np.int64(source_ix), occurrence * 4294967296 + first)
                        i, j, h, w = rrc(height, width, s0, s1, lr0, lr1, key)
                        flip = p > 0 and uniform(key, 22) < p
                        if to_canvas:
                            copy_box(image, i, j, h, w, out)
                            pack(out[out.shape[1]].reshape(-1), h, w, flip)
                        else:
                            resample_crop(image, i, j, h, w, size, size, 0, 0, out, kind, flip)
                    else:
                        center(image, height, width, crop, out, kind)
                return destination[:n]

            decode.is_parallel = True
            return decode

    return ResampleDecoder()
