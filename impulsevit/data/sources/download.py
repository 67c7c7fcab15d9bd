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

After the download every split is read back through the registry and its counts checked (``verify``). A dataset
whose files are already there is not fetched again (torchvision checks their checksums). ImageNet-1K and
ImageNet-21K cannot be downloaded without an account: :func:`download` raises :class:`ManualDownloadError` saying
what to obtain and which layouts are read. The datamodule's ``download: true`` calls :func:`ensure_dataset` from
``prepare_data`` (serialised across processes with a lock file next to ROOT).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from impulsevit.data.sources.registry import DatasetInfo, Verify, get_dataset

__all__ = ["DOWNLOADABLE", "ManualDownloadError", "download", "ensure_dataset", "main"]

# registry name -> (torchvision.datasets class, constructor keywords that make it fetch everything the registry reads)
DOWNLOADABLE: dict[str, tuple[str, dict]] = {
    "cifar10": ("CIFAR10", {"train": True}),
    "cifar100": ("CIFAR100", {"train": True}),
    "stl10": ("STL10", {"split": "train"}),
    "flowers102": ("Flowers102", {"split": "train"}),
    "pets": ("OxfordIIITPet", {"split": "trainval"}),
    "food101": ("Food101", {"split": "train"}),
    "fashion_mnist": ("FashionMNIST", {"train": True}),
}

MANUAL = {
    "imagenet": (
        "ImageNet-1K (ILSVRC-2012) needs an account at https://image-net.org (or the Kaggle ILSVRC challenge "
        "'imagenet-object-localization-challenge'). Obtain ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and "
        "ILSVRC2012_devkit_t12.tar.gz, then lay them out under ROOT as: train/<wnid>/*.JPEG (extract the train tar, "
        "then each of its 1,000 per-class tars into a folder of that name); val/ILSVRC2012_val_%08d.JPEG flat with "
        "the devkit extracted at ROOT/ILSVRC2012_devkit_t12/ (its data/meta.mat and "
        "data/ILSVRC2012_validation_ground_truth.txt label them), or val flat with Kaggle's LOC_val_solution.csv next "
        "to it, or val/<wnid>/*.JPEG; Kaggle's ROOT/ILSVRC/Data/CLS-LOC/{train,val} tree is read as it is."),
    "imagenet21k": (
        "ImageNet-21K needs an account at https://image-net.org: obtain the full release winter21_whole.tar.gz "
        "(19,167 classes, 13,153,500 images) or fall11_whole.tar (21,841 classes, 14,197,122 images), extract it to "
        "ROOT/winter21_whole/ (or ROOT/fall11_whole/) and each per-class n*.tar inside into a folder of that name "
        "(for f in n*.tar; do mkdir -p ${f%.tar} && tar -xf $f -C ${f%.tar}; done). Any per-class counts are read; "
        "validation is the first min(50, n // 2) files of each class."),
}


class ManualDownloadError(RuntimeError):
    """The dataset cannot be fetched automatically; the message says what to obtain and how to lay it out."""


def _present(info: DatasetInfo, root: Path) -> bool:
    return any((root / m).exists() for m in info.markers)


def download(name: str, root: str | os.PathLike, verify: Verify = "error") -> dict[str, int]:
    """Fetch dataset ``name`` into ``root`` with torchvision and read every split back; returns images per split.

    Raises :class:`ManualDownloadError` for ImageNet / IN-21K, ``KeyError`` for an unknown name, ``ValueError`` for
    a registry dataset that needs no download (``digits`` ships with scikit-learn), and the registry's
    ``DatasetMismatchError`` when the downloaded counts differ from the published ones (``verify='error'``)."""
    info = get_dataset(name)
    if info.name in MANUAL:
        raise ManualDownloadError(f"{info.name} cannot be downloaded automatically. {MANUAL[info.name]}")
    if info.name not in DOWNLOADABLE:
        raise ValueError(f"{info.name} needs no download ({info.description}); downloadable: "
                         f"{', '.join(DOWNLOADABLE)}")
    import torchvision.datasets

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    cls_name, kwargs = DOWNLOADABLE[info.name]
    getattr(torchvision.datasets, cls_name)(str(root), download=True, **kwargs)
    return {split: len(info.load(root, split, verify=verify)) for split in info.split_sizes}


def ensure_dataset(info: DatasetInfo, root: str | os.PathLike, verify: Verify = "error",
                   log=print) -> None:  # noqa: ANN001 - any print-like callable
    """Download ``info`` into ``root`` unless its marker files are already there; concurrent callers (ranks of
    several nodes sharing ``root``) are serialised by a lock file ``<root>.lock``: one downloads, the others wait and
    find the files."""
    from impulsevit.data.storage.locking import file_lock

    root = Path(root)
    if _present(info, root):
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(root.with_name(root.name + ".lock"), what=f"download of {info.name} into {root}", log=log):
        if _present(info, root):
            return
        log(f"[impulsevit] downloading {info.name} into {root} (torchvision.datasets)")
        download(info.name, root, verify=verify)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="impulsevit download", allow_abbrev=False,
                                description="Fetch a public dataset (torchvision.datasets' URLs and checksums) into "
                                            "the layout impulsevit reads.",
                                epilog=f"downloadable: {', '.join(DOWNLOADABLE)}; imagenet and imagenet21k print "
                                       "what to obtain by hand")
    p.add_argument("name", help="registry name, e.g. cifar10")
    p.add_argument("root", help="folder to download into (pass it as data.init_args.root)")
    p.add_argument("--verify", choices=["error", "warn", "off"], default="error",
                   help="counts that differ from the published ones are an error (default), a warning, or not checked")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``impulsevit download``; 0 done, 1 download or check failed, 2 usage / manual download."""
    args = _parser().parse_args(argv)
    try:
        counts = download(args.name, args.root, verify=args.verify)
    except ManualDownloadError as exc:
        print(f"impulsevit download: {exc}", file=sys.stderr)
        return 2
    except (KeyError, ValueError) as exc:
        print(f"impulsevit download: error: {exc}", file=sys.stderr)
        return 1 if type(exc).__name__ == "DatasetMismatchError" else 2
    except (OSError, RuntimeError) as exc:  # network errors, checksum mismatches (torchvision raises RuntimeError)
        print(f"impulsevit download: error: {args.name} into {args.root}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    info = get_dataset(args.name)
    listing = ", ".join(f"{split} {n:,}" for split, n in counts.items())
    print(f"{info.name} is in {Path(args.root).resolve()} ({listing} images); train with "
          f"--data.init_args.dataset={info.name} --data.init_args.root={Path(args.root).resolve()}")
    return 0
