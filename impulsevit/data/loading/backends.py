"""The two loading backends of :class:`~impulsevit.data.loading.datamodule.ImageDataModule` behind one interface.

- :class:`DataSpec`: the resolved data settings of a run (dataset, splits, subsets, sizes, augmentation, storage),
  built once from the datamodule's arguments by :func:`resolve_spec`, which also checks them. Its
  :meth:`~DataSpec.subset` is the one place a split's subset size is looked up.
- :class:`Backend`: what the datamodule asks of a backend — prepare the files (:meth:`Backend.prepare`), read the
  splits (:meth:`Backend.setup`), and build a training or evaluation loader at an explicit
  :class:`~impulsevit.data.loading.position.LoaderPosition` (:meth:`Backend.train_loader`,
  :meth:`Backend.eval_loader`). A backend never reads a Lightning ``Trainer``.
- The three implementations: :class:`~impulsevit.data.loading.torchvision_backend.TorchvisionBackend` (timm's
  transforms in ``DataLoader`` workers), :class:`~impulsevit.data.loading.ffcv_backend.FFCVBackend` (``.beton``
  files read by FFCV) and :class:`~impulsevit.data.loading.litdata_backend.LitDataBackend` (LitData shard sets,
  local or in an object store, with the torchvision backend's transforms and orders). The datamodule picks one at
  construction.

All backends' loaders yield ``(images uint8 (B, 3, S, S), labels int64 (B,))`` (with ``resample_on='device'`` the
FFCV training loader yields canvas batches ``(B, 3, K + 1, K)``); training loaders are stateful
(``state_dict`` / ``load_state_dict``, :mod:`impulsevit.data.loading.sampling`), drop the last partial batch and
follow :func:`~impulsevit.data.loading.sampling.epoch_sequence` of (seed, epoch, rank, world size).
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from impulsevit.data.loading.base import check_num_workers, check_train_batches
from impulsevit.data.loading.config import AugmentConfig, StorageConfig
from impulsevit.data.loading.ffcv_loader import ffcv_available
from impulsevit.data.loading.position import LoaderPosition
from impulsevit.data.sources.image_source import ImageSource
from impulsevit.data.sources.registry import DatasetInfo, Verify, cache_home, get_dataset
from impulsevit.data.storage.convert import subset_indices
from impulsevit.data.storage.manifest import beton_num_classes
from impulsevit.data.storage.presets import PRESETS, Preset, default_preset
from impulsevit.errors import ConfigError, DataError, MissingExtraError, UserError, missing_extra

__all__ = ["Backend", "BackendChoice", "BackendName", "DataOrder", "DataSpec", "ResampleOn", "check_train_split",
           "default_cache_dir", "resolve_backend", "resolve_spec"]

log = logging.getLogger("impulsevit")

BackendName = Literal["ffcv", "torchvision", "litdata"]
BackendChoice = Literal["auto", "ffcv", "torchvision", "litdata"]
"""What a recipe may say: a backend, or ``auto`` (:func:`resolve_backend`)."""
ResampleOn = Literal["workers", "device"]
DataOrder = Literal["auto", "global", "block"]


def default_cache_dir() -> Path:
    """impulsevit's cache (:func:`~impulsevit.data.sources.registry.cache_home`: ``$IMPULSEVIT_CACHE``, else
    ``$XDG_CACHE_HOME/impulsevit`` or ``~/.cache/impulsevit``); ``.beton`` files go to its ``ffcv/`` sub-folder."""
    return cache_home()


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """The resolved data settings the backends read (see
    :class:`~impulsevit.data.loading.datamodule.ImageDataModule` for each argument). ``root`` is the dataset folder
    after ``download``'s default (litdata: the shard sets' folder or URL), ``train_split`` / ``val_split`` the
    registry's defaults when not given, ``mean`` / ``std`` the run's statistics (0–1 scale), ``num_classes`` the
    class count (from a given ``.beton``'s or the training shard set's manifest, or the data tree when the registry
    has none), ``betons`` the given ``.beton`` files by split (empty: converted into ``cache_dir``, which is also
    where the litdata backend caches remote chunks), ``explicit_norm`` whether ``mean`` / ``std`` were given,
    ``download`` whether ``prepare_data`` fetches a missing dataset into ``root`` (never for a shard set or a
    dataset without a download function). The
    batch size is not part of it: it is passed to each loader (callers such as ``impulsevit data preview`` change it
    after construction)."""

    info: DatasetInfo
    root: str | None
    backend: BackendName
    image_size: int
    num_workers: int
    crop_pct: float
    interpolation: str
    train_subset: int | None
    val_subset: int | None
    train_split: str
    val_split: str
    cache_dir: Path
    seed: int
    verify: Verify
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    num_classes: int
    augment: AugmentConfig
    storage: StorageConfig
    resample_on: ResampleOn
    preset: Preset
    betons: dict[str, Path]
    explicit_norm: bool
    download: bool = False
    order: DataOrder = "global"

    def subset(self, split: str) -> int | None:
        """The subset size of ``split``: ``train_subset`` for the training split, ``val_subset`` for any other."""
        return self.train_subset if split == self.train_split else self.val_subset

    def splits(self) -> list[str]:
        """The training and validation split names, once each (they may be the same split)."""
        return list(dict.fromkeys((self.train_split, self.val_split)))

    def load_source(self, split: str) -> ImageSource:
        """The (subset of the) split as an :class:`ImageSource`.

        Raises:
            DataError: the split cannot be read from ``root`` (missing files, no images, other counts than the
                published dataset); the message names the dataset, split and path. ConfigError: the split does not
                fit the configuration (e.g. a class folder the training split lacks), with the same prefix.
        """
        try:
            source = self.info.load(self.root, split, verify=self.verify)
        except (FileNotFoundError, NotADirectoryError, ValueError) as e:
            kind = type(e) if isinstance(e, UserError) else DataError  # a ConfigError keeps its exit status (2)
            raise kind(f"dataset {self.info.name!r}, split {split!r}: {e}") from e
        sub = subset_indices(len(source), self.subset(split))
        return source.subset(sub) if sub is not None else source

    def split_size(self, split: str) -> int:
        """Images in ``split`` after the subset: the published count when the registry has one, else listed."""
        k = self.subset(split)
        published = self.info.split_sizes.get(split) or 0
        n = published if published > 0 else len(self.info.load(self.root, split, verify="off"))
        return min(n, k) if k else n


def resolve_backend(backend: str, *, needs_ffcv: str = "") -> BackendName:
    """The backend ``backend`` names, checked against what is installed.

    ``auto`` (the datamodule's and the recipes' default) is ``ffcv`` when FFCV imports and ``torchvision`` otherwise,
    with one log line saying so and naming the extra: a ``pip install impulsevit`` without the ``ffcv`` extra (FFCV
    builds from source against OpenCV and libjpeg-turbo) trains every recipe on timm's transforms, as a timm user
    expects, instead of stopping. ``needs_ffcv`` names a setting that only the FFCV backend has (``resample_on:
    device``, a given ``.beton``): ``auto`` then requires FFCV. ``ffcv`` is an explicit request and is refused without
    FFCV (bit-exact comparisons pin the backend).

    Raises:
        ConfigError: an unknown name.
        MissingExtraError: ``ffcv`` (or ``auto`` with ``needs_ffcv``) where FFCV is not installed; one line naming
            the extra to install.
    """
    if backend not in ("auto", "ffcv", "torchvision", "litdata"):
        raise ConfigError(f"data.backend must be 'auto', 'ffcv', 'torchvision' or 'litdata', got {backend!r}")
    if backend in ("torchvision", "litdata"):
        return backend
    if ffcv_available():
        return "ffcv"
    if backend == "auto" and not needs_ffcv:
        log.info("[impulsevit] data.backend auto: FFCV is not installed, using the torchvision backend "
                 "(pip install 'impulsevit[ffcv]' for .beton loading)")
        return "torchvision"
    why = f"data.backend={backend!r}" + (f" with {needs_ffcv}" if needs_ffcv else "")
    raise MissingExtraError(missing_extra("ffcv", needed_for=why) + "; or pass --data.init_args.backend=torchvision")


def resolve_spec(*, dataset: str, root: str | None, backend: str, image_size: int, num_workers: int,
                 crop_pct: float, interpolation: str, train_subset: int | None, val_subset: int | None,
                 train_split: str | None, val_split: str | None, cache_dir: str | None, seed: int, verify: Verify,
                 mean: tuple[float, float, float] | None, std: tuple[float, float, float] | None, download: bool,
                 augment: AugmentConfig, storage: StorageConfig, resample_on: str,
                 order: str | None = None) -> DataSpec:
    """Check the datamodule's arguments (the typed blocks already checked) and resolve them into a
    :class:`DataSpec`, before any file is read or written (only a given ``.beton``'s manifest and, for a dataset
    without a fixed class count, the class folders under ``root`` are read).

    Raises:
        ConfigError: an argument is out of range or contradicts another (one line naming the key).
        MissingExtraError: the ffcv backend is asked for without the ffcv package (:func:`resolve_backend`).
    """
    info = get_dataset(dataset)
    given_root = root
    if root is None and info.needs_root:  # the system copy, else the user's data home (DatasetInfo.default_location)
        where = info.default_location()
        root = str(where) if where is not None else None
    only_ffcv = ("data.resample_on='device'" if resample_on == "device" and backend != "litdata" else
                 "data.storage.train_beton" if storage.train_beton is not None else "")
    backend = resolve_backend(backend, needs_ffcv=only_ffcv)
    if backend == "litdata":
        from impulsevit.data.storage.shards import litdata_available

        if not litdata_available():
            raise MissingExtraError(missing_extra("litdata", needed_for="data.backend='litdata'"))
        if given_root is None:
            raise ConfigError("backend='litdata' reads a shard set written by `impulsevit convert ... --format "
                              "litdata`: set data.root to its folder or s3:// URL")
        download = False  # the recipes' data.download (fetch the raw dataset) does not apply to a shard set
    # download: true is "fetch when missing and fetchable": a dataset without a download function (imagefolder,
    # digits, ImageNet) is read from its root as with download: false, so the root is checked below, before any work
    download = bool(download) and info.download is not None
    if backend == "ffcv" and interpolation not in ("bicubic", "bilinear"):
        raise ConfigError(f"interpolation {interpolation!r} is not supported on the ffcv backend (bicubic or "
                          f"bilinear); use backend='torchvision' for other filters")
    if resample_on not in ("workers", "device"):
        raise ConfigError(f"data.resample_on must be 'workers' or 'device', got {resample_on!r}")
    if resample_on == "device" and backend not in ("ffcv", "litdata"):
        raise ConfigError(f"data.resample_on='device' needs backend='ffcv' or 'litdata' (the torchvision backend "
                          f"resizes in its workers), got backend={backend!r}")
    if order is not None and order not in ("auto", "global", "block"):
        raise ConfigError(f"data.order must be 'auto', 'global' or 'block', got {order!r}")
    if order in (None, "auto"):  # block on a litdata set written shuffled (LitDataBackend.check_given), else global
        order = "auto" if backend == "litdata" and augment.repeated_aug == 1 else "global"
    if order == "block" and backend != "litdata":
        raise ConfigError(f"data.order='block' reads a shard set's chunks a block at a time: it needs "
                          f"backend='litdata', got backend={backend!r} (use data.order=global)")
    if order == "block" and augment.repeated_aug > 1:
        raise ConfigError(f"data.order='block' does not support data.augment.repeated_aug > 1 (got "
                          f"{augment.repeated_aug}); use data.order=global with repeated augmentation")
    if not 0 < crop_pct <= 1:
        raise ConfigError(f"data.crop_pct must be in (0, 1], got {crop_pct}")
    if cache_dir and Path(cache_dir).exists() and not Path(cache_dir).is_dir():
        raise ConfigError(f"data.cache_dir {cache_dir} is a file, not a folder (expected a folder for the "
                          f"converted .beton files; give another path)")
    if given_root is None and root is not None and not download and storage.train_beton is None and \
            backend != "litdata" and not Path(root).is_dir():
        fetch = (f"pass --data.init_args.download=true to fetch it there (or `impulsevit download {info.name} DIR`), "
                 if info.download is not None else "")
        raise ConfigError(f"dataset {info.name!r} is not at {root} (the default, no data.root given): {fetch}or "
                          f"give its folder with --data.init_args.root=DIR")
    remote = backend == "litdata" and str(root).startswith("s3://")
    if root is not None and not download and storage.train_beton is None and not remote and not Path(root).is_dir():
        what = "is a file, not a folder" if Path(root).exists() else "does not exist"
        raise ConfigError(f"data.root {root} {what} (dataset {info.name!r}"
                          + (f"; expected {info.layout.format(root=root)})" if info.layout else ")"))
    num_classes = info.num_classes
    if storage.train_beton is not None:
        if backend != "ffcv":
            raise ConfigError("data.storage.train_beton/val_beton need backend='ffcv'")
        num_classes = beton_num_classes(storage.train_beton)
    elif backend == "litdata":  # the shard set's manifest (reading it finds a missing bucket / credentials first)
        from impulsevit.data.storage.objstore import join
        from impulsevit.data.storage.shards import read_shards_manifest

        where = join(str(root), train_split or info.train_split)
        manifest = read_shards_manifest(where)
        if manifest is None:
            raise ConfigError(f"data.root: no shard set at {where} (expected its impulsevit.manifest.json, written by "
                              f"`impulsevit convert ... --format litdata`)")
        num_classes = int(manifest["num_classes"])
    elif info.tree_classes is not None:  # the registration counts the classes of the tree (ImageFolder, IN-21K)
        if root is None and not num_classes:
            raise ConfigError(f"dataset={info.name!r} needs root"
                              + (f" ({info.layout.format(root='ROOT')})" if info.layout else ""))
        if root is not None:
            counted = info.tree_classes(Path(root), train_split or info.train_split, val_split or info.val_split)
            num_classes = num_classes if counted is None else counted
    train_split, val_split = train_split or info.train_split, val_split or info.val_split
    return DataSpec(
        info=info, root=root, backend=backend, image_size=int(image_size),  # type: ignore[arg-type]
        num_workers=check_num_workers(num_workers), crop_pct=float(crop_pct), interpolation=interpolation,
        train_subset=train_subset, val_subset=val_subset, train_split=train_split, val_split=val_split,
        cache_dir=Path(cache_dir) if cache_dir else default_cache_dir() / ("litdata" if backend == "litdata"
                                                                            else "ffcv"),
        seed=int(seed), verify=verify,
        mean=tuple(float(m) for m in (mean or info.mean)), std=tuple(float(s) for s in (std or info.std)),
        num_classes=num_classes, augment=augment, storage=storage, resample_on=resample_on,  # type: ignore[arg-type]
        preset=PRESETS[storage.preset] if storage.preset else default_preset(info.small),
        betons=({train_split: Path(storage.train_beton), val_split: Path(storage.val_beton)}
                if storage.train_beton else {}),
        explicit_norm=mean is not None or std is not None, download=bool(download),
        order=order)  # type: ignore[arg-type]


def check_train_split(spec: DataSpec, num_samples: int, batch_size: int, world_size: int) -> None:
    """:func:`~impulsevit.data.loading.base.check_train_batches` for the training split of ``spec``: the message
    names the split and dataset, a given ``train_beton`` or ``train_subset``, and the key that adds samples."""
    split, k = spec.train_split, spec.train_subset
    where = f" (data.storage.train_beton {spec.betons[split]})" if split in spec.betons else \
        f" (data.train_subset={k})" if k else ""
    check_train_batches(num_samples, batch_size, world_size, repeats=spec.augment.repeated_aug,
                        what=f"the training split {split!r} of dataset {spec.info.name!r}{where}",
                        more="raise data.train_subset" if k and split not in spec.betons
                        else "use more training images")


class Backend(abc.ABC):
    """One way of turning a :class:`DataSpec` into loaders. Subclasses hold no trainer: the loader position, the
    batch size and the device are passed in.

    Not supported: a position whose rank / world size differ from the default process group's on the ffcv backend
    (FFCV's loader shards evaluation by the process group itself, and the training order is built from
    :func:`~impulsevit.data.loading.position.dist_info`); :func:`~impulsevit.data.loading.position.loader_position`
    always gives the process group's.

    ``augments_on_device``: whether RandAugment / colour jitter are left to the device augmentation (the FFCV
    decoder does only crop and flip) or already ran in the loader (timm's transforms in the workers).
    """

    name: ClassVar[BackendName]
    augments_on_device: ClassVar[bool]

    def __init__(self, spec: DataSpec) -> None:
        self.spec = spec

    def prepare(self, world_size: int) -> None:  # noqa: B027 - optional step, nothing by default
        """Write what the loaders read (once per node, before :meth:`setup`), for a run of ``world_size``
        processes. Nothing by default."""

    @abc.abstractmethod
    def setup(self, stage: str | None, known_classes: list[str] | None) -> list[str] | None:
        """Open the splits ``stage`` needs (``fit``: train and val; others: val); returns the class names, index =
        label (``known_classes``, the datamodule's current ones, where the backend has nothing better)."""

    def check_given(self) -> None:  # noqa: B027 - optional check, nothing by default
        """Refuse stored data given to the run (ready-made files, a shard set) whose manifests contradict it, before
        anything is written (the datamodule calls it at construction). Nothing by default.

        Raises:
            ConfigError: one line naming each file, the field, its value and the run's.
        """

    def needs_setup(self, train: bool) -> bool:
        """Whether :meth:`setup` must run before a loader of that kind can be built (False by default)."""
        return False

    @abc.abstractmethod
    def train_loader(self, position: LoaderPosition, batch_size: int, device: torch.device | None = None) -> Any:
        """The stateful training loader of ``position.epoch`` for rank ``position.rank`` of
        ``position.world_size``, batches of ``batch_size`` (the last partial one dropped), placed on ``device``
        where the backend can (FFCV on CUDA); ``position.batches_done`` is not used (a resume goes through the
        loader's ``load_state_dict``).

        Raises:
            ConfigError: an epoch would have no training step (:func:`check_train_split`).
        """

    @abc.abstractmethod
    def eval_loader(self, position: LoaderPosition, batch_size: int, device: torch.device | None = None) -> Any:
        """The evaluation loader of the validation split, in the split's order (sharded by rank without shuffling
        when ``position.world_size > 1``), every sample once (the last batch may be partial)."""

    def train_samples(self) -> int | None:
        """Training images per epoch, known without converting or writing anything; None when the split cannot be
        read yet."""
        try:
            return self.spec.split_size(self.spec.train_split)
        except (OSError, ValueError, KeyError):
            return None

    def splits_to_convert(self) -> list[str]:
        """Splits whose stored form is still to be written by :meth:`prepare` (none by default)."""
        return []
