"""The images a datamodule feeds the model, as a PNG grid and a tensor file: what ``impulsevit data preview``
(:mod:`impulsevit.cli.data_preview`, which builds the datamodule ``impulsevit fit`` would build) writes.

Given a datamodule, everything runs on the CPU in this process, and the datamodule does what training does, without a
trainer: ``prepare_data`` (FFCV: converts the split to its cached ``.beton`` when
needed), its real loader for the split at an explicit position (epoch 0, rank 0 of 1:
:meth:`~impulsevit.data.loading.base.BaseImageDataModule.loader`; the recipe's backend, crop, flip, interpolation and
worker count; batches of ``N``), and its ``model_input`` for training (``train``, keyed by the batch's position in
epoch 0 as in a fit) or evaluation (``val``), so the on-device augmentation of the datamodule (RandAugment / colour
jitter / random erasing) is included for ``train``.
Mixup / CutMix are not: they belong to the LightningModule and mix labels, which are kept as class indices here.

Outputs, for ``S`` = the recipe's ``image_size``:

- ``DIR/<split>.pt``: ``{"images": float32 (N, 3, S, S) in [0, 1], "labels": int64 (N,), "paths": list of N
  (source file, or None for in-memory datasets), "source_hw": int64 (N, 2), "stored_hw": int64 (N, 2), "indices":
  int64 (N,) (position in the split's source), "split", "backend", "mean", "std"}``. ``images`` is the model input
  with the normalisation undone (``x · std + mean``), clipped to [0, 1] (random erasing writes normal noise in
  normalised units, which may fall outside); ``stored_hw`` is the (height, width) stored in the ``.beton`` (the
  source size on the torchvision backend).
- ``DIR/<split>.png``: the same images as a grid (``torchvision.utils.make_grid``, ``ceil(sqrt(N))`` per row), small
  images enlarged to at least 112 px a tile (nearest neighbour), each with its class name underneath.

``val`` keeps the split's order (the first ``N`` samples: for an ImageFolder, sorted classes then sorted files);
``train`` shows the first ``N`` samples of epoch 0 in the loader's shuffled order.

Both files are written atomically; an existing ``DIR/<split>.pt`` or ``.png`` is replaced only with ``--overwrite``,
and a ``DIR`` that is a file is refused — checked before any work (:func:`impulsevit.io.claim_output`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["claim_preview", "class_names", "collect", "preview_paths", "render_grid", "write_preview"]


def _epoch_order(loader: Any, n: int) -> np.ndarray:
    """Positions (in the loader's dataset / ``.beton``) of the epoch's samples, in the order the loader yields them."""
    inner = getattr(loader, "loader", None)
    if inner is not None and hasattr(inner, "traversal_order"):  # FFCVLoader around an ffcv Loader
        return np.asarray(inner.traversal_order.sample_order(loader.epoch), dtype=np.int64)
    sampler = getattr(loader, "sampler", None)
    if hasattr(sampler, "plan"):  # EpochSampler: yields SampleKey(index, epoch, position); plan() holds the indices
        return np.asarray(sampler.plan()[0], dtype=np.int64)
    if sampler is not None and not isinstance(sampler, torch.utils.data.SequentialSampler):
        return np.asarray(list(iter(sampler)), dtype=np.int64)
    return np.arange(n, dtype=np.int64)


def _beton_sources(dm: Any, split: str, beton: Path) -> tuple[Any, np.ndarray | None, np.ndarray]:
    """(source or None, beton position → source index, stored (h, w) per beton sample) of an FFCV split."""
    from ffcv.reader import Reader

    from impulsevit.data.sources.registry import get_dataset
    from impulsevit.data.storage.convert import subset_indices
    from impulsevit.data.storage.manifest import read_manifest

    reader = Reader(str(beton))
    names = list(reader.handlers)
    meta = reader.metadata[f"f{names.index('image')}"]
    stored = np.stack([meta["height"], meta["width"]], axis=1).astype(np.int64)
    manifest = read_manifest(beton) or {}
    request = manifest.get("request") or {}
    source = None
    if beton not in set(getattr(dm, "betons", {}).values()):
        source = dm.load_source(split)  # the datamodule converted exactly this source
    elif request.get("dataset") and request.get("split"):
        info = get_dataset(request["dataset"])
        root = request.get("root")
        source = info.load(None if root in (None, "None") else root, request["split"], verify="off")
        sub = subset_indices(len(source), request.get("subset"))
        source = source.subset(sub) if sub is not None else source
    if source is None:
        return None, None, stored
    skipped = {p.get("path") for p in manifest.get("skipped", [])}
    good = np.asarray([i for i in range(len(source)) if source.describe(i) not in skipped], dtype=np.int64)
    if len(good) != len(stored):
        raise ValueError(f"{beton}: holds {len(stored)} images but its source ({request or split}) now has "
                         f"{len(good)} readable ones; reconvert it (`impulsevit convert ... --force`)")
    return source, good, stored


def collect(dm: Any, split: str, num: int) -> dict[str, Any]:
    """The first ``num`` samples of ``split`` (``train`` or ``val``) as the model receives them; see the module
    docstring for the keys. ``dm`` is an un-set-up :class:`~impulsevit.data.loading.datamodule.ImageDataModule` (or any
    :class:`~impulsevit.data.loading.base.BaseImageDataModule`: its ``loader`` and ``model_input`` are used, at
    epoch 0, rank 0 of 1, without a trainer); its ``batch_size`` is set to ``num``."""
    if split not in ("train", "val"):
        raise ValueError(f"--split must be 'train' or 'val', got {split!r}")
    if num < 1:
        raise ValueError(f"--num must be >= 1, got {num}")
    from impulsevit.data.loading.position import LoaderPosition

    train = split == "train"
    dm.batch_size = int(num)
    dm.prepare_data()
    dm.setup("fit" if train else "validate")
    position = LoaderPosition(epoch=0, batches_done=0, rank=0, world_size=1)
    loader = dm.loader(train, position)
    backend = getattr(dm, "backend", None)
    split_name = (dm.train_split if train else dm.val_split) if hasattr(dm, "train_split") else split
    if backend == "ffcv":
        source, beton_to_source, stored = _beton_sources(dm, split_name, dm.data_backend.beton_path(split_name))
        n_items = len(stored)
    else:
        # the torchvision backend's dataset holds its source; an in-memory dataset has none
        source = getattr(getattr(loader, "dataset", None), "source", None)
        beton_to_source, stored = None, None
        # No source (an in-memory dataset such as the synthetic one): the loader's dataset is the split itself.
        n_items = len(source) if source is not None else len(loader.dataset)
    order = _epoch_order(loader, n_items)
    if n_items and num > n_items:
        raise ValueError(f"--num {num} is larger than the {split} split ({n_items} images)")

    images, labels = [], []
    with torch.no_grad():
        for batch in loader:
            x, y = dm.model_input((batch[0], batch[1]), train=train, position=position)
            position = position.next_batch()
            images.append(x.float())
            labels.append(y.long())
            if sum(len(b) for b in labels) >= num:
                break
    model_input = torch.cat(images)[:num]
    label_t = torch.cat(labels)[:num]
    if len(label_t) < num:
        raise ValueError(f"the {split} loader gave {len(label_t)} images, fewer than --num {num}")
    mean = torch.tensor(dm.mean, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(dm.std, dtype=torch.float32).view(1, 3, 1, 1)
    pixels = (model_input * std + mean).clamp_(0.0, 1.0).contiguous()

    positions = order[:num] if len(order) else np.arange(num)
    if backend == "ffcv":
        stored_hw = stored[positions]
        indices = beton_to_source[positions] if beton_to_source is not None else positions
    else:
        stored_hw, indices = None, positions
    paths: list[str | None] = [None] * num
    if source is not None:
        expected = np.asarray(source.labels)[indices]
        if not np.array_equal(expected, label_t.numpy()):
            raise RuntimeError(f"preview: the loader's labels do not follow the expected {split} order (a loader "
                               f"order this command does not know); first labels {label_t[:8].tolist()} vs "
                               f"{expected[:8].tolist()}")
        source_hw = np.asarray([source.image_size(int(i)) for i in indices], dtype=np.int64).reshape(num, 2)
        if hasattr(source, "paths"):
            paths = [source.paths[int(i)] for i in indices]
    elif stored_hw is not None:
        source_hw = stored_hw
    else:  # in-memory dataset of (image (3, H, W), label) samples: its tensors are the source
        samples = [loader.dataset[int(i)] for i in indices]
        expected = np.asarray([int(s[1]) for s in samples], dtype=np.int64)
        if not np.array_equal(expected, label_t.numpy()):
            raise RuntimeError(f"preview: the loader's labels do not follow the expected {split} order; first "
                               f"labels {label_t[:8].tolist()} vs {expected[:8].tolist()}")
        source_hw = np.asarray([tuple(s[0].shape[-2:]) for s in samples], dtype=np.int64).reshape(num, 2)
    if stored_hw is None:
        stored_hw = source_hw
    return {
        "images": pixels,
        "labels": label_t,
        "paths": paths,
        "source_hw": torch.as_tensor(np.asarray(source_hw, dtype=np.int64)),
        "stored_hw": torch.as_tensor(np.asarray(stored_hw, dtype=np.int64)),
        "indices": torch.as_tensor(np.asarray(indices, dtype=np.int64)),
        "split": split,
        "backend": backend,
        "mean": tuple(dm.mean),
        "std": tuple(dm.std),
    }


MIN_TILE = 112  # px: smaller images are enlarged (nearest neighbour, integer factor) to at least this in the PNG


def render_grid(images: torch.Tensor, labels: torch.Tensor, classes: list[str] | None = None) -> Any:
    """The PNG grid as a PIL image: ``images`` float (N, 3, S, S) in [0, 1], ``ceil(sqrt(N))`` per row, each tile
    enlarged by the integer factor ``ceil(MIN_TILE / S)`` (nearest neighbour: a 28 px image becomes 112 px, its pixels
    kept square) with its class name (``classes[label]``, else the label number) written under it."""
    from PIL import Image, ImageDraw, ImageFont
    from torchvision.utils import make_grid

    scale = max(1, math.ceil(MIN_TILE / max(1, images.shape[-1])))
    big = images.repeat_interleave(scale, dim=-2).repeat_interleave(scale, dim=-1) if scale > 1 else images
    nrow = max(1, math.ceil(math.sqrt(len(big))))
    pad, text_h = 2, 14
    grid = make_grid(big, nrow=nrow, padding=pad)
    arr = (grid.clamp(0, 1).mul(255).round().byte().permute(1, 2, 0).numpy())
    tile_h, tile_w = big.shape[-2] + pad, big.shape[-1] + pad
    rows = math.ceil(len(big) / nrow)
    canvas = Image.new("RGB", (arr.shape[1], rows * (tile_h + text_h) + pad), (255, 255, 255))
    font = ImageFont.load_default()
    draw = ImageDraw.Draw(canvas)
    for i, label in enumerate(labels.tolist()):
        r, c = divmod(i, nrow)
        tile = Image.fromarray(arr[r * tile_h:(r + 1) * tile_h + pad, c * tile_w:(c + 1) * tile_w + pad])
        y = r * (tile_h + text_h)
        canvas.paste(tile, (c * tile_w, y))
        name = classes[label] if classes is not None and 0 <= label < len(classes) else str(label)
        draw.text((c * tile_w + pad, y + tile_h + pad - 1), name[: max(1, tile_w // 6)], fill=(0, 0, 0), font=font)
    return canvas


def preview_paths(out: str | Path, split: str) -> tuple[Path, Path]:
    """``(<out>/<split>.pt, <out>/<split>.png)``."""
    return Path(out) / f"{split}.pt", Path(out) / f"{split}.png"


def claim_preview(out: str | Path, split: str, overwrite: bool) -> None:
    """Before any work: ``out`` is a folder (or nothing yet) and its two files are free, or ``overwrite``.

    Raises:
        ConfigError: ``out`` is a file, or a file of the preview exists without ``overwrite`` (one line).
    """
    from impulsevit.io import claim_output

    claim_output(out, False, "into", what="--out")
    for path in preview_paths(out, split):
        claim_output(path, overwrite, "file", what="--out")


def write_preview(result: dict[str, Any], out: str | Path, classes: list[str] | None = None) -> tuple[Path, Path]:
    """Write ``<out>/<split>.pt`` and ``<out>/<split>.png`` (:func:`render_grid`, labelled with ``classes``), each
    atomically (:func:`impulsevit.io.atomic_path`); returns both paths. The caller checks them first
    (:func:`claim_preview`)."""
    from impulsevit.io import atomic_path

    pt, png = preview_paths(out, result["split"])
    with atomic_path(pt) as tmp:
        torch.save(result, tmp)
    grid = render_grid(result["images"], result["labels"], classes)
    with atomic_path(png) as tmp:
        grid.save(tmp, format="PNG")
    return pt, png


def class_names(dm: Any, split: str) -> list[str] | None:
    """The class names of the previewed split (after :func:`collect` set the datamodule up for it): the ``.beton``
    manifest on the ffcv backend (None when it holds none), else the datamodule's ``class_names`` (the split's source
    classes on the torchvision backend; synthetic data's own)."""
    if getattr(dm, "backend", None) == "ffcv":
        from impulsevit.data.storage.manifest import read_manifest

        name = dm.train_split if split == "train" else dm.val_split
        manifest = read_manifest(dm.data_backend.beton_path(name), check_size=False) or {}
        return list(manifest["classes"]) if manifest.get("classes") else None
    names = getattr(dm, "class_names", None)
    return list(names) if names else None
