"""The one door to the libraries' private members: every use impulsevit makes of a private name of Lightning, torch,
timm, FFCV or jsonargparse/argparse lives in this package, one module per library (:mod:`.lightning`,
:mod:`.torch`, :mod:`.timm`, :mod:`.ffcv`, :mod:`.cli`), and so does every private layout of a Lightning checkpoint
(dictionary keys, file names: :mod:`.checkpoint`, which imports no Lightning).

Each entry's docstring ends with three lines: ``Reaches:`` (the private members it touches), ``Checked on:`` (that
library's row of :data:`CHECKED_ON`; ``tests/house/test_compat.py`` runs the entry on the installed version) and
``Waits for:`` (the public API that would replace it). ``tests/house/test_compat.py`` enumerates private uses by AST
over the whole package and fails when one appears outside this folder, exercises each entry on the installed library,
and checks that setup.cfg's comment lists exactly the ``Reaches:`` lines found here.

The modules import nothing from impulsevit (each is a leaf of the layer rules in ``docs/design.md``), and this
``__init__`` imports none of them, so ``impulsevit.init`` can use :mod:`.torch` without importing Lightning.
"""

CHECKED_ON: dict[str, str] = {
    "torch": ">=2.4,<2.16",  # CI: 2.14.1 (constraints/ci.txt); 2.15.0 (+ torchvision 0.29.2): the whole suite, once
    "timm": ">=1.0.20,<1.1",
    "lightning": ">=2.6,<2.7",
    "jsonargparse": ">=4.27,<5",
    "ffcv": "==1.0.2",
    "litdata": ">=0.2.76,<0.3",
}
"""The compat table: per library whose private members or layouts this package uses, the versions on which those
uses were checked (``tests/house/test_compat.py`` passed). Not a cap on what users install (setup.cfg's ranges have
none): ``scripts/check_pins.py`` reports an installed version outside its row, and CI (which installs
``constraints/ci.txt``) fails on one. A new release enters a row after the suite passed on it."""
