"""impulsevit: study how initialization shapes vision transformers, with Lightning + timm.

The package's public face: ``impulsevit.ImageClassifier`` (imported lazily), ``__version__``, and the module paths
of before the regroup into layer folders (``impulsevit.module``, ``impulsevit.config``, ...), which resolve to the
modules at their new paths (:mod:`impulsevit._aliases`)."""

from impulsevit import _aliases
from impulsevit._version import __version__

__all__ = ["ImageClassifier", "__version__"]

_aliases.install()


def __getattr__(name: str):
    # ImageClassifier pulls in Lightning; keep `import impulsevit.init` light.
    if name == "ImageClassifier":
        from impulsevit.training.module import ImageClassifier

        return ImageClassifier
    raise AttributeError(name)
