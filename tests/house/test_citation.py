"""LICENSE, CITATION.cff and CHANGELOG.md agree with the package: one version (impulsevit/_version.py), one licence,
one citation of the paper (impulsevit/_citation.py, which the exported model cards read)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import yaml

from impulsevit import _citation
from impulsevit._version import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_citation_cff_states_the_package_and_the_paper_as_the_code_does():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["title"] == "impulsevit"
    assert cff["version"] == __version__ and cff["license"] == _citation.LICENSE
    paper = cff["preferred-citation"]
    assert paper["title"] == _citation.TITLE and paper["year"] == _citation.YEAR
    assert [(a["given-names"], a["family-names"]) for a in paper["authors"]] == list(_citation.AUTHORS)
    assert paper["conference"]["name"] == _citation.VENUE
    assert _citation.ARXIV_ID in paper["url"]
    assert {i["value"] for i in paper["identifiers"]} >= {f"arXiv:{_citation.ARXIV_ID}",
                                                          f"10.48550/arXiv.{_citation.ARXIV_ID}"}
    for given, family in _citation.AUTHORS:  # the BibTeX block names the same people, same order
        assert f"{family}, {given}" in _citation.BIBTEX
    assert _citation.ARXIV_ID in _citation.BIBTEX and str(_citation.YEAR) in _citation.BIBTEX


def test_license_is_the_apache_2_text_and_the_metadata_says_so():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg.get("metadata", "license") == _citation.LICENSE
    assert "License :: OSI Approved :: Apache Software License" in cfg.get("metadata", "classifiers")
    assert cfg.get("metadata", "version") == "attr: impulsevit._version.__version__"  # the one place


def test_changelog_has_an_unreleased_section_and_the_current_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert sections[0] == "Unreleased" and __version__ in sections
