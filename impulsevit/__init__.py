"""impulsevit: study how initialization shapes vision transformers, with Lightning + timm."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # ImageClassifier pulls in Lightning; keep `import impulsevit.init` light.
    if name == "ImageClassifier":
        from impulsevit.module import ImageClassifier

        return ImageClassifier
    raise AttributeError(name)
