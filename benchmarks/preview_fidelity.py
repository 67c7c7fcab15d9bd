"""Pixel fidelity of a recipe's evaluation pipeline: ``impulsevit data preview --split val`` vs timm's reference.

For each photo given (default: the three photos that ship with matplotlib / scikit-learn), three crops (full, left
60 %, top 60 %) go into an ImageFolder twice: at full size (``deit_base_in1k``'s data settings) and downscaled to
32 px (``vit_tiny_cifar10``'s). ``impulsevit data preview`` writes what the model sees on the recipe's default
backend and on the streaming backend (``litdata``, a shard set ``impulsevit convert --format litdata`` wrote from the
same tree); each image is compared with ``timm.data.create_transform(224, is_training=False, interpolation="bicubic",
crop_pct=0.875)`` on the same file (PSNR in dB on the 0–1 scale). For the full-size set it also reports whether the
stored short side × crop_pct reaches 224 for every source of short side >= 256 (the eval crop is never upsampled).
The last line is ``ratio: X`` = the lowest PSNR of any image on the streaming backend ÷ the lowest on the recipe's
default backend (1: the streaming backend shows the model pixels as close to timm's as the default backend does;
identical tensors count as 120 dB).

Usage: ``python benchmarks/preview_fidelity.py [--photos a.jpg b.jpg ...] [--work DIR] [--smoke]`` (``--smoke``: one
photo and only the 32 px recipe, to check that the script runs)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from torchvision.datasets import ImageFolder

from impulsevit.cli.entry import main as impulsevit_main


def _default_photos() -> list[Path]:
    import matplotlib
    import sklearn

    return [Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg",
            Path(sklearn.__file__).parent / "datasets" / "images" / "flower.jpg",
            Path(sklearn.__file__).parent / "datasets" / "images" / "china.jpg"]


def _tree(photos: list[Path], tree: Path, small: bool) -> int:
    k = 0
    for p in photos:
        im = Image.open(p).convert("RGB")
        w, h = im.size
        for box in [(0, 0, w, h), (0, 0, int(w * 0.6), h), (0, 0, w, int(h * 0.6))]:
            crop = im.crop(box)
            if small:
                crop = crop.resize((32, 32), Image.BICUBIC)
            for split in ("train", "val"):
                d = tree / split / f"c{k % 2}"
                d.mkdir(parents=True, exist_ok=True)
                crop.save(d / f"img{k}.png")
            k += 1
    return k


def _impulsevit(*argv: str) -> None:
    """``impulsevit ARGV`` in this process (one interpreter start for every command), its stdout dropped; raises
    when the command fails."""
    with contextlib.redirect_stdout(io.StringIO()):
        status = impulsevit_main(list(argv))
    if status != 0:
        raise RuntimeError(f"impulsevit {' '.join(argv)}: exit status {status}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", nargs="+", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--smoke", action="store_true", help="one photo, the 32 px recipe only: checks the script runs")
    args = ap.parse_args()
    photos = args.photos or _default_photos()
    recipes = (("vit_tiny_cifar10", True), ("deit_base_in1k", False))
    if args.smoke:
        photos, recipes = photos[:1], recipes[:1]
    work = args.work or Path(tempfile.mkdtemp(prefix="preview_fidelity_"))
    tf = create_transform(224, is_training=False, interpolation="bicubic", crop_pct=0.875, mean=(0, 0, 0),
                          std=(1, 1, 1))
    lowest = {"auto": float("inf"), "litdata": float("inf")}  # the lowest PSNR per backend over every recipe
    for recipe, small in recipes:
        tree = work / recipe
        n = _tree(photos, tree, small)
        files = [path for path, _ in ImageFolder(tree / "val").samples]  # the index order every backend shares
        for backend in ("auto", "litdata"):
            root = tree
            if backend == "litdata":  # the streaming backend reads a shard set converted from the same tree
                root = work / f"shards_{recipe}"
                for split in ("train", "val"):
                    _impulsevit("convert", "imagefolder", str(root), "--root", str(tree), "--format", "litdata",
                                "--split", split, "--no-progress")
            out = work / f"out_{recipe}_{backend}"
            _impulsevit("data", "preview", "--recipe", recipe, "--split", "val", "--num", str(n), "--out", str(out),
                        "--data.init_args.dataset=imagefolder", f"--data.init_args.root={root}",
                        f"--data.init_args.backend={backend}", "--data.init_args.num_workers=1",
                        f"--data.init_args.cache_dir={work / 'ffcv'}", "--data.init_args.augment.repeated_aug=1")
            r = torch.load(out / "val.pt", weights_only=True)
            psnr = []
            for i, index in enumerate(r["indices"].tolist()):
                ref = tf(Image.open(files[index]).convert("RGB"))
                mse = ((r["images"][i] - ref) ** 2).mean().item()
                psnr.append(10 * np.log10(1 / max(mse, 1e-12)))
            lowest[backend] = min(lowest[backend], min(psnr))
            print(f"{recipe} ({'32 px' if small else 'full-size'} photos, backend {r['backend']}): PSNR vs timm "
                  f"bicubic median {np.median(psnr):.1f} dB, min {min(psnr):.1f} dB over {n} images")
            if not small:
                ok = [min(s) * 0.875 >= 224 for s, src in zip(r["stored_hw"].tolist(), r["source_hw"].tolist())
                      if min(src) >= 256]
                print(f"  eval crop never upsampled (stored short side x 0.875 >= 224): {sum(ok)}/{len(ok)} images")
    print(f"ratio: {lowest['litdata'] / lowest['auto']:.3f}")

if __name__ == "__main__":
    main()
