"""Device resample cost (``data.resample_on=device``): µs per image of
:func:`impulsevit.data.loading.device_resample.resample_canvas` on a canvas batch, against the workers' resample
(numba :func:`impulsevit.data.loading.resample.resample_crop`, one core) of the same boxes.

Boxes: torchvision's RandomResizedCrop draws (scale 0.08–1, ratio 3/4–4/3, the counter-based draws of the FFCV
decoder) on random images of ``short256``-stored sizes (shorter side 256, longer 256–427); canvas side ``K`` from
:func:`~impulsevit.data.loading.device_resample.canvas_side` of those sizes; flip probability 0.5. The canvas batch is
built on the device once; each round times one ``resample_canvas`` call (CUDA: synchronised before and after), the
median over rounds is reported per image. The numba column times ``resample_crop`` of every box from its source
image, one call per image from Python (the decoder calls it from compiled code; the call overhead is ~1 µs).
Also checks that both give the same bytes.

    python benchmarks/device_resample_speed.py [--device cuda] [--sizes 224 64] [--batch-size 128] [--rounds 5]
                                                [--threads 1] [--smoke]

``--threads``: torch's intra-op threads for a CPU device (1: per core, as the numba column). Rows: ``size batch
device_µs numba_µs ratio``; the last line is ``ratio: X`` = numba µs / device µs per image at the first size (> 1:
the device resample costs the device less time per image than the resample costs a worker core).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from impulsevit.data.loading import resample as rs
from impulsevit.data.loading.device_resample import canvas_side, pack_box, resample_canvas

RATIO = (3 / 4, 4 / 3)


def boxes(batch: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """``batch`` random short256-sized images and their ``(top, left, h, w, flip)`` draws."""
    rng = np.random.default_rng(seed)
    images, draws = [], []
    lr0, lr1 = float(np.log(RATIO[0])), float(np.log(RATIO[1]))
    for i in range(batch):
        long = int(rng.integers(256, 428))
        h, w = (256, long) if i % 2 else (long, 256)
        images.append(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        key = np.uint64(rs.sample_key(seed, 0, 0, i, 0))
        top, left, bh, bw = rs.random_resized_crop(h, w, 0.08, 1.0, lr0, lr1, key)
        draws.append((top, left, bh, bw, int(rs.uniform(key, 22) < 0.5)))
    return images, np.asarray(draws, dtype=np.int64)


def canvas_batch(images: list[np.ndarray], draws: np.ndarray) -> np.ndarray:
    """The FFCV canvas decoder's output for these draws: ``(B, K + 1, K, 3)`` uint8."""
    side = canvas_side(np.array([im.shape[0] for im in images]), np.array([im.shape[1] for im in images]), RATIO)
    out = np.zeros((len(images), side + 1, side, 3), dtype=np.uint8)
    for b, (im, (top, left, h, w, flip)) in enumerate(zip(images, draws)):
        out[b, :h, :w] = im[top:top + h, left:left + w]
        pack_box(out[b, side].reshape(-1), int(h), int(w), bool(flip))
    return out


def time_device(batch: torch.Tensor, size: int, rounds: int) -> tuple[float, torch.Tensor]:
    """Median seconds of one ``resample_canvas`` call (after one warm-up call) and its output."""
    cuda = batch.device.type == "cuda"
    out = resample_canvas(batch, size, "bicubic")
    times = []
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = resample_canvas(batch, size, "bicubic")
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def time_numba(images: list[np.ndarray], draws: np.ndarray, size: int, rounds: int) -> tuple[float, np.ndarray]:
    """Median seconds of ``resample_crop`` over all boxes (after one warm-up pass) and its output."""
    out = np.zeros((len(images), size, size, 3), dtype=np.uint8)
    times = []
    for r in range(rounds + 1):
        t = time.perf_counter()
        for b, (im, (top, left, h, w, flip)) in enumerate(zip(images, draws)):
            rs.resample_crop(im, top, left, h, w, size, size, 0, 0, out[b], rs.BICUBIC, bool(flip))
        if r:
            times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 64])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads on a CPU device")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = p.parse_args(argv)
    if args.smoke:  # 4 boxes to 32 px, one round (the bytes are still checked equal)
        args.sizes, args.batch_size, args.rounds = [32], 4, 1
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    images, draws = boxes(args.batch_size)
    host = canvas_batch(images, draws)
    batch = torch.from_numpy(host).to(device).permute(0, 3, 1, 2)  # as FFCV's ToTorchImage (after ToDevice)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} thread(s)"
    print(f"device {name}; canvas K = {host.shape[2]}, batch {args.batch_size}, bicubic, median of {args.rounds}")
    print(f"{'size':>5} {'batch':>6} {'device_us':>10} {'numba_us':>9} {'ratio':>6}")
    ratios = []
    for size in args.sizes:
        dev_s, dev_out = time_device(batch, size, args.rounds)
        cpu_s, cpu_out = time_numba(images, draws, size, args.rounds)
        if not np.array_equal(dev_out.permute(0, 2, 3, 1).cpu().numpy(), cpu_out):
            raise SystemExit(f"device resample differs from resample_crop at {size} px")
        dev_us, cpu_us = dev_s / args.batch_size * 1e6, cpu_s / args.batch_size * 1e6
        ratios.append(cpu_us / dev_us)
        print(f"{size:>5} {args.batch_size:>6} {dev_us:>10.1f} {cpu_us:>9.1f} {ratios[-1]:>6.3g}")
    print(f"ratio: {ratios[0]:.3g}")
    return ratios[0]


if __name__ == "__main__":
    main()
