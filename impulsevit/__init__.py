"""impulsevit: study how initialization shapes vision transformers, with Lightning + timm.

The package's public face: ``impulsevit.ImageClassifier`` (imported lazily) and ``__version__``. (The module paths of
before the regroup into layer folders are read only where stored names are: :mod:`impulsevit._aliases`.)"""

from impulsevit._version import __version__

__all__ = ["ImageClassifier", "__version__"]


def __getattr__(name: str):
    # ImageClassifier pulls in Lightning; keep `import impulsevit.init` light.
    if name == "ImageClassifier":
        from impulsevit.training.module import ImageClassifier

        return ImageClassifier
    raise AttributeError(name)
