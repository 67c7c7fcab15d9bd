"""The accuracy metrics of a classifier: torchmetrics top-1 / top-5 per stage."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

__all__ = ["accuracy_metrics"]


def accuracy_metrics(num_classes: int, stages: Iterable[str]) -> nn.ModuleDict:
    """``{f"{stage}_": MetricCollection}`` with ``{stage}/acc1`` and, except for ``train``, ``{stage}/acc5`` (top-k
    with k = min(5, num_classes)). Keys carry a ``_`` suffix: ``ModuleDict`` keys may not shadow ``nn.Module.train``.
    The train metric skips torchmetrics' argument checks (they read the targets back to the host every step)."""
    k5 = min(5, num_classes)

    def accs(prefix: str, top5: bool) -> MetricCollection:
        ms = {"acc1": MulticlassAccuracy(num_classes, top_k=1, average="micro", validate_args=top5)}
        if top5:
            ms["acc5"] = MulticlassAccuracy(num_classes, top_k=k5, average="micro")
        return MetricCollection(ms, prefix=f"{prefix}/")

    return nn.ModuleDict({f"{stage}_": accs(stage, top5=stage != "train") for stage in stages})
