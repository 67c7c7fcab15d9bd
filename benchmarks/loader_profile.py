"""Where the FFCV ``short256`` training decoder spends its time at 224 px, stage by stage, on one core.

Generates JPEGs as ``benchmarks/loader_speed.py`` does, converts them with the ``short256`` preset (half the stored
images JPEG, half raw), reads the stored bytes back from the ``.beton`` and times, single-threaded and compiled as the
decoder runs them, each stage of :func:`~.ffcv_decoder.resample_decoder`'s training path over every
stored image:

- ``decode jpg`` / ``read raw``: FFCV's libjpeg-turbo ``imdecode`` of the JPEG samples into a scratch buffer; a copy of
  the raw samples' bytes (what a raw sample costs at least: its pixels are read once);
- ``decode (PIL)`` / ``decode (cv2)``: the same JPEGs decoded by Pillow and OpenCV from Python, for comparison;
- ``crop box + RNG``: the per-sample key hash and torchvision's ``RandomResizedCrop`` box (and the flip draw);
- ``resample``: PIL's bicubic resize of the drawn box to 224 × 224 (:func:`~.resample.resample_crop`),
  with the flip written by its horizontal pass for the samples whose draw says so; each pass also timed alone, and
  the filter coefficients of both axes alone;
- ``eval``: the eval transform (:func:`~.resample.resize_short_crop_center`, crop_pct 0.875) of every stored image
  (not part of the training path; for ``short256`` images at 224 px the resize keeps the size, so it is the crop);
- ``flip as a separate pass``: an in-place flip of the 224 × 224 output (what the flip cost before it was folded into
  the resample), for reference;
- ``copy into batch``: a plain copy of a 224 × 224 × 3 image (the decoder writes straight into the batch slot, so it
  does not pay this; shown as the price of one memory pass).

Each stage is the median CPU time of ``--repeats`` passes over all samples, reported in µs per image (per sample of
its kind for the decodes) and as images/s on one core. The last line is ``ratio: X`` = (decode of the stored images)
/ (whole decoder path) per image: the share of the decoder's time the unavoidable decode takes.

    python benchmarks/loader_profile.py [--num-images 300] [--repeats 5] [--size 224] [--smoke]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loader_speed import make_jpegs  # noqa: E402

from impulsevit.data.loading import resample as rs  # noqa: E402
from impulsevit.data.sources.image_source import image_folder_source  # noqa: E402
from impulsevit.data.storage.convert import convert_split  # noqa: E402
from impulsevit.data.storage.presets import PRESETS  # noqa: E402


def stored_samples(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ``.beton``'s images as FFCV's OS-cache reader sees them: ``(data, starts, sizes, heights, widths, is_jpg)``
    — the file's bytes and, per sample, where its image bytes start, how many, its stored height and width, and
    whether it is a JPEG."""
    from ffcv.fields.rgb_image import IMAGE_MODES
    from ffcv.reader import Reader

    reader = Reader(str(path))
    image = reader.metadata["f0"]  # field 0: the image (convert writes it first)
    ptrs, sizes = reader.alloc_table["ptr"], reader.alloc_table["size"]
    order = np.argsort(ptrs)
    ptrs, sizes = ptrs[order], sizes[order]
    starts = image["data_ptr"].astype(np.int64)
    lens = sizes[np.searchsorted(ptrs, starts)].astype(np.int64)
    data = np.fromfile(path, dtype=np.uint8)
    return (data, starts, lens, image["height"].astype(np.int64), image["width"].astype(np.int64),
            image["mode"] == IMAGE_MODES["jpg"])


