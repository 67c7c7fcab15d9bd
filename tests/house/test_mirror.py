"""``tests/`` mirrors the package (tests/README.md): every test file lives in a folder named after a folder of
``impulsevit/`` (a sub-folder after the sub-package it tests: ``tests/data/loading/`` for ``impulsevit/data/loading/``,
and a package with sub-packages, ``data/``, holds its tests there) or in one of the declared cross-cutting folders, a
test file at the top of ``tests/`` is named after a leaf module of the package's root, every test folder is a row of
tests/README.md's table, test modules have unique names (pytest's ``prepend`` import mode imports them by file name),
and a file that runs the real command, a SLURM cluster or distributed ranks is in the slow lane as a whole; the
long groups conftest.py starts first name test files."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from _scripts import load_script

TESTS = Path(__file__).resolve().parents[1]
PKG = TESTS.parent / "impulsevit"
CROSS_CUTTING = {"e2e", "faults", "house"}
"""Folders of tests that cross the layers (tests/README.md marks them *cross-cutting*)."""


def _test_files() -> list[Path]:
    return sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def _package_folders() -> set[str]:
    return {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}


def _readme_folders() -> dict[str, str]:
    """``{folder: description}`` from the table rows of tests/README.md that name a folder (`` `x/` ``)."""
    text = (TESTS / "README.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)/` \| (.*) \|$", text, re.MULTILINE)}


def test_every_test_file_is_in_a_package_folder_or_a_cross_cutting_one():
    allowed = _package_folders() | CROSS_CUTTING
    misplaced = []
    for rel in _test_files():
        if len(rel.parts) == 1:  # tests/test_<leaf>.py: the tests of impulsevit/<leaf>.py
            if not (PKG / (rel.name.removeprefix("test_"))).is_file():
                misplaced.append(f"tests/{rel}: no impulsevit/{rel.name.removeprefix('test_')} (the top of tests/ "
                                 "holds the tests of the package's root modules only)")
        elif rel.parts[0] not in allowed:
            misplaced.append(f"tests/{rel}: tests/{rel.parts[0]}/ is neither a folder of impulsevit/ nor one of the "
                             f"cross-cutting folders {sorted(CROSS_CUTTING)}")
        elif rel.parts[0] not in CROSS_CUTTING:
            folder = PKG.joinpath(*rel.parts[:-1])
            subpackages = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file()) \
                if folder.is_dir() else []
            if not folder.is_dir():
                misplaced.append(f"tests/{rel}: no impulsevit/{'/'.join(rel.parts[:-1])}/ to mirror")
            elif subpackages:
                misplaced.append(f"tests/{rel}: impulsevit/{'/'.join(rel.parts[:-1])}/ has sub-packages "
                                 f"{subpackages}; its tests go into the mirrored sub-folders")
    assert not misplaced, "test files outside the mirror (tests/README.md):\n" + "\n".join(misplaced)


def test_every_test_folder_is_in_the_readme_table():
    folders = {rel.parts[0] for rel in _test_files() if len(rel.parts) > 1}
    table = _readme_folders()
    assert set(table) == folders, (f"tests/README.md's table lists {sorted(table)}; the folders with tests are "
                                   f"{sorted(folders)}")
    for folder, what in table.items():
        cross = "*cross-cutting*" in what
        assert cross == (folder in CROSS_CUTTING), (f"tests/README.md: {folder}/ is{'' if cross else ' not'} marked "
                                                    f"*cross-cutting*, CROSS_CUTTING says {sorted(CROSS_CUTTING)}")
        mirrored = f"`impulsevit/{folder}/`"
        assert cross or mirrored in what, f"tests/README.md: the row of {folder}/ does not name {mirrored}"


def test_test_module_names_are_unique():
    """Without ``__init__.py`` a test file is imported as its bare name (``prepend`` mode): two files of one name in
    two folders would collide. A folder with ``__init__.py`` (``faults/``) is a package, its modules are qualified."""
    by_name = defaultdict(list)
    for rel in _test_files():
        package = len(rel.parts) > 1 and (TESTS / rel.parts[0] / "__init__.py").is_file()
        by_name[".".join(rel.with_suffix("").parts) if package else rel.stem].append(f"tests/{rel}")
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"test modules with the same name: {clashes}"


_PROCESS_HELPERS = re.compile(r"^(from faults(\.harness)? import|from \. import harness|from \.harness import|"
                               r"from slurm_cluster import|import dist_worker)", re.MULTILINE)
_FILE_SLOW = re.compile(r"^pytestmark = (\[[^\]]*\]|[^\n]*)", re.MULTILINE)  # a list over lines, or one line


def _slow_file(text: str) -> bool:
    found = _FILE_SLOW.search(text)
    return found is not None and "pytest.mark.slow" in found.group(1)


def test_files_that_start_the_command_or_a_cluster_are_slow_as_a_whole():
    """``pytestmark = pytest.mark.slow`` (tests/README.md, "Lanes") in every file that uses the fault harness (the real
    command in its own session), the loopback SLURM cluster or the distributed worker: the fast lane stays fast when
    such a file gains a test. (Other slow files, which train in-process or convert data, carry the same mark; this
    check cannot tell them from fast ones.)"""
    unmarked = sorted(f"tests/{rel}" for rel in _test_files()
                      if _PROCESS_HELPERS.search(text := (TESTS / rel).read_text()) and not _slow_file(text))
    assert not unmarked, f"files that start processes without pytestmark = pytest.mark.slow: {unmarked}"


def test_the_long_groups_name_test_files():
    """conftest.py's ``LONG_GROUPS`` start first under ``--dist loadgroup``: each names a test file (its group) or the
    SLURM files' group, so a renamed file cannot drop out of the order unnoticed."""
    conftest = load_script(TESTS / "conftest.py", "tests_conftest")
    names = {rel.name for rel in _test_files()} | {"slurm"}
    assert [g for g in conftest.LONG_GROUPS if g not in names] == []
    assert len(set(conftest.LONG_GROUPS)) == len(conftest.LONG_GROUPS)
