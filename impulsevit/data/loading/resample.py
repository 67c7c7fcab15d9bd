"""PIL's resampling and torchvision's crop geometry as plain numeric functions, compiled by numba inside FFCV's decoder.

Why: FFCV's crop decoders resize with OpenCV ``INTER_AREA``, which enlarges blockily (a 32 px CIFAR image enlarged to
224 px comes out as 7 × 7 blocks), while timm/DeiT resize with PIL's bicubic filter. These functions reproduce PIL's
``Image.resize`` (``Resample.c`` in Pillow): separable, horizontal pass first, coefficients of the filter evaluated at
the output pixel centres with the support widened by the reduction factor when reducing (so downscaling is
antialiased exactly as PIL does it), normalised, rounded to 22-bit fixed point, each pass rounded and clipped to
uint8. With the same source pixels and crop box, the output equals Pillow's byte for byte (tests compare them).

Filters: ``bicubic`` (cubic convolution, a = -0.5, support 2) and ``bilinear`` (triangle, support 1) — the two
``interpolation`` values timm's recipes use. Not supported: nearest, lanczos, box, hamming (a clear error is raised).

Random draws are counter-based: every uniform number is a hash (splitmix64 finaliser) of ``(seed, epoch, rank, sample
index, occurrence, draw number)``, so a sample's crop and flip do not depend on which thread decodes it, on the number
of threads, or on what was drawn before it (no shared generator state). See :func:`sample_key` and :func:`uniform`.

Every function here works on numpy arrays and scalars only, so numba compiles it with ``njit`` (FFCV's ``Compiler``);
called from plain Python it runs (slowly) with the same results, except :func:`sample_key` / :func:`uniform`, whose
64-bit wrap-around arithmetic needs the compiled form (use :data:`draw_uniform` from Python), and the horizontal
pass, whose 4-byte pixel moves are numba intrinsics (compiled code only). Compiled with ``nogil=True``: called from
Python (the litdata backend's loader threads) a kernel releases the GIL while it runs, so threads resample in
parallel.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from impulsevit.data.loading.device_resample import pack_box
from impulsevit.data.loading.filters import BICUBIC, BILINEAR, FILTERS, PRECISION_BITS

__all__ = [
    "BICUBIC", "BILINEAR", "FILTERS", "center_crop_geometry", "copy_window", "draw_uniform", "hflip",
    "random_resized_crop", "resample_crop", "resize_short_crop_center", "sample_key", "train_canvas", "train_crop",
    "uniform",
]


@njit(cache=True, nogil=True)
def _filter(kind: int, x: float) -> float:
    if x < 0.0:
        x = -x
    if kind == BICUBIC:  # Pillow's bicubic_filter, a = -0.5
        a = -0.5
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        if x < 2.0:
            return (((x - 5.0) * x + 8.0) * x - 4.0) * a
        return 0.0
    if x < 1.0:  # bilinear (triangle)
        return 1.0 - x
    return 0.0


@njit(cache=True, nogil=True)
def coefficients(in_size: int, in0: float, in1: float, out_full: int, out_start: int, out_n: int,
                 kind: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's ``precompute_coeffs`` + ``normalize_coeffs_8bpc`` for output pixels ``out_start .. out_start + out_n``
    of a resize of the source span ``[in0, in1)`` (of a line of ``in_size`` pixels) to ``out_full`` pixels.

    Returns ``bounds`` int64 ``(out_n, 2)`` (first source pixel, tap count) and ``weights`` int64 ``(out_n, ksize)``
    in fixed point (``1 << 22`` = 1.0)."""
    scale = (in1 - in0) / out_full
    filterscale = scale if scale > 1.0 else 1.0
    support = (2.0 if kind == BICUBIC else 1.0) * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    bounds = np.zeros((out_n, 2), dtype=np.int64)
    weights = np.zeros((out_n, ksize), dtype=np.int64)
    k = np.zeros(ksize, dtype=np.float64)
    ss = 1.0 / filterscale
    one = float(1 << PRECISION_BITS)
    for o in range(out_n):
        center = in0 + (o + out_start + 0.5) * scale
        xmin = int(center - support + 0.5)
        if xmin < 0:
            xmin = 0
        xmax = int(center + support + 0.5)
        if xmax > in_size:
            xmax = in_size
        xmax -= xmin
        ww = 0.0
        for x in range(xmax):
            w = _filter(kind, (x + xmin - center + 0.5) * ss)
            k[x] = w
            ww += w
        for x in range(xmax):
            w = k[x] / ww if ww != 0.0 else k[x]
            weights[o, x] = int(w * one - 0.5) if w < 0 else int(w * one + 0.5)
        bounds[o, 0] = xmin
        bounds[o, 1] = xmax
    return bounds, weights



