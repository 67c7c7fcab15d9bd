"""Architectures timm lacks, registered with timm's model registry on import (``import impulsevit.models``).

- ``convmixer_cifar*``: ConvMixer configurations of the impulse papers (see :mod:`impulsevit.models.convmixer`).
- ``mixer_any``: MLP-Mixer with open sizes for small images (see :mod:`impulsevit.models.mixer`).
"""

from impulsevit.models import convmixer, mixer

__all__ = ["convmixer", "mixer"]
