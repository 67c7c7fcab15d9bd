"""``impulsevit download NAME ROOT``: fetch a public dataset into the layout the registry's readers accept.

The downloads are ``torchvision.datasets``' own (their URLs, mirrors and MD5 checksums; nothing is copied here), and
the folders they create are the ones :mod:`impulsevit.data.sources.formats` reads:

==============  =========================================  ====================================
name            torchvision class                          folder under ROOT
==============  =========================================  ====================================
cifar10         ``CIFAR10``                                ``cifar-10-batches-py/``
cifar100        ``CIFAR100``                               ``cifar-100-python/``
stl10           ``STL10`` (the whole binary archive)       ``stl10_binary/``
flowers102      ``Flowers102``                             ``flowers-102/``
pets            ``OxfordIIITPet``                          ``oxford-iiit-pet/``
food101         ``Food101``                                ``food-101/``
fashion_mnist   ``FashionMNIST``                           ``FashionMNIST/raw/``
==============  =========================================  ====================================

Each dataset's download is its registration's ``download`` function (:func:`~impulsevit.data.register_dataset`;
the built-ins above use :class:`~impulsevit.data.sources.registry.TorchvisionDownload`), so a plugin's dataset is
fetched the same way. After the download every split is read back through the registry and its counts checked
(``verify``). A dataset whose files are already there is not fetched again (torchvision checks their checksums).
ImageNet-1K and ImageNet-21K cannot be downloaded without an account: :func:`download` raises
:class:`ManualDownloadError` with their registration's ``manual_download`` text (what to obtain and which layouts are
read). The datamodule's ``download: true`` calls :func:`ensure_dataset` from ``prepare_data`` (serialised across
processes with a lock file next to ROOT). ``download: true`` means "fetch the dataset when it is missing and can be
fetched": a dataset without a ``download`` (``imagefolder``, ``digits``, ImageNet) is read from its root as with
``download: false``, which checks that root. A root that does not exist is created for the download, as
``torchvision.datasets`` does; a download that fails removes what it created (the root and the folders above it that
it made, or the new entries of a root that existed) and raises :class:`DownloadError`: one line naming the dataset,
the root and the cause.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from pathlib import Path

from impulsevit.argparser import ArgumentParser
from impulsevit.data.sources.registry import DatasetInfo, DatasetMismatchError, Verify, downloadable, get_dataset
from impulsevit.errors import ConfigError, DataError
from impulsevit.io import claim_output

__all__ = ["DownloadError", "ManualDownloadError", "download", "ensure_dataset", "main"]

class ManualDownloadError(RuntimeError):
    """The dataset cannot be fetched automatically; the message says what to obtain and how to lay it out."""


class DownloadError(DataError):
    """A download failed (network, checksum, or the files fetched do not read back); the message names the dataset,
    the root and the cause. What the download created was removed. Exit status 1, as ``impulsevit download``'s."""


def _present(info: DatasetInfo, root: Path) -> bool:
    return any((root / m).exists() for m in info.markers)


def download(name: str, root: str | os.PathLike, verify: Verify = "error") -> dict[str, int]:
    """Fetch dataset ``name`` into ``root`` with its registered ``download`` and read every split back; returns
    images per split.

    Raises :class:`ManualDownloadError` for ImageNet / IN-21K, ``KeyError`` for an unknown name, ``ValueError`` for
    a registry dataset that needs no download (``digits`` ships with scikit-learn), and the registry's
    ``DatasetMismatchError`` when the downloaded counts differ from the published ones (``verify='error'``); a
    ``ConfigError`` (before any download) when ``root`` or a folder above it is a file. Any other failure (the
    network, a checksum, files that cannot be read back, Ctrl-C) first takes back what this call made: the folders
    it created, or the new entries of a ``root`` that existed; a count mismatch keeps its files (``verify='warn'``
    can use them)."""
    info = get_dataset(name)
    if info.download is None and info.manual_download:
        raise ManualDownloadError(f"{info.name} cannot be downloaded automatically. {info.manual_download}")
    if info.download is None:
        raise ValueError(f"{info.name} needs no download ({info.description or 'no download function registered'}); "
                         f"downloadable: {', '.join(downloadable())}")
    root = Path(root)
    claim_output(root, False, "into", what="ROOT")  # a file there (or above): one line, before any download
    created = _created_by(root)
    before = set() if created is not None else {e.name for e in root.iterdir()}
    root.mkdir(parents=True, exist_ok=True)
    try:
        info.download(root)
        return {split: len(info.load(root, split, verify=verify)) for split in info.split_sizes}
    except BaseException as exc:  # also Ctrl-C / SIGTERM: a partial download is not left behind
        if not isinstance(exc, DatasetMismatchError):
            _take_back(root, created, before)
        raise


