"""PIL's resize of each sample's crop box, batched in torch on the training device: the same pixels as the FFCV
workers' :func:`impulsevit.data.loading.resample.resample_crop`, byte for byte.

Input (``data.resample_on: device``, see :func:`impulsevit.data.loading.ffcv_loader.build_ffcv_loader`): a *canvas
batch*, uint8 ``(B, 3, K + 1, K)`` (a channels-last view, as FFCV's ``ToTorchImage`` yields it): sample ``b``'s crop box
of ``h × w`` pixels sits at the top-left of the square ``K × K`` canvas (the rest is stale memory, never read), and
the first 6 bytes of the extra row ``K`` (pixels 0 and 1, channels in memory order) hold the box and the flip as
:func:`pack_box` writes them: ``h >> 8, h & 255, w >> 8, w & 255, flip, 0``. ``K`` is :func:`canvas_side` of the
stored image sizes.

Arithmetic (Pillow's ``Resample.c``, as :mod:`impulsevit.data.loading.resample`): per sample and axis the filter
coefficients are computed on the device in float64 with the operations of
:func:`~impulsevit.data.loading.resample.coefficients` in the same order (the tap sum sequential, not a reduction),
rounded to 22-bit fixed point; each pass is an int32 gather-multiply-add over ``taps`` (zero weights past a line's
own taps, indices clamped inside the box) rounded by ``+ 2^21 >> 22`` and clipped to 0..255. The pass order follows
:func:`~impulsevit.data.loading.resample.vertical_first`: a vertical-first resize of ``X`` equals the transpose of
a horizontal-first resize of ``X^T`` with the two axes' coefficients swapped, so the vertical-first samples are
transposed with ``torch.where`` (the canvas is square), every sample runs one horizontal-then-vertical path, and those
samples are transposed back; the flip comes last (the vertical pass does not mix columns, so this equals the worker's
flip in the horizontal pass). A pass whose line length equals the output size has one unit tap per pixel, so running
it is the identity the worker path gets by skipping it.

Sync-free: no data-dependent shapes, no scalar reads, no host tensors; the tap count comes from ``K`` and ``S`` (the
shapes). Costs: each pass gathers whole lines (``index_select`` of contiguous uint8 rows) and multiply-adds them in
int32; the horizontal pass runs on all ``K`` canvas rows (those under the box are discarded), so a batch costs
``taps × B × S × 3 × (K + S)`` multiply-adds, ``taps`` = :func:`taps_for` ``(K, S)`` (9 for bicubic at K = 344,
S = 224). Filters: ``bicubic`` and ``bilinear`` only.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from impulsevit.data.loading.filters import BICUBIC, FILTERS, PRECISION_BITS, SUPPORT

__all__ = ["canvas_side", "coefficients", "pack_box", "resample_boxes", "resample_canvas", "unpack_canvas"]


def pack_box(row: np.ndarray, height: int, width: int, flip: bool) -> None:
    """Write the box ``height × width`` (each < 65536) and the flip into the first 6 bytes of ``row`` (the flat
    extra canvas row, uint8). Plain indexing, so numba compiles it for FFCV's decoder."""
    row[0] = height >> 8
    row[1] = height & 255
    row[2] = width >> 8
    row[3] = width & 255
    row[4] = 1 if flip else 0
    row[5] = 0


