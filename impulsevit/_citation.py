"""The paper this package implements, in one place: the exported model cards (:mod:`impulsevit.tools.export`) read it
here; ``CITATION.cff`` at the repository root states the same facts for GitHub's "Cite this repository"
(``tests/house/test_citation.py`` checks that the two agree). A leaf: no impulsevit imports."""

from __future__ import annotations

__all__ = ["ARXIV_ID", "AUTHORS", "BIBTEX", "LICENSE", "TITLE", "VENUE", "YEAR"]

TITLE = "Structured Initialization for Vision Transformers"
AUTHORS = (("Jianqiao", "Zheng"), ("Xueqian", "Li"), ("Hemanth", "Saratchandran"), ("Simon", "Lucey"))
"""(given names, family names) in the paper's order."""
VENUE = "NeurIPS 2025"
YEAR = 2025
ARXIV_ID = "2505.19985"
LICENSE = "Apache-2.0"
"""The package's licence (SPDX id), as setup.cfg and the LICENSE file state it."""

BIBTEX = """@inproceedings{zheng2025structured,
  title         = {Structured Initialization for Vision Transformers},
  author        = {Zheng, Jianqiao and Li, Xueqian and Saratchandran, Hemanth and Lucey, Simon},
  booktitle     = {Advances in Neural Information Processing Systems (NeurIPS)},
  year          = {2025},
  eprint        = {2505.19985},
  archivePrefix = {arXiv}
}"""
