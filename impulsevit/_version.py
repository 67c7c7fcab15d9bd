"""The package version, a leaf: read by the command line and the run record without importing the package's public
face (``impulsevit/__init__.py``, which sits above every layer)."""

__version__ = "0.1.0"
