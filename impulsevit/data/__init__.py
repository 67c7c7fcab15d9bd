"""Datamodules: synthetic (tests), and the dataset registry with FFCV and torchvision backends; ``register_dataset``
adds a dataset (:mod:`impulsevit.data.sources.registry`).

Names are imported lazily so that ``impulsevit convert`` and the registry do not pull in Lightning.
"""

from importlib import import_module

__all__ = [
    "AugmentConfig",
    "BaseImageDataModule",
    "DatasetInfo",
    "DatasetMismatchError",
    "DeviceAugment",
    "ImageDataModule",
    "StorageConfig",
    "SyntheticDataModule",
    "get_dataset",
    "list_datasets",
    "register_dataset",
]

_WHERE = {
    "AugmentConfig": "impulsevit.data.loading.config",
    "StorageConfig": "impulsevit.data.loading.config",
    "BaseImageDataModule": "impulsevit.data.loading.base",
    "SyntheticDataModule": "impulsevit.data.loading.synthetic",
    "ImageDataModule": "impulsevit.data.loading.datamodule",
    "DeviceAugment": "impulsevit.data.augment.device",
    "DatasetInfo": "impulsevit.data.sources.registry",
    "DatasetMismatchError": "impulsevit.data.sources.registry",
    "get_dataset": "impulsevit.data.sources.registry",
    "list_datasets": "impulsevit.data.sources.registry",
    "register_dataset": "impulsevit.data.sources.registry",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'impulsevit.data' has no attribute {name!r}")
