"""``impulsevit predict MODEL IMAGES [--out predictions.csv] [--overwrite] [--ema] [--batch-size N] [--workers N]
[--trust-checkpoint]``.

Classifies every image under the folder ``IMAGES`` (recursively; timm's image extensions) with ``MODEL``, either a
Lightning checkpoint of a run (file or FSDP2 folder) or a folder written by ``impulsevit export``, and writes a CSV
(atomically; an existing ``--out`` file is replaced only with ``--overwrite``, checked before any work): ``path``
(relative to ``IMAGES``), then ``class_1, prob_1, …, class_5, prob_5`` (the top-5 class names and softmax
probabilities; fewer for models with fewer classes). Preprocessing is the model's own data config:
``timm.data.resolve_data_config({}, model=m)`` + ``timm.data.create_transform(**cfg)`` — for an exported folder the
``pretrained_cfg`` of its ``config.json``, for a checkpoint the run's evaluation transform it records (the same values
``export`` writes). Images are opened with PIL and converted to RGB; unreadable ones are skipped, listed on stderr
with a count. A progress bar (stderr, on a terminal) shows on folders of more than one batch.

Without a positional ``MODEL``, ``impulsevit predict --recipe …`` stays LightningCLI's ``predict`` subcommand (the
recipe's validation split through ``ImageClassifier.predict_step``). Weights: the raw model; ``--ema`` the EMA copy
(checkpoints only; an exported folder holds what was exported). Not supported: videos, multi-page images (first page).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from impulsevit.argparser import ArgumentParser
from impulsevit.errors import ConfigError, state_dict_mismatch
from impulsevit.safe_load import TRUST_FLAG, TRUST_HELP

__all__ = ["find_images", "load_predictor", "main", "predict_folder"]


def load_predictor(path: str | os.PathLike, ema: bool = False,
                   trust: bool | None = None) -> tuple[nn.Module, dict[str, Any], list[str]]:
    """``(model in eval mode, timm data config, class names)`` for a checkpoint, a run folder (the checkpoint
    ``--resume auto`` would pick in it) or an exported folder (a checkpoint is read through
    :mod:`impulsevit.safe_load`; ``trust``: see :func:`impulsevit.safe_load.load_checkpoint`).

    Raises:
        FileNotFoundError / ValueError / KeyError: the path is missing, unreadable or not a model (names it).
        UntrustedFileError: the checkpoint would run code when loaded (a ``ValueError`` too); nothing of it ran.
    """
    import timm

    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file():
        if ema:
            raise ValueError(f"--ema applies to checkpoints; {path} is an exported folder (it holds the weights "
                             f"that were exported)")
        import impulsevit.models  # noqa: F401  (impulsevit's own architectures, e.g. ConvMixer)

        try:
            model = timm.create_model(f"local-dir:{path}", pretrained=True)
        except (RuntimeError, ValueError, KeyError, TypeError, OSError) as e:
            why = state_dict_mismatch(e) or (str(e).splitlines() or [type(e).__name__])[0]
            raise ValueError(f"{path} is not a loadable timm model folder: {why}") from e
    else:
        from impulsevit.training.checkpointing import run_folder_checkpoint

        path = run_folder_checkpoint(path) or path  # a run folder: the checkpoint --resume auto would pick
        if path.is_dir() and not (path / ".metadata").is_file():
            raise ConfigError(f"{path} is not an exported model folder (no config.json), a run folder (no "
                              f"checkpoints/) nor a checkpoint (a .ckpt file, or a distributed checkpoint folder "
                              f"holding .metadata)")
        from impulsevit.tools.checkpoint_model import build_model, data_config, load_checkpoint_file, run_record

        ckpt = load_checkpoint_file(path, trust=trust)
        model = build_model(ckpt, ema=ema, source=f"checkpoint {path}")
        names = run_record(ckpt).get("class_names")
        model.pretrained_cfg = {**model.pretrained_cfg, **data_config(ckpt), "num_classes": model.num_classes,
                                **({"label_names": list(names)} if names else {})}
    model.eval()
    cfg = timm.data.resolve_data_config({}, model=model)
    names = model.pretrained_cfg.get("label_names") or [str(i) for i in range(model.num_classes)]
    return model, cfg, [str(n) for n in names]


def find_images(folder: str | os.PathLike) -> list[Path]:
    """Image files under ``folder`` (recursive, timm's image extensions, case-insensitive), sorted by path.

    Raises:
        ConfigError: ``folder`` is not a folder, or holds no image file.
    """
    from timm.data.readers.img_extensions import get_img_extensions

    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder of images")
    exts = {e.lower() for e in get_img_extensions()}
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in exts and p.is_file())
    if not files:
        raise ConfigError(f"{folder} holds no image files ({', '.join(sorted(exts))})")
    return files


class _Images(Dataset):
    """``(index, transformed image or None, error message or None)`` per file."""

    def __init__(self, files: list[Path], transform: Any) -> None:
        self.files, self.transform = files, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str | None]:
        from PIL import Image

        try:
            with Image.open(self.files[i]) as img:
                return i, self.transform(img.convert("RGB")), None
        except (OSError, ValueError, SyntaxError) as e:  # PIL: UnidentifiedImageError (OSError), truncated data, ...
            return i, None, (str(e).splitlines() or [type(e).__name__])[0]


def _collate(items: list[tuple[int, torch.Tensor | None, str | None]]) -> tuple[list[int], torch.Tensor | None,
                                                                               list[tuple[int, str]]]:
    ok = [(i, x) for i, x, _ in items if x is not None]
    bad = [(i, err) for i, x, err in items if x is None]
    return [i for i, _ in ok], (torch.stack([x for _, x in ok]) if ok else None), bad


def predict_folder(model: nn.Module, cfg: dict[str, Any], names: list[str], files: list[Path], root: Path,
                   batch_size: int = 64, workers: int = 0, progress: bool | None = None
                   ) -> tuple[list[list[Any]], list[tuple[Path, str]]]:
    """Top-5 rows ``[path relative to root, class_1, prob_1, …]`` in file order, and the unreadable files with why."""
    import timm
    from tqdm import tqdm

    transform = timm.data.create_transform(**cfg)
    loader = DataLoader(_Images(files, transform), batch_size=batch_size, num_workers=workers, collate_fn=_collate)
    k = min(5, len(names))
    rows: dict[int, list[Any]] = {}
    bad: list[tuple[Path, str]] = []
    show = len(files) > batch_size if progress is None else progress
    with torch.inference_mode():
        for idx, images, errors in tqdm(loader, desc="predict", unit="batch", file=sys.stderr,
                                        disable=None if show else True):
            bad += [(files[i], err) for i, err in errors]
            if images is None:
                continue
            probs = model(images).float().softmax(dim=-1)
            top_p, top_i = probs.topk(k, dim=-1)
            for i, ps, cs in zip(idx, top_p.tolist(), top_i.tolist()):
                row: list[Any] = [files[i].relative_to(root).as_posix()]
                for p, c in zip(ps, cs):
                    row += [names[c] if c < len(names) else str(c), f"{p:.6f}"]
                rows[i] = row
    return [rows[i] for i in sorted(rows)], bad


def _at_least(low: int):  # noqa: ANN202 - an argparse type
    """An argparse ``type``: an int ``>= low`` (else argparse's one-line usage error, exit status 2)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


def main(argv: list[str] | None = None) -> int:
    """``impulsevit predict MODEL IMAGES [...]``; the exit status (0 done, 2 bad input, 1 no image readable)."""
    parser = ArgumentParser(
        prog="impulsevit predict",
        description="Top-5 classes of every image in a folder as CSV, with the model's own data config "
                    "(`impulsevit predict --recipe ...` is LightningCLI's predict).")
    parser.add_argument("model", help="checkpoint (.ckpt file or FSDP2 folder) or a folder from impulsevit export")
    parser.add_argument("images", help="folder of images (searched recursively)")
    parser.add_argument("--out", default="predictions.csv", help="CSV to write (default: predictions.csv)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    parser.add_argument("--ema", action="store_true", help="checkpoints: use the EMA weights")
    parser.add_argument("--batch-size", type=_at_least(1), default=64)
    parser.add_argument("--workers", type=_at_least(0), default=0, help="DataLoader worker processes (default 0)")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    from impulsevit.io import WriteError, atomic_write_text, claim_output

    try:
        claim_output(args.out, args.overwrite, "file", what="--out")  # before any work: never replaced unasked
        files = find_images(args.images)
        model, cfg, names = load_predictor(args.model, ema=args.ema, trust=True if args.trust_checkpoint else None)
    except (FileNotFoundError, KeyError, ValueError, ConfigError) as e:
        print(f"impulsevit predict: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    rows, bad = predict_folder(model, cfg, names, files, Path(args.images), batch_size=args.batch_size,
                               workers=args.workers)
    if bad:
        listed = "; ".join(f"{p} ({why})" for p, why in bad[:20]) + (" …" if len(bad) > 20 else "")
        print(f"impulsevit predict: skipped {len(bad)} unreadable image(s) of {len(files)}: {listed}", file=sys.stderr)
    if not rows:
        print(f"impulsevit predict: error: none of the {len(files)} images in {args.images} could be read",
              file=sys.stderr)
        return 1
    k = min(5, len(names))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["path", *[f"{what}_{j}" for j in range(1, k + 1) for what in ("class", "prob")]])
    writer.writerows(rows)
    try:
        atomic_write_text(args.out, buf.getvalue())
    except WriteError as e:
        print(f"impulsevit predict: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {len(rows)} images, top-{k} classes ({len(bad)} skipped); input "
          f"{cfg['input_size'][1]} px, {cfg['interpolation']}, crop_pct {cfg['crop_pct']}")
    return 0