LANES = 96
"""Lanes (bytes of a row) per call of :func:`_fir_block`: a compile-time trip count lets the compiler unroll the
vector loops without runtime checks (~30 % faster than the same loops over a runtime count)."""


@njit(cache=True, nogil=True)
def _fir_block(src: np.ndarray, r0: int, i0: int, bounds: np.ndarray, weights: np.ndarray, acc: np.ndarray,
               dst: np.ndarray, d0: int) -> None:
    """:func:`_fir` for the :data:`LANES` lanes ``i0 .. i0 + LANES`` of ``src``, written at ``d0 ..`` of ``dst``."""
    half = np.int32(1 << (PRECISION_BITS - 1))
    shift = np.int32(PRECISION_BITS)
    for o in range(bounds.shape[0]):
        for i in range(LANES):
            acc[i] = half
        y0 = r0 + bounds[o, 0]
        for t in range(bounds[o, 1]):
            w = np.int32(weights[o, t])
            line = src[y0 + t, i0:i0 + LANES]
            for i in range(LANES):
                acc[i] = np.int32(acc[i] + np.int32(np.int32(line[i]) * w))
        row = dst[o, d0:d0 + LANES]
        for i in range(LANES):
            v = acc[i] >> shift
            row[i] = np.uint8(0 if v < 0 else (255 if v > 255 else v))


@njit(cache=True, nogil=True)
def _fir(src: np.ndarray, r0: int, i0: int, n_lanes: int, bounds: np.ndarray, weights: np.ndarray,
         acc: np.ndarray, dst: np.ndarray) -> None:
    """The one resampling kernel of both passes: ``dst[o, i] = clip8(Σ_t src[r0 + bounds[o, 0] + t, i0 + i] ·
    weights[o, t])`` for ``i < n_lanes`` (``src`` and ``dst`` 2-D uint8, ``acc`` int32 scratch of at least
    ``max(n_lanes, LANES)``), clip8 = Pillow's rounding shift and clip to 0..255. Every product and sum is kept in
    int32, Pillow's fixed-point arithmetic (numba would widen them to int64, which halves the vector width and
    costs ~9× here), and the inner loops run over contiguous lanes, so the compiler vectorises them. Runs in blocks
    of :data:`LANES` lanes (:func:`_fir_block`: a block's source bytes stay in the L1 cache across its output
    rows), the rest in one runtime-length pass."""
    n_full = n_lanes // LANES * LANES
    for j in range(0, n_full, LANES):
        _fir_block(src, r0, i0 + j, bounds, weights, acc, dst, j)
    n = n_lanes - n_full
    if n == 0:
        return
    half = np.int32(1 << (PRECISION_BITS - 1))
    shift = np.int32(PRECISION_BITS)
    i1 = i0 + n_full
    for o in range(bounds.shape[0]):
        for i in range(n):
            acc[i] = half
        y0 = r0 + bounds[o, 0]
        for t in range(bounds[o, 1]):
            w = np.int32(weights[o, t])
            line = src[y0 + t, i1:i1 + n]
            for i in range(n):
                acc[i] = np.int32(acc[i] + np.int32(np.int32(line[i]) * w))
        row = dst[o, n_full:n_lanes]
        for i in range(n):
            v = acc[i] >> shift
            row[i] = np.uint8(0 if v < 0 else (255 if v > 255 else v))


