"""Sphinx configuration of the impulsevit docs site: ``sphinx-build -W --keep-going -b html docs docs/_build/html``
(``pip install '.[docs]'``; ``tests/house/test_docs_site.py`` runs the same build and fails on any warning).

Why Sphinx: the docstrings already use Sphinx roles (``:class:``, ``:mod:``) and Google sections, which autodoc +
napoleon render as they are; the pages stay plain Markdown readable on the code host (MyST, through myst-nb, which also
renders ``tutorial.ipynb``); and it is what Lightning, PyTorch and torchvision document themselves with, so a
researcher finds the layout they know. myst-nb renders the notebook's stored outputs and never executes it here
(``nb_execution_mode = "off"``): the test suite executes it (``tests/house/test_tutorial.py``), so a build stays
fast and needs no kernel. The API reference names its entries one by one (``api.md``), with no autosummary of the
whole package: only the public API is documented, and the build takes seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document the checkout the docs sit in, not another installed copy

from impulsevit._version import __version__  # noqa: E402

project = "impulsevit"
author = "impulsevit contributors"
copyright = "impulsevit contributors; Apache License 2.0"  # noqa: A001 (Sphinx's name)
release = version = __version__

extensions = [
    "myst_nb",  # Markdown pages (myst-parser) and the tutorial notebook
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]

# Markdown: GitHub-style anchors for headings down to ###, so `page.md#a-heading` links work on the site and on the
# code host alike; `$…$` maths as method.md writes it.
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath", "colon_fence"]

# Notebooks: rendered with their stored outputs, never executed by the build.
nb_execution_mode = "off"

# API reference: Google sections, members in source order, type hints in the signature.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"

html_theme = "furo"
html_title = f"impulsevit {release}"
