"""The class-ordered shard set of the block-order study (``docs/results.md``, "The streaming block order").

Two steps around the real ``impulsevit convert``:

- ``folder OUT [--recipe R]``: write the recipe's training and validation subsets (its ``data.dataset``,
  ``train_subset`` / ``val_subset``, the images every backend picks) as an ImageFolder of PNGs,
  ``OUT/{train,val}/<NN_class>/<index>.png`` (``NN`` the label, so the folders sort in label order; ``index`` the
  image's position in the split, zero-padded, so a class's images keep the split's order). Converting that folder
  gives a set stored in class order, as a converted ImageFolder is. Written to ``OUT.tmp`` and renamed (atomic);
  an existing ``OUT`` is an error.
- ``diversity SHARDS --batch-size B --block-size N [N ...]``: the chunk sizes of the training shard set
  ``SHARDS/train`` and the mean distinct labels per batch of ``B``
  (:func:`impulsevit.data.loading.sampling.distinct_per_batch`, one rank, epochs ``0 .. --epochs - 1``, data seed
  ``--seed``) under the global order and the block order at each block size, with the block / global ratio.
- ``paired A B``: the runs ``impulse-s<S>`` of two run folders (the study's two arms, ``A`` the block order's), their
  final validation top-1 per seed (``run.json``'s ``last_val_acc1``, finished runs only) and the paired difference
  ``A − B`` in points with its 95 % Student-t interval (:func:`impulsevit.study.paired.paired_difference`, the
  ``impulsevit study`` reports' helper).

Run: ``python scripts/class_ordered_set.py folder /tmp/fmnist-folder`` (a few seconds), then
``impulsevit convert /tmp/fmnist-folder /tmp/fmnist-shards --format litdata --preset raw --chunk-bytes ...``, then
``python scripts/class_ordered_set.py diversity /tmp/fmnist-shards --batch-size 128 --block-size 1024``. Exit 2
with one line on bad input (an unknown recipe, an existing ``OUT``, a missing shard set).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np


def write_folder(out: Path, recipe: str) -> dict[str, int]:
    """Write ``recipe``'s train and val subsets under ``out`` (module docstring); returns images per split."""
    import yaml
    from PIL import Image

    from impulsevit.cli.submit import resolve_recipe
    from impulsevit.data.loading.datamodule import ImageDataModule
    from impulsevit.data.storage.convert import subset_indices

    data = yaml.safe_load(Path(resolve_recipe(recipe)).read_text())["data"]["init_args"]
    spec = ImageDataModule(**data).spec
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    counts = {}
    for split, name in ((spec.train_split, "train"), (spec.val_split, "val")):
        full = spec.info.load(spec.root, split, verify="off")
        sub = subset_indices(len(full), spec.subset(split))  # the subset every backend picks (DataSpec.load_source)
        indices = np.arange(len(full)) if sub is None else sub
        width = len(str(len(full)))
        for index in indices.tolist():
            label = int(full.labels[index])
            folder = tmp / name / f"{label:02d}_{_safe(full.classes[label])}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = np.asarray(full.load(index))
            Image.fromarray(pixels.squeeze()).save(folder / f"{index:0{width}d}.png")
        counts[name] = len(indices)
    os.replace(tmp, out)
    return counts


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(name))


def diversity(shards: Path, batch_size: int, block_sizes: list[int], epochs: int, seed: int) -> dict:
    """Chunk sizes and distinct labels per batch of ``shards/train`` under both orders (module docstring)."""
    from impulsevit.data.loading.sampling import block_sequence, distinct_per_batch, epoch_sequence
    from impulsevit.data.storage.shards import LABELS_NAME

    train = shards / "train"
    chunks = np.array([int(c["chunk_size"]) for c in json.loads((train / "index.json").read_text())["chunks"]])
    labels = np.load(train / LABELS_NAME, allow_pickle=False)
    n = int(chunks.sum())

    def mean(orders: list[np.ndarray]) -> float:
        return float(np.mean([distinct_per_batch(o[:n], labels, batch_size) for o in orders]))

    glob = mean([epoch_sequence(n, epoch=e, seed=seed)[0] for e in range(epochs)])
    block = {b: mean([block_sequence(chunks, epoch=e, seed=seed, block_size=b)[0] for e in range(epochs)])
             for b in block_sizes}
    per_class = np.bincount(labels)
    return {"samples": n, "classes": len(per_class), "chunks": len(chunks),
            "chunk_sizes": f"{chunks.min()}..{chunks.max()} (mean {chunks.mean():.1f})",
            "chunks_per_class": round(float(per_class.mean() / chunks.mean()), 2),
            "global": round(glob, 2),
            "block": {b: {"distinct": round(v, 2), "ratio": round(v / glob, 3)} for b, v in block.items()}}


def paired(a: Path, b: Path) -> dict:
    """Final top-1 (%) per seed of the finished runs ``impulse-s<S>`` under ``a`` and ``b`` and the paired ``a − b``
    (module docstring)."""
    from impulsevit.run.runs import read_run
    from impulsevit.study.paired import paired_difference

    def finals(folder: Path) -> dict[int, float | None]:
        out = {}
        for run in sorted(folder.glob("impulse-s*")):
            row = read_run(run)
            done = row.status == "finished" and row.last_val_acc1 is not None
            out[int(run.name.rpartition("-s")[2])] = 100 * row.last_val_acc1 if done else None
        return out

    fa, fb = finals(a), finals(b)
    diff = paired_difference(fa, fb)
    return {str(a): fa, str(b): fb, "difference": diff.to_dict()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("folder", help="write the recipe's subsets as a class-ordered ImageFolder of PNGs")
    f.add_argument("out", type=Path)
    f.add_argument("--recipe", default="cpu_fmnist_vit_smallimg")
    d = sub.add_parser("diversity", help="distinct labels per batch of a shard set, global vs block order")
    d.add_argument("shards", type=Path)
    d.add_argument("--batch-size", type=int, default=128)
    d.add_argument("--block-size", type=int, nargs="+", required=True)
    d.add_argument("--epochs", type=int, default=4)
    d.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("paired", help="final top-1 per seed of two run folders and their paired difference")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "folder":
            if args.out.exists():
                raise ValueError(f"{args.out} exists; remove it or name another folder")
            print(write_folder(args.out, args.recipe))
        elif args.command == "paired":
            print(json.dumps(paired(args.a, args.b), indent=1))
        else:
            if not (args.shards / "train" / "index.json").is_file():
                raise ValueError(f"{args.shards}/train is not a LitData shard set (no index.json)")
            print(json.dumps(diversity(args.shards, args.batch_size, args.block_size, args.epochs, args.seed),
                             indent=1))
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"class_ordered_set: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