def compiled_stages(kind: int, size: int) -> dict[str, Callable]:
    """The decoder's stages as compiled loops over samples ``idx`` (each returns a checksum so nothing is skipped)."""
    from ffcv.libffcv import imdecode, memcpy

    imdecode_c = njit(nogil=True)(imdecode)
    memcpy_c = njit(nogil=True)(memcpy)
    flip = rs.hflip
    key_of, rrc, uniform, resample_crop = rs.sample_key, rs.random_resized_crop, rs.uniform, rs.resample_crop
    center = rs.resize_short_crop_center
    s0, s1, lr0, lr1 = 0.08, 1.0, float(np.log(3 / 4)), float(np.log(4 / 3))

    @njit(nogil=True)
    def decode(data, starts, lens, hs, ws, jpg, idx, out):  # noqa: ANN001, ANN202 - into out[k]
        total = 0
        for k in range(len(idx)):
            i = idx[k]
            src = data[starts[i]:starts[i] + lens[i]]
            h, w = hs[i], ws[i]
            if jpg[i]:
                imdecode_c(src, out[k], np.uint32(h), np.uint32(w), np.uint32(h), np.uint32(w), 0, 0, 1, 1,
                           False, False)
            else:
                memcpy_c(src, out[k])
            total += out[k].reshape(-1)[0]
        return total

    @njit(nogil=True)
    def boxes(hs, ws, idx, epoch, out):  # noqa: ANN001, ANN202 - out[k] = (top, left, h, w, flip)
        for k in range(len(idx)):
            i = idx[k]
            key = key_of(0, epoch, 0, np.int64(i), np.int64(0))
            t, left, h, w = rrc(hs[i], ws[i], s0, s1, lr0, lr1, key)
            out[k, 0], out[k, 1], out[k, 2], out[k, 3] = t, left, h, w
            out[k, 4] = 1 if uniform(key, 22) < 0.5 else 0
        return out[0, 0]

    @njit(nogil=True)
    def resample(decoded, hs, ws, idx, box, dst):  # noqa: ANN001, ANN202
        total = 0
        for k in range(len(idx)):
            i = idx[k]
            image = decoded[k].reshape(-1)[:3 * hs[i] * ws[i]].reshape(hs[i], ws[i], 3)
            resample_crop(image, box[k, 0], box[k, 1], box[k, 2], box[k, 3], size, size, 0, 0, dst, kind,
                          box[k, 4] == 1)
            total += dst[0, 0, 0]
        return total

    @njit(nogil=True)
    def coefficients(hs, ws, idx, box):  # noqa: ANN001, ANN202
        """The filter coefficients of both axes alone (what :func:`~.resample.resample_crop` computes first)."""
        total = 0
        for k in range(len(idx)):
            h, w = box[k, 2], box[k, 3]
            hb, hk = rs.coefficients(w, 0.0, float(w), size, 0, size, kind)
            vb, vk = rs.coefficients(h, 0.0, float(h), size, 0, size, kind)
            total += hb[0, 1] + vb[0, 1] + hk[0, 0] + vk[0, 0]
        return total

    @njit(nogil=True)
    def evaluate(decoded, hs, ws, idx, dst):  # noqa: ANN001, ANN202
        total = 0
        for k in range(len(idx)):
            i = idx[k]
            image = decoded[k].reshape(-1)[:3 * hs[i] * ws[i]].reshape(hs[i], ws[i], 3)
            center(image, hs[i], ws[i], 0.875, dst, kind)
            total += dst[0, 0, 0]
        return total

    @njit(nogil=True)
    def passes(decoded, hs, ws, idx, box, which):  # noqa: ANN001, ANN202 - 0: horizontal alone, 1: vertical alone
        """One pass of each resample alone, on the box's full extent (the other axis left at its crop size)."""
        total = 0
        for k in range(len(idx)):
            i = idx[k]
            image = decoded[k].reshape(-1)[:3 * hs[i] * ws[i]].reshape(hs[i], ws[i], 3)
            t, left, h, w = box[k, 0], box[k, 1], box[k, 2], box[k, 3]
            if which == 0:
                b, c = rs.coefficients(w, 0.0, float(w), size, 0, size, kind)
                out = np.empty((h, size, 3), dtype=np.uint8)
                rs._hpass(image, t, left, h, b, c, out)
            else:
                b, c = rs.coefficients(h, 0.0, float(h), size, 0, size, kind)
                out = np.empty((size, w, 3), dtype=np.uint8)
                rs._vpass(image, t, left, b, c, out)
            total += out[0, 0, 0]
        return total

    @njit(nogil=True)
    def flips(n, dst):  # noqa: ANN001, ANN202
        for _ in range(n):
            flip(dst)
        return dst[0, 0, 0]

    @njit(nogil=True)
    def copies(n, src, dst):  # noqa: ANN001, ANN202
        for _ in range(n):
            memcpy_c(src, dst)
        return dst[0, 0, 0]

    return {"decode": decode, "boxes": boxes, "resample": resample, "passes": passes, "coefficients": coefficients,
            "evaluate": evaluate,
            "flips": flips, "copies": copies}


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU seconds of this process over ``repeats`` calls (after one warm-up call): CPU time, not wall time,
    so that other jobs on a shared machine inflate it less (every stage runs on this one thread)."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-images", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = p.parse_args(argv)
    if args.smoke:  # 20 images to 32 px, one pass per stage (every stage is still compiled and run)
        args.num_images, args.repeats, args.size = 20, 1, 32
    size, kind = args.size, rs.BICUBIC
    with tempfile.TemporaryDirectory(prefix="loader-profile-") as tmp:
        tmp = Path(tmp)
        make_jpegs(tmp / "jpegs", args.num_images)
        convert_split(image_folder_source(tmp / "jpegs"), tmp / "s.beton", PRESETS["short256"], workers=2,
                      progress=False, log=lambda _: None)
        data, starts, lens, hs, ws, jpg = stored_samples(tmp / "s.beton")
    n = len(starts)
    idx_all = np.arange(n, dtype=np.int64)
    idx_jpg, idx_raw = idx_all[jpg], idx_all[~jpg]
    cap = int((hs * ws).max()) * 3
    scratch = np.zeros((n, cap), dtype=np.uint8)
    st = compiled_stages(kind, size)
    box = np.zeros((n, 5), dtype=np.int64)
    dst = np.zeros((size, size, 3), dtype=np.uint8)
    st["decode"](data, starts, lens, hs, ws, jpg, idx_all, scratch)  # every sample decoded once, for the later stages
    st["boxes"](hs, ws, idx_all, 0, box)
    print(f"{n} stored images ({len(idx_jpg)} JPEG, {len(idx_raw)} raw), median {int(np.median(ws))} × "
          f"{int(np.median(hs))} px; one core; median of {args.repeats} passes; output {size} × {size}")
    mean_crop = float(np.mean(box[:, 2] * box[:, 3] / (hs * ws)))
    print(f"crop boxes: mean area {mean_crop:.2f} of the stored image, "
          f"{float(np.mean((box[:, 2] < size) | (box[:, 3] < size))):.2f} of them enlarged along some axis")

    rows: list[tuple[str, float]] = []

    def row(name: str, seconds: float, count: int) -> float:
        us = seconds / count * 1e6
        rows.append((name, us))
        print(f"{name:<34} {us:>9.1f} µs/img {1e6 / us:>9.0f} img/s")
        return us

    print(f"\n{'stage':<34} {'cost':>16} {'one core':>15}")
    jpg_us = row("decode jpg (FFCV imdecode)", timed(
        lambda: st["decode"](data, starts, lens, hs, ws, jpg, idx_jpg, scratch), args.repeats), len(idx_jpg))
    raw_us = row("read raw (copy of its bytes)", timed(
        lambda: st["decode"](data, starts, lens, hs, ws, jpg, idx_raw, scratch), args.repeats), len(idx_raw))
    from PIL import Image

    blobs = [data[starts[i]:starts[i] + lens[i]].tobytes() for i in idx_jpg]
    row("decode jpg (PIL, from Python)", timed(
        lambda: [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs], args.repeats), len(blobs))
    try:
        import cv2

        cv2.setNumThreads(1)
        arrays = [np.frombuffer(b, dtype=np.uint8) for b in blobs]
        row("decode jpg (cv2.imdecode, BGR)", timed(
            lambda: [cv2.imdecode(a, cv2.IMREAD_COLOR) for a in arrays], args.repeats), len(arrays))
    except ImportError:
        print("decode jpg (cv2): OpenCV not installed")
    box_us = row("crop box + RNG (key, RRC, flip draw)", timed(
        lambda: st["boxes"](hs, ws, idx_all, 1, box), args.repeats), n)
    st["boxes"](hs, ws, idx_all, 0, box)
    res_us = row("resample (+ flip as drawn)", timed(
        lambda: st["resample"](scratch, hs, ws, idx_all, box, dst), args.repeats), n)
    row("  horizontal pass alone (full box)", timed(
        lambda: st["passes"](scratch, hs, ws, idx_all, box, 0), args.repeats), n)
    row("  vertical pass alone (full box)", timed(
        lambda: st["passes"](scratch, hs, ws, idx_all, box, 1), args.repeats), n)
    row("  filter coefficients (both axes)", timed(
        lambda: st["coefficients"](hs, ws, idx_all, box), args.repeats), n)
    row(f"eval: short side {round(size / 0.875)}, centre {size}", timed(
        lambda: st["evaluate"](scratch, hs, ws, idx_all, dst), args.repeats), n)
    row("flip as a separate pass (ref.)", timed(lambda: st["flips"](n, dst), args.repeats), n)
    src = np.ascontiguousarray(dst[::-1])
    row(f"copy {size}² × 3 into batch (ref.)", timed(lambda: st["copies"](n, src, dst), args.repeats), n)
    decode_us = (jpg_us * len(idx_jpg) + raw_us * len(idx_raw)) / n
    path_us = decode_us + box_us + res_us
    print(f"\nper stored image: decode {decode_us:.0f} µs (mix of {len(idx_jpg)} JPEG / {len(idx_raw)} raw), "
          f"decoder path {path_us:.0f} µs = decode + crop box {box_us:.1f} + resample and flip {res_us:.0f}; "
          f"on one core the decode limit is {1e6 / decode_us:.0f} img/s, the decoder path {1e6 / path_us:.0f} img/s")
    ratio = decode_us / path_us
    print(f"ratio: {ratio:.2f}")
    return ratio


if __name__ == "__main__":
    main()
