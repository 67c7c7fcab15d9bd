"""``tests/`` mirrors the package (tests/README.md): every test file lives in a folder named after a folder of
``impulsevit/`` or in one of the declared cross-cutting folders, a test file at the top of ``tests/`` is named after a
leaf module of the package's root, every test folder is a row of tests/README.md's table, test modules have unique
names (pytest's ``prepend`` import mode imports them by file name), and the slow lane names only files that exist."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from _lanes import SLOW_FILES

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


def test_slow_files_exist():
    """A renamed or moved file must not leave the slow lane silently (it would then run in the fast one)."""
    missing = sorted(f for f in SLOW_FILES if not (TESTS / f).is_file())
    assert not missing, f"tests/_lanes.py's SLOW_FILES names files that do not exist: {missing}"
