"""``impulsevit convert``: image datasets → FFCV ``.beton`` files (one per split), with a manifest next to each, or
(``--format litdata``) LitData shard sets in a local folder or an object store.

The command-line front end of :mod:`impulsevit.data.storage.convert` (which does the work and imports no argparse).

Usage::

    impulsevit convert SRC DST [--root R] [--dataset D] [--split S ...] [--preset P] [--workers N] ...
    impulsevit convert --check X.beton [...] [--full]

Sources: a registry name with ``--root`` (``impulsevit convert cifar10 out/ --root /data/cifar``), a torchvision-style
dataset folder (recognised by its marker files, e.g. ``cifar-10-batches-py/``), or an ImageFolder tree
(``SRC/{train,val}/<class>/<image>``, or ``SRC/<class>/<image>`` as a single ``train`` split).

Output: ``DST`` is a directory (``DST/<split>.beton``) or, for one split, a ``.beton`` path; with several splits and
a ``.beton`` path the split is appended to the stem (``out_train.beton``). Each ``X.beton`` gets ``X.manifest.json``
(:mod:`impulsevit.data.storage.manifest`): counts per class, the preset, a content checksum of the source (BLAKE2 of
every
file, in order), the bad inputs that were skipped, the output size and the conversion speed. The steps of a split and
the presets are described in :mod:`impulsevit.data.storage.convert` and :mod:`impulsevit.data.storage.presets`;
``--write-mode`` /
``--max-resolution`` / ``--jpeg-quality`` / ``--jpeg-proportion`` override single fields of the preset.

Existing outputs: a ``.beton`` this command wrote (its manifest is next to it) for the same request (dataset, root,
split, ``--subset``) and preset is skipped when up to date and rebuilt when its source changed (or with ``--force``);
one it wrote for another request or preset — a finished conversion of something else — is replaced only with
``--overwrite`` (:func:`~impulsevit.data.storage.convert.other_conversion`, the one check for both formats); any other
existing file at an output path is replaced only with ``--overwrite``; a folder where a ``.beton`` goes, or a file
where the ``DST`` folder goes, is refused — all before any work (:func:`impulsevit.io.claim_output`).

``--format litdata``: ``DST`` is a folder or an ``s3://bucket/prefix`` URL; each split goes to ``DST/<split>/`` as a
LitData shard set with ``impulsevit.manifest.json`` (:mod:`impulsevit.data.storage.shards`; the object store's
endpoint and credentials come from the standard AWS variables, :mod:`impulsevit.data.storage.objstore`). A set this
command wrote is skipped when up to date and rewritten when its source changed; one of another request or preset, and
(locally) any other non-empty folder there, is replaced only with ``--overwrite``, as for ``.beton`` files. A missing
bucket, missing credentials or an unreachable endpoint are one line (exit 2) before any work.

``--check``: verify ``.beton`` files against their manifests' checksums (:mod:`impulsevit.data.storage.integrity`).

Exit status: 0 done (all files good), 1 a conversion failed or a checked file is damaged, 2 bad arguments or source.
Also run as ``python -m impulsevit.data.storage.convert_cli``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from impulsevit.argparser import ArgumentParser
from impulsevit.data.sources.registry import DATASETS, DatasetInfo, detect_dataset, get_dataset, list_datasets
from impulsevit.data.storage.convert import ConversionError, convert_split, other_conversion, subset_indices
from impulsevit.data.storage.integrity import BetonError, verify_beton
from impulsevit.data.storage.manifest import read_manifest
from impulsevit.data.storage.presets import PRESETS, Preset, default_preset
from impulsevit.errors import ConfigError, StoreError, missing_extra
from impulsevit.io import WriteError, check_child_name, claim_output, parse_size
from impulsevit.procs import Stopped, stop_on_signals

__all__ = ["build_parser", "check_main", "choose_preset", "claim_converted", "claim_outputs", "claim_shard_outputs",
           "default_splits", "main", "output_path", "request_of", "resolve_source", "shards_path"]


def resolve_source(src: str, root: str | None, dataset: str | None) -> tuple[DatasetInfo, Path | None]:
    """(registry entry, root) for the SRC/--root/--dataset combination (see module docstring)."""
    if dataset is not None:
        return get_dataset(dataset), Path(root or src)
    if root is not None or (src.lower() in DATASETS and not os.path.exists(src)):
        return get_dataset(src), Path(root) if root else None
    path = Path(src)
    if not path.exists():
        raise FileNotFoundError(f"{src} is neither an existing folder nor a registry dataset "
                                f"({', '.join(list_datasets())})")
    info = detect_dataset(path)
    return (info or get_dataset("imagefolder")), path


def default_splits(info: DatasetInfo, root: Path | None) -> list[str]:
    """The splits converted when ``--split`` is not given: the registry's train and val splits; for a dataset without
    published splits (an ImageFolder) the ``train`` / ``val`` / ``test`` sub-folders present (``test`` only without
    ``val``), else the tree as ``train``."""
    if info.split_sizes or root is None:
        return [info.train_split, info.val_split]
    splits = [s for s in ("train", "val", "test") if (root / s).is_dir()]
    if "val" in splits and "test" in splits:
        splits.remove("test")
    return splits or ["train"]


def shards_path(dst: str, split: str) -> str:
    """Where ``split``'s shard set goes for ``--format litdata``: ``DST/<split>`` (a folder or URL prefix).

    Raises:
        ConfigError: ``split`` is not one folder name."""
    from impulsevit.data.storage.objstore import join

    check_child_name(split, "--split", "a split is one name (e.g. train, val)")
    return join(dst, split)


def request_of(info: DatasetInfo, root: Path | None, split: str, subset: int | None,
               shuffle_seed: int | None = None) -> dict:
    """What a conversion of ``split`` records as its ``request`` in the manifest (and is compared on); the
    ``shuffle_seed`` key only for a shard set written shuffled (so sets written before the option compare equal)."""
    request = {"dataset": info.name, "root": str(root), "split": split, "subset": subset}
    return request if shuffle_seed is None else {**request, "shuffle_seed": int(shuffle_seed)}


def claim_converted(existing: dict | None, out: str | os.PathLike, split: str, preset: Preset, request: dict,
                    overwrite: bool) -> None:
    """Before any work, for both formats: the output ``out`` of ``split`` holds no finished conversion of another
    request or preset (its manifest ``existing``; :func:`~impulsevit.data.storage.convert.other_conversion`), unless
    ``overwrite``. The same conversion (up to date, or of a changed source) is the writer's to skip or rebuild.

    Raises:
        ConfigError: one line naming the output, what differs and ``--overwrite``."""
    diffs = other_conversion(existing, preset, request)
    if diffs and not overwrite:
        raise ConfigError(f"DST (split {split!r}) {out} holds a finished conversion of another request "
                          f"({'; '.join(diffs)}); pass --overwrite to replace it, or give another DST (nothing was "
                          f"written)")


def claim_shard_outputs(dst: str, splits: list[str], overwrite: bool, preset: Preset,
                        requests: dict[str, dict]) -> None:
    """Before any work, for ``--format litdata``: a local ``DST`` is a folder or nothing yet and each split's folder
    is free, empty, or a shard set this command wrote (then skipped or rewritten; one of another request or preset
    only with ``overwrite``: :func:`claim_converted`); a remote ``DST``'s bucket exists and the credentials are
    accepted. ``requests``: each split's :func:`request_of`.

    Raises:
        ConfigError: a file where a folder goes, a non-empty folder this command did not write, or a shard set of
            another request (without ``overwrite``). StoreError: the store cannot be read or written (one line)."""
    from impulsevit.data.storage import objstore
    from impulsevit.data.storage.shards import MANIFEST_NAME, read_shards_manifest

    remote = objstore.is_remote(dst)
    if remote:
        objstore.check_writable(dst)
    else:
        claim_output(dst, False, "into", what="DST")
    for split in splits:
        out = shards_path(dst, split)
        if not remote:
            claim_output(out, True, "into", what=f"DST (split {split!r})")
            folder = Path(out)
            if folder.is_dir() and any(folder.iterdir()) and not (folder / MANIFEST_NAME).is_file() and not overwrite:
                raise ConfigError(f"DST (split {split!r}) {out} is a non-empty folder that `impulsevit convert "
                                  f"--format litdata` did not write; give another DST or pass --overwrite (nothing "
                                  f"was written)")
        claim_converted(read_shards_manifest(out), out, split, preset, requests[split], overwrite)


def output_path(dst: str, split: str, multiple: bool) -> Path:
    """Where ``split`` is written for ``DST`` (see the module docstring); ``multiple``: more than one split. A split is
    one name (:func:`impulsevit.io.check_child_name`), so the file stays in ``DST``'s folder.

    Raises:
        ConfigError: ``split`` is not one folder name (``../x``, ``a/b``, ...).
    """
    check_child_name(split, "--split", "a split is one name (e.g. train, val)")
    d = Path(dst)
    if d.suffix == ".beton":
        return d.with_name(f"{d.stem}_{split}.beton") if multiple else d
    return d / f"{split}.beton"


def claim_outputs(dst: str, splits: list[str], overwrite: bool, preset: Preset, requests: dict[str, dict]) -> None:
    """Before any work (:func:`impulsevit.io.claim_output`): ``DST`` is a folder or nothing yet (unless it is a
    ``.beton`` path), and each split's ``.beton`` is free, an output of this command for the same request (a manifest
    next to it: skipped or rebuilt as before; another request or preset only with ``overwrite``:
    :func:`claim_converted`), or replaced with ``overwrite``. ``requests``: each split's :func:`request_of`.

    Raises:
        ConfigError: a file where the ``DST`` folder goes, a folder where a ``.beton`` goes, an existing file
            without a manifest, or one of another request (without ``overwrite``; one line naming it).
    """
    if Path(dst).suffix != ".beton":
        claim_output(dst, False, "into", what="DST")
    for split in splits:
        out = output_path(dst, split, len(splits) > 1)
        existing = read_manifest(out, check_size=False)
        claim_output(out, overwrite or existing is not None, "file", what=f"DST (split {split!r})")
        claim_converted(existing, out, split, preset, requests[split], overwrite)


def build_parser() -> argparse.ArgumentParser:
    """The ``impulsevit convert SRC DST ...`` argument parser (``--check`` has its own, see :func:`check_main`)."""
    p = ArgumentParser(prog="impulsevit convert", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"datasets: {', '.join(list_datasets())}\npresets: {', '.join(PRESETS)}")
    p.add_argument("src", help="registry name (with --root), a dataset folder, or an ImageFolder tree")
    p.add_argument("dst", help="output folder (<split>.beton inside) or a .beton path; --format litdata: a folder or "
                   "s3://bucket/prefix (<split>/ inside)")
    p.add_argument("--format", choices=["ffcv", "litdata"], default="ffcv",
                   help="ffcv: .beton files (default); litdata: LitData shard sets, local or in an object store")
    p.add_argument("--root", help="dataset folder when SRC is a registry name")
    p.add_argument("--dataset", help="treat SRC as this registry dataset's folder (skip auto-detection)")
    p.add_argument("--split", nargs="+", help="splits to convert (default: the dataset's train and val splits)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="storage preset (default: raw for small-image "
                   "datasets, short256 otherwise)")
    p.add_argument("--write-mode", choices=["raw", "jpg", "proportion", "smart"])
    p.add_argument("--max-resolution", type=int, help="cap on the longer side in pixels (0: unchanged)")
    p.add_argument("--jpeg-quality", type=int)
    p.add_argument("--jpeg-proportion", type=float, help="share of images stored as JPEG in proportion mode")
    p.add_argument("--subset", type=int, help="convert only this many images per split (seeded random choice)")
    p.add_argument("--workers", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    p.add_argument("--chunk-bytes", default="64MB", type=_chunk_bytes,
                   help="--format litdata: the size of one chunk, the unit a reader downloads and caches (bytes, or "
                        "with a decimal unit: 64MB)")
    p.add_argument("--shuffle", type=int, nargs="?", const=0, default=None, metavar="SEED",
                   help="--format litdata: store the images in a seeded random order (SEED, default 0), so each "
                        "chunk mixes classes; training on such a set then reads whole chunks (data.order=auto "
                        "picks block), which a class-sorted source such as an image folder needs (docs/data.md)")
    p.add_argument("--on-error", choices=["skip", "fail"], default="skip", help="bad inputs: leave out or stop")
    p.add_argument("--verify", choices=["error", "warn", "off"], default="warn",
                   help="registry datasets: counts that differ from the published ones are an error, a warning, "
                        "or not checked")
    p.add_argument("--force", action="store_true", help="rebuild outputs even when their manifest is up to date")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing file at an output path that this command did not write (no manifest), "
                        "or a conversion it wrote for another request or preset")
    p.add_argument("--no-progress", action="store_true")
    p.epilog += ("\n\nimpulsevit convert --check X.beton [...] [--full]: verify .beton files against their manifests' "
                 "checksums (sampled chunks; --full: every chunk)")
    return p


def _chunk_bytes(text: str) -> int:
    """argparse type of ``--chunk-bytes``: :func:`~impulsevit.io.parse_size`'s bytes, its one line as the usage
    error."""
    try:
        return parse_size(text, "--chunk-bytes")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def choose_preset(info: DatasetInfo, args: argparse.Namespace) -> Preset:
    """``--preset`` (default: :func:`~impulsevit.data.storage.presets.default_preset` of the dataset) with the
    single-field
    flags applied; a preset changed by flags is named ``<name>+custom``."""
    preset = PRESETS[args.preset] if args.preset else default_preset(info.small)
    overrides = {}
    if args.write_mode:
        overrides["write_mode"] = args.write_mode
    if args.max_resolution is not None:
        overrides["max_resolution"] = args.max_resolution or None
    if args.jpeg_quality is not None:
        overrides["jpeg_quality"] = args.jpeg_quality
    if args.jpeg_proportion is not None:
        overrides["jpeg_proportion"] = args.jpeg_proportion
    if overrides:
        preset = replace(preset, name=preset.name + "+custom", **overrides)
    return preset


def check_main(argv: list[str]) -> int:
    """``impulsevit convert --check X.beton [...] [--full]``: verify ``.beton`` files against their manifests (header
    and sizes, then sampled chunk checksums, or every chunk with ``--full``). Exit 0 all good, 1 a file is damaged."""
    p = ArgumentParser(prog="impulsevit convert --check",
                                description="Verify .beton files against the checksums in their manifests.")
    p.add_argument("betons", nargs="+", metavar="X.beton")
    p.add_argument("--full", action="store_true", help="hash every chunk (default: header, sizes, sampled chunks)")
    args = p.parse_args(argv)
    status = 0
    for path in args.betons:
        try:
            manifest = read_manifest(path, check_size=False)
            verify_beton(path, manifest, "full" if args.full else "sampled")
        except (BetonError, FileNotFoundError) as exc:
            print(f"impulsevit convert: error: {exc}", file=sys.stderr)
            status = 1
            continue
        what = "no manifest: structure only" if manifest is None else ("every chunk" if args.full else "sampled")
        print(f"{path}: ok ({what})")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``impulsevit convert``; returns the process exit code (0 ok, 1 conversion failed, 2 usage)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--check" in argv:
        argv.remove("--check")
        return check_main(argv)
    args = build_parser().parse_args(argv)
    try:
        with stop_on_signals():  # SIGTERM / SIGINT unwind: writers stopped, temp file removed, lock released
            return _convert(args)
    except Stopped as stop:
        print(f"impulsevit convert: stopped by {stop.name}: the split being written was left out (no temp file, "
              f"no lock left); rerun the same command to convert it (exit {stop.code})", file=sys.stderr)
        return int(stop.code)


def _convert(args: argparse.Namespace) -> int:
    try:
        if args.shuffle is not None and args.format != "litdata":
            raise ConfigError("--shuffle applies to --format litdata only: a .beton is read in any order at the same "
                              "speed (nothing was written)")
        info, root = resolve_source(args.src, args.root, args.dataset)
        preset = choose_preset(info, args)
        splits = args.split or default_splits(info, root)
        shards = args.format == "litdata"
        requests = {split: request_of(info, root, split, args.subset, args.shuffle) for split in splits}
        if shards:
            claim_shard_outputs(args.dst, splits, args.overwrite, preset, requests)
        else:
            claim_outputs(args.dst, splits, args.overwrite, preset, requests)
        for split in splits:
            source = info.load(root, split, verify=args.verify)
            sub = subset_indices(len(source), args.subset)
            if sub is not None:
                source = source.subset(sub)
            out = shards_path(args.dst, split) if shards else output_path(args.dst, split, len(splits) > 1)
            print(f"[convert] {info.name} split {split!r} from {root}: {len(source)} images, "
                  f"{len(source.classes)} classes -> {out}")
            request = requests[split]
            if shards:
                from impulsevit.data.storage.shards import write_shards

                write_shards(source, out, preset, on_error=args.on_error, progress=not args.no_progress,
                             force=args.force, normalization=(info.mean, info.std), request=request,
                             chunk_bytes=args.chunk_bytes, shuffle_seed=args.shuffle)
                continue
            convert_split(source, out, preset, workers=args.workers, on_error=args.on_error,
                          progress=not args.no_progress, force=args.force, normalization=(info.mean, info.std),
                          request=request)
    except (ConversionError, WriteError) as exc:
        print(f"impulsevit convert: error: {exc}", file=sys.stderr)
        return 1
    except (StoreError, ImportError) as exc:
        extra = missing_extra(exc.name) if isinstance(exc, ModuleNotFoundError) else None
        print(f"impulsevit convert: error: {extra or exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, KeyError, ValueError) as exc:  # ConfigError (an output claimed) is a ValueError
        print(f"impulsevit convert: error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
