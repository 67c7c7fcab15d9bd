"""The tools a user runs on a run's results: export to timm model folders / plain weights and the hub
(``export.py``), predictions on image folders (``predict.py``) and ``impulsevit data preview`` (``preview.py``).
The entry-point layer, with ``cli/`` and ``study/`` (docs/design.md, tests/house/test_layers.py)."""
