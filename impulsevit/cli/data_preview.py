"""``impulsevit data preview``: the images a recipe feeds the model, as a PNG grid and a tensor file.

Usage::

    impulsevit data preview --recipe R [fit overrides …] --split train|val [--num N] [--out DIR] [--overwrite]

The command line is parsed exactly as ``impulsevit fit`` parses it (LightningCLI / jsonargparse: the recipe, every
``--dotted.key=value`` override, key-typo suggestions; :func:`impulsevit.cli.fit_datamodule.build_datamodule`); only the
``data`` section is instantiated — trainer and model keys are validated and otherwise ignored. What is collected and
written, and in which format: :mod:`impulsevit.tools.preview`.
"""

from __future__ import annotations

import argparse
import sys

import torch

from impulsevit.argparser import ArgumentParser, did_you_mean
from impulsevit.cli.fit_datamodule import build_datamodule
from impulsevit.tools.preview import claim_preview, class_names, collect, write_preview

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="impulsevit data preview", allow_abbrev=False,
                       description="Write the images a recipe feeds the model (PNG grid + tensors).",
                       epilog="Every other argument is parsed as by `impulsevit fit` (--recipe R, "
                              "--data.init_args.root=..., ...).")
    p.add_argument("--split", choices=["train", "val"], required=True)
    p.add_argument("--num", type=int, default=16, help="number of images (default 16)")
    p.add_argument("--out", default="preview", help="output folder (default ./preview)")
    p.add_argument("--overwrite", action="store_true", help="replace the split's files of an earlier preview in --out")
    return p


USAGE = ("usage: impulsevit data preview --recipe R [fit overrides ...] --split train|val [--num N] [--out DIR] "
         "[--overwrite]")


def main(argv: list[str]) -> int:
    """Entry point of ``impulsevit data``; returns the exit status (2: bad arguments)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__.split(chr(10) * 2)[0]}")
        return 0 if argv else 2
    if argv[0] != "preview":
        hint = "; did you mean 'preview'?" if did_you_mean(argv[0], ["preview"]) else ""
        print(f"impulsevit data: error: unknown command {argv[0]!r} (choose from preview){hint}", file=sys.stderr)
        return 2
    args, rest = _parser().parse_known_args(argv[1:])
    if not any(a.split("=", 1)[0] in ("--recipe", "--config", "-c") for a in rest):
        print("impulsevit data preview: error: --recipe is required (impulsevit data --help lists the options)",
              file=sys.stderr)
        return 2
    try:
        claim_preview(args.out, args.split, args.overwrite)
        dm = build_datamodule(rest)
        with torch.no_grad():  # scoped: a process that called main() in-process keeps its autograd state
            result = collect(dm, args.split, args.num)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"impulsevit data preview: error: {exc}", file=sys.stderr)
        return 2
    pt, png = write_preview(result, args.out, class_names(dm, args.split))
    print(f"wrote {png} and {pt}: {len(result['labels'])} {args.split} images of {tuple(result['images'].shape[2:])} "
          f"px ({result['backend'] or type(dm).__name__})")
    return 0
