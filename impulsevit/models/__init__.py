"""Architectures timm lacks, registered with timm's model registry on import (``import impulsevit.models``).

- ``convmixer_cifar*``: ConvMixer configurations of the impulse papers (see :mod:`impulsevit.models.convmixer`).
"""

from impulsevit.models import convmixer

__all__ = ["convmixer"]