def unpack_canvas(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A canvas batch uint8 ``(B, 3, K + 1, K)`` → ``(canvas (B, 3, K, K) view, height (B,) int64, width (B,) int64,
    flip (B,) bool)``, all on the batch's device (no host read)."""
    if batch.dim() != 4 or batch.shape[1] != 3 or batch.shape[2] != batch.shape[3] + 1 or batch.dtype != torch.uint8:
        raise ValueError(f"expected a uint8 canvas batch (B, 3, K + 1, K), got {tuple(batch.shape)} {batch.dtype}")
    k = batch.shape[3]
    meta = batch[:, :, k, :2].permute(0, 2, 1).reshape(-1, 6).long()  # bytes in memory order (pixel, channel)
    return batch[:, :, :k], meta[:, 0] * 256 + meta[:, 1], meta[:, 2] * 256 + meta[:, 3], meta[:, 4] != 0


def canvas_side(heights: np.ndarray, widths: np.ndarray, ratio: tuple[float, float]) -> int:
    """The side ``K`` of a square canvas that holds every crop box torchvision's ``RandomResizedCrop(ratio=ratio)``
    (any ``scale`` in ``(0, 1]``) can draw on images of these stored sizes, fallback included.

    A box is at most the image (``w <= W``, ``h <= H``); a drawn box has ``w = round(sqrt(A a))``, ``h = round(sqrt(A
    / a))`` with ``a <= ratio[1]``, so ``w <= ratio[1] (h + 0.5) + 0.5 <= ratio[1] (H + 1) + 1`` (the fallback's
    ``round(H ratio[1])`` too), and likewise ``h <= (W + 1) / ratio[0] + 1``. Both get one more pixel of slack for
    the float ``exp(log(r))`` of the draw."""
    h = np.asarray(heights, dtype=np.float64)
    w = np.asarray(widths, dtype=np.float64)
    box_w = np.minimum(w, np.ceil(ratio[1] * (h + 1)) + 1)
    box_h = np.minimum(h, np.ceil((w + 1) / ratio[0]) + 1)
    return max(1, int(np.max(np.maximum(box_w, box_h))))


def taps_for(max_in: int, out_size: int, kind: int) -> int:
    """Taps per output pixel that cover every line of ``1 .. max_in`` pixels resized to ``out_size`` (Pillow's
    ``ksize`` for the longest line)."""
    scale = max_in / out_size
    return int(math.ceil(SUPPORT[kind] * (scale if scale > 1.0 else 1.0))) * 2 + 1


def _filter(kind: int, x: torch.Tensor) -> torch.Tensor:
    """Pillow's filter at ``x`` (float64), the operations of ``resample._filter`` in its order."""
    x = x.abs()
    if kind == BICUBIC:  # a = -0.5: (a + 2) = 1.5, (a + 3) = 2.5, both exact
        near = (1.5 * x - 2.5) * x * x + 1.0
        far = (((x - 5.0) * x + 8.0) * x - 4.0) * -0.5
        return torch.where(x < 1.0, near, torch.where(x < 2.0, far, 0.0))
    return torch.where(x < 1.0, 1.0 - x, 0.0)


def coefficients(in_size: torch.Tensor, out_size: int, kind: int, taps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pillow's coefficients for resizing lines of ``in_size`` (N,) int64 pixels each to ``out_size``, on
    ``in_size``'s device: ``(first (N, out_size) int64, weights (N, out_size, taps) int32)`` — the first source pixel
    and the 22-bit fixed-point weights of each output pixel, zero past the pixel's own tap count. Equal to
    :func:`impulsevit.data.loading.resample.coefficients` (``in0 = 0``, ``in1 = in_size``, the whole output) padded
    with zero weights to ``taps`` (which must be at least :func:`taps_for` of the longest line)."""
    f64 = torch.float64
    size = in_size.to(f64)[:, None]
    scale = size / float(out_size)
    filterscale = torch.clamp(scale, min=1.0)
    support = SUPPORT[kind] * filterscale
    ss = 1.0 / filterscale
    center = (torch.arange(out_size, device=in_size.device, dtype=f64)[None] + 0.5) * scale
    first = torch.trunc(center - support + 0.5).clamp(min=0.0)
    count = torch.minimum(torch.trunc(center + support + 0.5), size) - first
    t = torch.arange(taps, device=in_size.device, dtype=f64)
    k = torch.where(t < count[..., None], _filter(kind, ((first[..., None] + t) - center[..., None] + 0.5)
                                                  * ss[..., None]), 0.0)  # (N, S, taps), elementwise as Pillow
    total = torch.zeros_like(center)
    for i in range(taps):  # the sum in tap order, as Pillow adds them (not a tree reduction)
        total = total + k[..., i]
    w = torch.where(total[..., None] != 0.0, k / total[..., None], k)
    one = float(1 << PRECISION_BITS)
    fixed = torch.where(w < 0, torch.trunc(w * one - 0.5), torch.trunc(w * one + 0.5))
    return first.long(), fixed.to(torch.int32)


def _lines(src: torch.Tensor, first: torch.Tensor, weights: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """One separable pass over whole lines: ``src`` uint8 ``(B, N, L)`` holds ``N`` lines of ``L`` values per sample;
    output line ``o`` of sample ``b`` is ``clip8(Σ_t src[b, first[b, o] + t] · weights[b, o, t])`` in int32 with
    Pillow's rounding, uint8 ``(B, S, L)``. Line indices are clamped to the sample's ``length`` lines (their weights
    are zero); each tap gathers ``B × S`` contiguous lines (``index_select``), as the worker passes run on rows."""
    batch, n, width = src.shape
    n_out, taps = weights.shape[1], weights.shape[2]
    flat = src.reshape(batch * n, width)
    base = (torch.arange(batch, device=src.device) * n)[:, None]
    last = (length - 1)[:, None]
    acc = torch.full((batch * n_out, width), 1 << (PRECISION_BITS - 1), dtype=torch.int32, device=src.device)
    for t in range(taps):
        rows = torch.index_select(flat, 0, (base + torch.minimum(first + t, last)).reshape(-1))
        acc.addcmul_(rows, weights[:, :, t].reshape(-1, 1))  # uint8 · int32, summed in int32 (one kernel)
    return torch.clamp(acc >> PRECISION_BITS, 0, 255).to(torch.uint8).view(batch, n_out, width)


def resample_boxes(canvas: torch.Tensor, height: torch.Tensor, width: torch.Tensor, flip: torch.Tensor, size: int,
                   interpolation: str) -> torch.Tensor:
    """Resize each sample's top-left ``height[b] × width[b]`` box of ``canvas`` uint8 ``(B, 3, K, K)`` to ``size ×
    size`` with PIL's ``interpolation`` filter (``bicubic`` | ``bilinear``) and mirror it left-right where ``flip[b]``:
    uint8 ``(B, 3, S, S)`` (a channels-last view, the layout FFCV's ``ToTorchImage`` yields), equal byte for byte to
    ``resample_crop(image, top, left, h, w, S, S, 0, 0, out, kind, flip)`` on each box. ``height``, ``width``
    (B,) int64 in ``1 .. K``, ``flip`` (B,) bool, on the canvas's device."""
    if interpolation not in FILTERS:
        raise ValueError(f"interpolation {interpolation!r} is not supported; use one of {sorted(FILTERS)}")
    if canvas.dim() != 4 or canvas.shape[1] != 3 or canvas.shape[2] != canvas.shape[3]:
        raise ValueError(f"expected a square canvas batch (B, 3, K, K), got {tuple(canvas.shape)}")
    kind, batch, k = FILTERS[interpolation], canvas.shape[0], canvas.shape[3]
    taps = taps_for(k, size, kind)
    x = canvas.permute(0, 2, 3, 1)  # (B, K, K, 3), the memory order of a channels-last batch
    vertical = (size < height) & ((size >= width) | (width < height))  # resample.vertical_first(h, w, S, S)
    # Every sample runs horizontal-then-vertical on Y (Y = X^T for the vertical-first ones). The horizontal pass
    # works on Y's columns as lines: Y^T, which is X for the vertical-first samples and X^T for the others.
    across = torch.where(vertical, height, width)  # Y's line length along its columns
    down = torch.where(vertical, width, height)
    columns = torch.where(vertical[:, None, None, None], x, x.transpose(1, 2)).reshape(batch, k, k * 3)
    mid = _lines(columns, *coefficients(across, size, kind, taps), across)  # (B, S, K·3): Y's resampled columns
    rows = mid.view(batch, size, k, 3).transpose(1, 2).reshape(batch, k, size * 3)
    out = _lines(rows, *coefficients(down, size, kind, taps), down).view(batch, size, size, 3)
    out = torch.where(vertical[:, None, None, None], out.transpose(1, 2), out)
    out = torch.where(flip[:, None, None, None], out.flip(2), out)
    return out.contiguous().permute(0, 3, 1, 2)


def resample_canvas(batch: torch.Tensor, size: int, interpolation: str) -> torch.Tensor:
    """:func:`resample_boxes` of a canvas batch uint8 ``(B, 3, K + 1, K)`` (see the module docstring) → uint8
    ``(B, 3, S, S)``."""
    canvas, height, width, flip = unpack_canvas(batch)
    return resample_boxes(canvas, height, width, flip, size, interpolation)