@njit(cache=True, nogil=True)
def _vpass(src: np.ndarray, r0: int, c0: int, bounds: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
    """Vertical pass: ``out[o, x] = Σ_t src[r0 + bounds[o, 0] + t, c0 + x] · weights[o, t]`` (fixed point, int32 as
    Pillow), :func:`_fir` over the image rows (the lanes are a row's ``3 · n_out_cols`` bytes)."""
    n3 = out.shape[1] * 3
    acc = np.empty(max(n3, LANES), dtype=np.int32)
    _fir(src.reshape(src.shape[0], -1), r0, c0 * 3, n3, bounds, weights, acc, out.reshape(out.shape[0], -1))


def _flat_bytes(arr: types.Type) -> bool:
    """Whether ``arr`` is typed as a 1-D C-contiguous uint8 array (what the 4-byte moves address by byte offset)."""
    return isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C" and arr.dtype == types.uint8


@intrinsic
def _load4(typingctx, arr, offset):  # noqa: ANN001, ANN202
    """The 4 bytes at byte ``offset`` of the 1-D C-contiguous uint8 array ``arr`` as one uint32 (an unaligned load;
    the caller keeps ``offset + 4`` within the array). Not typed for any other array."""
    if not _flat_bytes(arr):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(32).as_pointer())
        return builder.load(ptr, align=1)
    return types.uint32(arr, offset), codegen


@intrinsic
def _store4(typingctx, arr, offset, value):  # noqa: ANN001, ANN202
    """Write the uint32 ``value`` as the 4 bytes at byte ``offset`` of the 1-D C-contiguous uint8 array ``arr``."""
    if not _flat_bytes(arr):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(32).as_pointer())
        builder.store(args[2], ptr, align=1)
        return context.get_dummy_value()
    return types.void(arr, offset, value), codegen


HPASS_ROWS = LANES // 3
"""Rows per block of :func:`_hpass` (one :func:`_fir_block` of lanes; its two small transposes stay in the cache)."""
_TILE = LANES + 4  # a tile row's bytes: room for a 4-byte store at its last pixel


@njit(cache=True, nogil=True)
def _hpass(src: np.ndarray, r0: int, c0: int, n_rows: int, bounds: np.ndarray, weights: np.ndarray,
           out: np.ndarray, flip: bool = False) -> None:
    """Horizontal pass ``out[r, o] = Σ_t src[r0 + r, c0 + bounds[o, 0] + t] · weights[o, t]`` for ``r < n_rows``
    (``src`` and ``out`` C-contiguous).

    Run in blocks of :data:`HPASS_ROWS` source rows: the block's columns ``bounds[0, 0] ..`` are transposed into a
    small ``(n_cols, 3 · rows)`` tile (each source row read once, in order), :func:`_fir_block` runs over the tile's
    columns as over image rows (same arithmetic, vectorised across the block's rows and channels), and the result
    tile is transposed into the output rows. Both transposes move a pixel as one 4-byte load and store whose fourth
    byte is rewritten by the next pixel (the last pixel of a row byte by byte, so nothing outside the row is read
    or written). ``flip`` writes output column ``o`` at ``n_out - 1 - o`` (a horizontal flip of the result, for free
    in that last transpose)."""
    n_out = out.shape[1]
    col0 = bounds[0, 0]
    n_cols = bounds[n_out - 1, 0] + bounds[n_out - 1, 1] - col0
    tile = np.zeros((n_cols, _TILE), dtype=np.uint8)  # zeros: lanes a short block leaves hold defined bytes
    res = np.empty((n_out, _TILE), dtype=np.uint8)
    acc = np.empty(LANES, dtype=np.int32)
    tile_flat, res_flat = tile.reshape(-1), res.reshape(-1)
    tb = bounds.copy()
    tb[:, 0] -= col0
    xl, ol = n_cols - 1, n_out - 1
    for rb in range(0, n_rows, HPASS_ROWS):
        k = min(HPASS_ROWS, n_rows - rb)
        for r in range(k):
            line = src[r0 + rb + r, c0 + col0:c0 + col0 + n_cols].reshape(-1)
            for x in range(xl):
                _store4(tile_flat, x * _TILE + 3 * r, _load4(line, 3 * x))
            for c in range(3):
                tile_flat[xl * _TILE + 3 * r + c] = line[3 * xl + c]
        _fir_block(tile, 0, 0, tb, weights, acc, res, 0)
        for r in range(k):
            row = out[rb + r].reshape(-1)
            if flip:  # output position p holds column ol - p; positions in increasing order (see above)
                for p in range(ol):
                    _store4(row, 3 * p, _load4(res_flat, (ol - p) * _TILE + 3 * r))
                for c in range(3):
                    row[3 * ol + c] = res_flat[3 * r + c]
            else:
                for p in range(ol):
                    _store4(row, 3 * p, _load4(res_flat, p * _TILE + 3 * r))
                for c in range(3):
                    row[3 * ol + c] = res_flat[ol * _TILE + 3 * r + c]


