"""What a run prints to the terminal: Lightning's model summary and progress bar, with two things they get wrong for
an impulsevit run fixed.

- :class:`FlopsModelSummary`: Lightning's ``ModelSummary`` prints "0 Total Flops" unless the model has an
  ``example_input_array``, whose forward pass at summary time would run on rank 0 alone (a hang under FSDP2) and
  compile an extra graph under ``torch.compile``. This one counts the backbone's forward FLOPs for one image on a
  meta-device copy (:func:`~impulsevit.callbacks.throughput.backbone_flops`: nothing runs on the real model) — what
  Lightning reports for a one-image ``example_input_array``.
- :class:`ResumeProgressBar`: Lightning does not call ``on_train_epoch_start`` when a fit resumes in the middle of an
  epoch, so its progress bar shows "Training: 33/?" — no epoch, no total. This one starts the epoch's bar itself
  on such a resume.

:func:`impulsevit.callbacks.standard_callbacks` puts them in place of Lightning's default instances (same settings);
a summary or bar of another kind (``RichModelSummary``, ``RichProgressBar``, a subclass) is left alone. A plain
``ModelSummary`` given in ``trainer.callbacks`` is replaced too, with ``max_depth`` 1 (Lightning's default); pass
``FlopsModelSummary(max_depth=...)`` to choose another depth.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, TQDMProgressBar

from impulsevit.callbacks.throughput import backbone_flops

__all__ = ["FlopsModelSummary", "ResumeProgressBar"]


class FlopsModelSummary(ModelSummary):
    """Lightning's ``ModelSummary`` with "Total Flops" = the backbone's forward FLOPs for one image (see the module
    docstring); 0, as Lightning prints it, when they cannot be counted."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flops = backbone_flops(trainer, pl_module, batch=1, backward=False) if trainer.is_global_zero else None
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data: list, total_parameters: int, trainable_parameters: int, model_size: float,
                  total_training_modes: dict[str, int], total_flops: int, **summarize_kwargs: Any) -> None:
        ModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                               total_flops=total_flops or self._flops or 0, **summarize_kwargs)


class ResumeProgressBar(TQDMProgressBar):
    """Lightning's ``TQDMProgressBar`` that also shows the epoch and its total after a mid-epoch resume."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if trainer.fit_loop.restarted_mid_epoch:  # Lightning skips on_train_epoch_start for this epoch
            self.on_train_epoch_start(trainer)