def _created_by(root: Path) -> Path | None:
    """The outermost of ``root`` and its parents that does not exist yet (what a ``mkdir -p root`` would create),
    else None."""
    top = None
    for p in (root, *root.parents):
        if p.exists() or p.is_symlink():
            break
        top = p
    return top


def _take_back(root: Path, created: Path | None, before: set[str]) -> None:
    """Remove what a failed download made: the folder ``created`` (with everything in it), or, when ``root`` existed,
    the entries of ``root`` that were not in ``before``."""
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if entry.name not in before:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)


def _remove_empty(folder: Path, top: Path) -> None:
    """Remove ``folder`` and its parents up to ``top`` (included) while they are empty."""
    for p in (folder, *folder.parents):
        try:
            p.rmdir()
        except OSError:
            return
        if p == top:
            return


def ensure_dataset(info: DatasetInfo, root: str | os.PathLike, verify: Verify = "error",
                   log=print) -> None:  # noqa: ANN001 - any print-like callable
    """Download ``info`` into ``root`` unless its marker files are already there; concurrent callers (ranks of
    several nodes sharing ``root``) are serialised by a lock file ``<root>.lock``: one downloads, the others wait and
    find the files. A dataset without a ``download`` function is left to its reader (nothing is fetched or created).

    Raises:
        DownloadError: the download or the read-back failed (one line: dataset, root, cause); what it created under
            (or as) ``root`` was removed first. The registry's ``DatasetMismatchError`` (``verify='error'``) is kept
            as it is.
    """
    from impulsevit.data.locking import file_lock

    if info.download is None:  # "fetch if missing and fetchable": a folder dataset is checked by its reader
        return
    root = Path(root)
    claim_output(root, False, "into", what="data root")
    if _present(info, root):
        return
    made = _created_by(root.parent)  # the folders made for the lock file, removed again when left empty
    started = False
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(root.with_name(root.name + ".lock"), what=f"download of {info.name} into {root}", log=log):
            if _present(info, root):
                return
            started = True
            log(f"[impulsevit] downloading {info.name} into {root}")
            download(info.name, root, verify=verify)
    except BaseException as exc:  # also Ctrl-C / SIGTERM: a partial download is not left behind
        if isinstance(exc, DatasetMismatchError | ConfigError):
            raise  # the files are there (verify='warn' uses them), or nothing was started
        if made is not None:
            _remove_empty(root.parent, made)
        if started and isinstance(exc, OSError | RuntimeError | ValueError):  # torchvision: URLError or RuntimeError
            cause = " ".join(str(exc).split()) or type(exc).__name__
            raise DownloadError(f"download of {info.name} into {root} failed ({cause}); nothing was left there: "
                                f"check the network, or fetch it elsewhere (`impulsevit download {info.name} DIR`) "
                                f"and pass --data.init_args.root=DIR") from exc
        raise


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="impulsevit download", allow_abbrev=False,
                                description="Fetch a public dataset (torchvision.datasets' URLs and checksums) into "
                                            "the layout impulsevit reads.",
                                epilog=f"downloadable: {', '.join(downloadable())}; imagenet and imagenet21k print "
                                       "what to obtain by hand")
    p.add_argument("name", help="registry name, e.g. cifar10")
    p.add_argument("root", help="folder to download into (pass it as data.init_args.root)")
    p.add_argument("--verify", choices=["error", "warn", "off"], default="error",
                   help="counts that differ from the published ones are an error (default), a warning, or not checked")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``impulsevit download``; 0 done, 1 download or check failed, 2 usage / manual download."""
    args = _parser().parse_args(argv)
    if Path(args.root).exists() and not Path(args.root).is_dir():
        raise ConfigError(f"ROOT {args.root} is a file, not a folder (give a folder to download into)")
    try:
        get_dataset(args.name)
    except KeyError as exc:
        print(f"impulsevit download: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    try:
        counts = download(args.name, args.root, verify=args.verify)
    except ManualDownloadError as exc:
        print(f"impulsevit download: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a dataset that needs no download (2), a count mismatch (1)
        print(f"impulsevit download: error: {exc}", file=sys.stderr)
        return 1 if type(exc).__name__ == "DatasetMismatchError" else 2
    except (OSError, RuntimeError, KeyError) as exc:  # network errors, checksum mismatches (torchvision raises
        # RuntimeError), downloaded files that cannot be read back (a KeyError from a pickled batch's keys)
        cause = " ".join(str(exc).split())  # torchvision's multi-line mirror report, as one line
        print(f"impulsevit download: error: {args.name} into {args.root}: {type(exc).__name__}: {cause}; nothing "
              f"this download made was left there", file=sys.stderr)
        return 1
    info = get_dataset(args.name)
    listing = ", ".join(f"{split} {n:,}" for split, n in counts.items())
    print(f"{info.name} is in {Path(args.root).resolve()} ({listing} images); train with "
          f"--data.init_args.dataset={info.name} --data.init_args.root={Path(args.root).resolve()}")
    return 0