@njit(cache=True, nogil=True)
def copy_window(src: np.ndarray, top: int, left: int, height: int, width: int, dst: np.ndarray) -> None:
    """``dst[:height, :width] = src[top:top + height, left:left + width]`` for C-contiguous ``(H, W, 3)`` uint8
    arrays, as a loop over flat row slices indexed from 0 (the copy vectorises; numba's 3-D slice assignment, or
    computed indices, which it checks for wrap-around at every access, run 2-3× slower)."""
    n3, c3 = 3 * width, 3 * left
    src2, dst2 = src.reshape(src.shape[0], -1), dst.reshape(dst.shape[0], -1)
    for r in range(height):
        line, row = src2[top + r, c3:c3 + n3], dst2[r]
        for i in range(n3):
            row[i] = line[i]


@njit(cache=True, nogil=True)
def hflip(image: np.ndarray) -> None:
    """Mirror an ``(H, W, 3)`` uint8 image left-right in place."""
    height, width = image.shape[0], image.shape[1]
    for r in range(height):
        for j in range(width // 2):
            k = width - 1 - j
            for c in range(3):
                t = image[r, j, c]
                image[r, j, c] = image[r, k, c]
                image[r, k, c] = t


@njit(cache=True, nogil=True)
def vertical_first(height: int, width: int, out_h: int, out_w: int) -> bool:
    """Pass order: Pillow 13 resamples vertically first when the height shrinks and the width does not, and (in the
    cases measured) mostly when both shrink and the vertical-first intermediate is smaller; else horizontally first."""
    if out_h >= height:
        return False
    if out_w >= width:
        return True
    return out_h * width < height * out_w


@njit(cache=True, nogil=True)
def resample_crop(src: np.ndarray, top: int, left: int, height: int, width: int, out_h: int, out_w: int,
                  out_top: int, out_left: int, dst: np.ndarray, kind: int, flip: bool = False) -> None:
    """Write into ``dst`` ``(n_h, n_w, 3)`` uint8 the window starting at ``(out_top, out_left)`` of
    ``src[top:top+height, left:left+width]`` resized to ``(out_h, out_w)`` — the pixels of Pillow's
    ``Image.fromarray(src).crop((left, top, left+width, top+height)).resize((out_w, out_h), filter)`` followed by
    ``.crop((out_left, out_top, out_left + n_w, out_top + n_h))``, computing only that window — mirrored left-right
    when ``flip`` (Pillow's ``.transpose(FLIP_LEFT_RIGHT)`` of that window; written mirrored by the horizontal pass,
    not flipped afterwards). The filter sees only the crop (edges clamped to it), as when PIL resizes a cropped
    image. ``src`` ``(H, W, 3)`` uint8.

    Equal to Pillow 13 byte for byte except where Pillow orders the two passes differently from
    :func:`vertical_first` (some resizes that shrink both axes): then pixels differ by a few levels at most."""
    n_h, n_w = dst.shape[0], dst.shape[1]
    need_h = out_w != width
    need_v = out_h != height
    if need_h:
        hb, hk = coefficients(width, 0.0, float(width), out_w, out_left, n_w, kind)
    if need_v:
        vb, vk = coefficients(height, 0.0, float(height), out_h, out_top, n_h, kind)
    if need_h and need_v:
        if vertical_first(height, width, out_h, out_w):
            col0 = hb[0, 0]
            col1 = hb[n_w - 1, 0] + hb[n_w - 1, 1]
            tmp = np.empty((n_h, col1 - col0, 3), dtype=np.uint8)
            _vpass(src, top, left + col0, vb, vk, tmp)
            hb[:, 0] -= col0
            _hpass(tmp, 0, 0, n_h, hb, hk, dst, flip)
        else:  # the vertical pass keeps the columns where the (mirroring) horizontal pass put them
            row0 = vb[0, 0]
            row1 = vb[n_h - 1, 0] + vb[n_h - 1, 1]
            tmp = np.empty((row1 - row0, n_w, 3), dtype=np.uint8)
            _hpass(src, top + row0, left, row1 - row0, hb, hk, tmp, flip)
            vb[:, 0] -= row0
            _vpass(tmp, 0, 0, vb, vk, dst)
    elif need_h:
        _hpass(src, top + out_top, left, n_h, hb, hk, dst, flip)
    else:
        if need_v:
            _vpass(src, top, left + out_left, vb, vk, dst)
        else:
            copy_window(src, top + out_top, left + out_left, n_h, n_w, dst)
        if flip:
            hflip(dst)


@njit(cache=True, nogil=True)
def center_crop_geometry(height: int, width: int, size: int, crop_pct: float) -> tuple[int, int, int, int]:
    """timm's eval geometry (``Resize(floor(size / crop_pct))`` on the shorter side, then ``CenterCrop(size)``) for
    a ``height × width`` image: ``(resized_h, resized_w, crop_top, crop_left)`` as torchvision computes them
    (``int(short_target * long / short)`` for the long side; ``int(round((resized - size) / 2))``, half to even)."""
    target = int(math.floor(size / crop_pct + 1e-9))
    if width <= height:
        new_w, new_h = target, int(target * height / width)
    else:
        new_h, new_w = target, int(target * width / height)
    return new_h, new_w, _round_half_even_half(new_h - size), _round_half_even_half(new_w - size)


@njit(cache=True, nogil=True)
def _round_half_even_half(d: int) -> int:
    """Python's ``int(round(d / 2.0))`` for an integer ``d``."""
    if d % 2 == 0:
        return d // 2
    k = (d - 1) // 2  # d / 2 = k + 0.5
    return k if k % 2 == 0 else k + 1


@njit(cache=True, nogil=True)
def resize_short_crop_center(src: np.ndarray, height: int, width: int, crop_pct: float, dst: np.ndarray,
                             kind: int) -> None:
    """timm's eval transform of ``src[:height, :width]`` into the square ``dst`` ``(S, S, 3)``: the shorter side
    resized to ``floor(S / crop_pct)``, then the centre ``S × S`` (only that window is computed)."""
    size = dst.shape[0]
    new_h, new_w, top, left = center_crop_geometry(height, width, size, crop_pct)
    if new_h < size or new_w < size:  # torchvision pads such crops; timm's crop_pct <= 1 never gets here
        raise ValueError("centre crop larger than the resized image")
    resample_crop(src, 0, 0, height, width, new_h, new_w, top, left, dst, kind)


# ------------------------------------------------------------------------------------------------ counter-based draws
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True)
def _mix(z: np.uint64) -> np.uint64:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def sample_key(seed: int, epoch: int, rank: int, index: int, occurrence: int) -> np.uint64:
    """A 64-bit key for one sample's draws in one epoch: a hash chain over the five integers."""
    h = _mix(np.uint64(seed) + _GOLDEN)
    h = _mix(h ^ (np.uint64(epoch) + _GOLDEN))
    h = _mix(h ^ (np.uint64(rank) + _M1))
    h = _mix(h ^ (np.uint64(index) + _M2))
    return _mix(h ^ (np.uint64(occurrence) + _GOLDEN))


