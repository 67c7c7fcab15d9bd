"""Datamodules: synthetic (tests), and the dataset registry with FFCV and torchvision backends."""

from impulsevit.data.base import BaseImageDataModule
from impulsevit.data.synthetic import SyntheticDataModule

__all__ = ["BaseImageDataModule", "SyntheticDataModule"]
