"""The run layer: what one run directory holds and the checks around it — the run directory's lock and the files a
failed start takes back (``rundir.py``), the checks before any work (``preflight.py``), recipe lookup (``recipes.py``;
the recipes themselves ship in ``impulsevit/recipes_data/``) and the table of every run under a runs directory
(``runs.py``, ``impulsevit runs``). Below the tools and the command line (docs/design.md,
tests/house/test_layers.py)."""
