"""What the training side reads from the trainer's datamodule, read in one place: :func:`data_info`."""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L

__all__ = ["DataInfo", "data_info"]


@dataclass(frozen=True)
class DataInfo:
    """The data's ``image_size`` (pixels, square), ``num_classes`` and per-device ``batch_size``; ``None`` when the
    trainer has no datamodule (dataloaders passed to ``fit`` directly) or the datamodule does not say."""

    image_size: int | None = None
    num_classes: int | None = None
    batch_size: int | None = None


def data_info(trainer: L.Trainer | None) -> DataInfo:
    """:class:`DataInfo` of ``trainer.datamodule`` (any ``LightningDataModule``; impulsevit's
    ``BaseImageDataModule`` has all three attributes)."""
    dm = getattr(trainer, "datamodule", None) if trainer is not None else None

    def read(name: str) -> int | None:
        value = getattr(dm, name, None)
        return None if value is None else int(value)

    return DataInfo(image_size=read("image_size"), num_classes=read("num_classes"), batch_size=read("batch_size"))
