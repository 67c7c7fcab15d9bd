"""The one door to the libraries' private members: every use impulsevit makes of a private name of Lightning, torch,
timm, FFCV or jsonargparse/argparse lives in this package, one module per library (:mod:`.lightning`,
:mod:`.torch`, :mod:`.timm`, :mod:`.ffcv`, :mod:`.cli`), and so does every private layout of a Lightning checkpoint
(dictionary keys, file names: :mod:`.checkpoint`, which imports no Lightning).

Each entry's docstring ends with three lines: ``Reaches:`` (the private members it touches), ``Checked on:`` (the
setup.cfg pin of that library; ``tests/house/test_compat.py`` runs the entry on the installed version) and
``Waits for:`` (the public API that would replace it). ``tests/house/test_compat.py`` enumerates private uses by AST
over the whole package and fails when one appears outside this folder, exercises each entry on the installed library,
and checks that setup.cfg's comment lists exactly the ``Reaches:`` lines found here.

The modules import nothing from impulsevit (each is a leaf of the layer rules in ``docs/design.md``), and this
``__init__`` imports none of them, so ``impulsevit.init`` can use :mod:`.torch` without importing Lightning.
"""