@njit(cache=True, nogil=True)
def uniform(key: np.uint64, draw: int) -> float:
    """The ``draw``-th uniform float in ``[0, 1)`` of ``key`` (53 random bits)."""
    z = _mix(key + np.uint64(draw + 1) * _GOLDEN)
    return float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def draw_uniform(seed: int, epoch: int, rank: int, index: int, occurrence: int, draw: int) -> float:
    """:func:`uniform` of :func:`sample_key` (compiled; for tests and Python callers)."""
    return uniform(sample_key(seed, epoch, rank, index, occurrence), draw)


@njit(cache=True, nogil=True)
def random_resized_crop(height: int, width: int, scale0: float, scale1: float, log_ratio0: float, log_ratio1: float,
                        key: np.uint64) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (10 tries, then the centre fallback) with the uniforms of
    ``key`` (draws 0–19 for the tries, 20–21 for the position): ``(top, left, crop_h, crop_w)``."""
    area = height * width
    for attempt in range(10):
        target_area = area * (scale0 + (scale1 - scale0) * uniform(key, 2 * attempt))
        aspect = math.exp(log_ratio0 + (log_ratio1 - log_ratio0) * uniform(key, 2 * attempt + 1))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = min(int(uniform(key, 20) * (height - h + 1)), height - h)
            j = min(int(uniform(key, 21) * (width - w + 1)), width - w)
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < math.exp(log_ratio0):
        w = width
        h = int(round(w / math.exp(log_ratio0)))
    elif in_ratio > math.exp(log_ratio1):
        h = height
        w = int(round(h * math.exp(log_ratio1)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


@njit(cache=True, nogil=True)
def train_crop(src: np.ndarray, seed: int, epoch: int, rank: int, index: int, occurrence: int, scale0: float,
               scale1: float, log_ratio0: float, log_ratio1: float, flip_prob: float, kind: int,
               dst: np.ndarray) -> None:
    """The FFCV training decoder's augmentation of one decoded image ``src`` ``(H, W, 3)`` uint8 into ``dst``
    ``(S, S, 3)`` uint8, for the litdata backend's workers: the key :func:`sample_key` ``(seed, epoch, rank, index,
    occurrence)``, torchvision's ``RandomResizedCrop`` geometry from it (:func:`random_resized_crop`), a
    horizontal flip when ``uniform(key, 22) < flip_prob``, the crop box resampled (:func:`resample_crop`) — the
    draws and pixels of :func:`impulsevit.data.loading.ffcv_decoder.resample_decoder` for the same arguments."""
    key = sample_key(seed, epoch, rank, index, occurrence)
    i, j, h, w = random_resized_crop(src.shape[0], src.shape[1], scale0, scale1, log_ratio0, log_ratio1, key)
    flip = flip_prob > 0 and uniform(key, 22) < flip_prob
    resample_crop(src, i, j, h, w, dst.shape[0], dst.shape[1], 0, 0, dst, kind, flip)


_pack_box = njit(cache=True, nogil=True)(pack_box)


@njit(cache=True, nogil=True)
def train_canvas(src: np.ndarray, seed: int, epoch: int, rank: int, index: int, occurrence: int, scale0: float,
                 scale1: float, log_ratio0: float, log_ratio1: float, flip_prob: float, dst: np.ndarray) -> None:
    """:func:`train_crop`'s draws for the same arguments, the crop box copied unresampled to the top-left of ``dst``
    ``(K + 1, K, 3)`` uint8 and the box and flip packed into its row ``K``
    (:func:`impulsevit.data.loading.device_resample.pack_box`): the canvas of ``data.resample_on: device``, which
    :func:`~impulsevit.data.loading.device_resample.resample_canvas` turns into :func:`train_crop`'s pixels. ``K``
    must hold the box (:func:`~impulsevit.data.loading.device_resample.canvas_side` of the stored sizes)."""
    key = sample_key(seed, epoch, rank, index, occurrence)
    i, j, h, w = random_resized_crop(src.shape[0], src.shape[1], scale0, scale1, log_ratio0, log_ratio1, key)
    flip = flip_prob > 0 and uniform(key, 22) < flip_prob
    copy_window(src, i, j, h, w, dst)
    _pack_box(dst[dst.shape[1]].reshape(-1), h, w, flip)
