"""Datamodules: synthetic (tests), and the dataset registry with FFCV and torchvision backends.

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
]

_WHERE = {
    "AugmentConfig": "impulsevit.data.config",
    "StorageConfig": "impulsevit.data.config",
    "BaseImageDataModule": "impulsevit.data.base",
    "SyntheticDataModule": "impulsevit.data.synthetic",
    "ImageDataModule": "impulsevit.data.datamodule",
    "DeviceAugment": "impulsevit.data.augment",
    "DatasetInfo": "impulsevit.data.registry",
    "DatasetMismatchError": "impulsevit.data.registry",
    "get_dataset": "impulsevit.data.registry",
    "list_datasets": "impulsevit.data.registry",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'impulsevit.data' has no attribute {name!r}")
