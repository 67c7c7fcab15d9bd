"""The training layer: ``ImageClassifier`` (``module.py``) and the one concern per module it delegates to (backbone,
optimizer and schedule, loss, EMA, metrics, sharding, strategies, what it reads from the datamodule, the recipe
blocks, checkpoint writing and discovery, the trackers). Imports ``init``, ``models``, ``callbacks`` and the leaves;
nothing of the data, cluster, run or entry-point layers (docs/design.md, tests/house/test_layers.py)."""
