"""Storage presets of ``.beton`` files: how :func:`impulsevit.data.storage.convert.convert_split` stores each image.

``raw`` stores pixels unchanged (small images: CIFAR, MNIST, STL-10). ``short256`` (the default for
large-image datasets and the preset of the ImageNet / IN-21K / Food-101 / Flowers / Pets recipes) resizes images whose
shorter side exceeds 256 px to shorter side 256 (PIL bicubic, antialiased — the resize timm's eval transform applies
for ``crop_pct = 0.875`` at 224 px, so the stored image *is* that resize and the eval crop is never upsampled), and
stores half the images as JPEG (quality 90) and half raw (``proportion`` mode, probability 0.5, after
ffcv-imagenet's ``write_imagenet.sh``); ``short320`` / ``short384`` keep more detail for small random crops (and
larger eval sizes) at a higher decode cost. ``res256`` / ``res400`` / ``res512`` cap the *longer* side instead
(FFCV's ``max_resolution``, OpenCV area filter): ``res256`` stores a 4:3 photo at 256 × 192, whose 0.875 eval crop
(168 px) is upsampled to 224 — kept for comparison (``benchmarks/loader_speed.py``), not for faithful recipes.
``raw256`` caps the longer side at 256 and stores every image raw.
``impulsevit convert``'s ``--write-mode`` / ``--max-resolution`` / ``--jpeg-quality`` / ``--jpeg-proportion`` override
single fields (the preset is then named ``<name>+custom``).

Whatever the preset, a split whose stored images all fit in ``SMALL_IMAGE_SIDE`` px is written raw
(:func:`storage_preset`). Sizes are ``(width, height)`` in pixels throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

__all__ = ["PRESETS", "SMALL_IMAGE_SIDE", "Preset", "default_preset", "storage_preset"]


@dataclass(frozen=True)
class Preset:
    """How images are stored: ``write_mode`` raw | jpg | proportion | smart (FFCV's ``RGBImageField`` modes),
    ``max_resolution`` caps the longer side in pixels (None: keep; FFCV's area resize), ``max_short_side`` caps the
    shorter side (None: keep; PIL bicubic, antialiased), JPEG ``jpeg_quality`` and, for ``proportion``, the
    probability ``jpeg_proportion`` that an image is stored as JPEG."""

    name: str
    write_mode: str = "raw"
    max_resolution: int | None = None
    jpeg_quality: int = 90
    jpeg_proportion: float = 0.5
    max_short_side: int | None = None

    def stored_size(self, width: int, height: int) -> tuple[int, int]:
        """``(width, height)`` an image of that size is stored at."""
        if self.max_short_side is not None and min(width, height) > self.max_short_side:
            s = self.max_short_side
            width, height = (s, round(height * s / width)) if width <= height else (round(width * s / height), s)
        if self.max_resolution is not None and max(width, height) > self.max_resolution:
            ratio = self.max_resolution / max(width, height)  # FFCV's resizer: truncating
            width, height = int(ratio * width), int(ratio * height)
        return width, height

    def load_hint(self, width: int, height: int) -> int | None:
        """The ``max_side`` hint for :meth:`ImageSource.load` (JPEG DCT scaling) that keeps at least the stored size."""
        if self.max_short_side is not None and min(width, height) > self.max_short_side:
            return max(self.stored_size(width, height))
        return self.max_resolution

    def shrink(self, image: np.ndarray) -> np.ndarray:
        """Apply ``max_short_side`` to an ``(H, W, 3)`` uint8 image (the longer-side cap is FFCV's field's job)."""
        height, width = image.shape[:2]
        if self.max_short_side is None or min(width, height) <= self.max_short_side:
            return image
        from PIL import Image

        w = self.max_short_side if width <= height else round(width * self.max_short_side / height)
        h = self.max_short_side if height < width else round(height * self.max_short_side / width)
        return np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.BICUBIC))

    def field(self):  # noqa: ANN201 - ffcv is an optional import
        from ffcv.fields import RGBImageField

        return RGBImageField(write_mode=self.write_mode, max_resolution=self.max_resolution,
                             jpeg_quality=self.jpeg_quality, compress_probability=self.jpeg_proportion)


PRESETS: dict[str, Preset] = {
    "raw": Preset("raw"),
    "raw256": Preset("raw256", "raw", 256),
    "res256": Preset("res256", "proportion", 256),
    "res400": Preset("res400", "proportion", 400),
    "res512": Preset("res512", "proportion", 512),
    "short256": Preset("short256", "proportion", max_short_side=256),
    "short320": Preset("short320", "proportion", max_short_side=320),
    "short384": Preset("short384", "proportion", max_short_side=384),
}


SMALL_IMAGE_SIDE = 64
"""Splits whose stored images all fit in ``SMALL_IMAGE_SIDE × SMALL_IMAGE_SIDE`` px are stored raw by every preset."""


def storage_preset(preset: Preset, sizes: np.ndarray) -> Preset:
    """The preset actually written for images of ``sizes`` (``(N, 2)`` width, height): ``preset`` itself, or its raw
    variant when it would JPEG-compress and every stored image fits in ``SMALL_IMAGE_SIDE`` px (CIFAR-like data in an
    ImageFolder: at 32 px a JPEG saves a few hundred bytes and costs ~30 dB of fidelity)."""
    if preset.write_mode == "raw" or len(sizes) == 0:
        return preset
    stored = max(max(preset.stored_size(int(w), int(h))) for w, h in sizes)
    return replace(preset, write_mode="raw") if stored <= SMALL_IMAGE_SIDE else preset


def default_preset(small: bool) -> Preset:
    """The preset used when none is named: ``raw`` for small-image datasets, ``short256`` otherwise."""
    return PRESETS["raw" if small else "short256"]
