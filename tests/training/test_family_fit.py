"""One real training step of every model family with every method that applies to it (issue 6).

Each case builds a tiny backbone inside ``ImageClassifier`` and runs ``lightning.Trainer(fast_dev_run=1)`` in process
on ``SyntheticDataModule``: the ``Initializer`` callback applies the method at ``on_fit_start``, then one AdamW step
runs. Checked: the initializer ran with the expected family adapter and changed the constructor's weights, the loss of
the step is finite, the step changed the weights it trains, and a frozen ConvMixer's spatial filters did not move
(while the trained ones did).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import pytest
import torch
from timm.models.mlp_mixer import MlpMixer
from torch import nn

import impulsevit.models  # noqa: F401  (registers convmixer_cifar with timm)
from impulsevit import ImageClassifier
from impulsevit.callbacks import Initializer
from impulsevit.data.loading.synthetic import SyntheticDataModule
from impulsevit.models.convmixer import depthwise_convs

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

VIT = ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2))
SWIN = ("swin_tiny_patch4_window7_224",
        dict(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(1, 1), num_heads=(2, 4)))
MIXER = ("mlp_mixer_tiny", dict(img_size=32, patch_size=4, embed_dim=64, num_blocks=2, mlp_ratio=(2.0, 2.0)))
CONVMIXER = ("convmixer_cifar", dict(dim=32, depth=2, kernel_size=3, patch_size=2))

# (id, backbone, kwargs, method, expected family adapter, spatial filters frozen)
CASES = [
    ("vit-impulse", *VIT, "impulse", "vit", None),
    ("vit-mimetic", *VIT, "mimetic", "vit", None),
    ("vit-torch", *VIT, "torch", "any", None),
    ("vit-timm", *VIT, "timm", "any", None),
    ("swin-impulse", *SWIN, "impulse", "swin", None),
    ("swin-mimetic", *SWIN, "mimetic", "swin", None),
    ("mixer-impulse", *MIXER, "impulse", "mixer", None),
    ("convmixer-impulse", CONVMIXER[0], {**CONVMIXER[1], "spatial_trainable": False}, "impulse", "convmixer", True),
    ("convmixer-box", CONVMIXER[0], {**CONVMIXER[1], "spatial_trainable": False}, "box", "convmixer", True),
    ("convmixer-random", *CONVMIXER, "random", "convmixer", False),
]


class _Classifier(ImageClassifier):
    """``ImageClassifier`` whose ``mlp_mixer_tiny`` backbone is timm's ``MlpMixer`` built directly: timm's registered
    Mixer variants fix ``patch_size`` and reject it as a kwarg (timm 1.0.31 passes its own), and 16 px patches leave 4
    tokens at 32 px. Every other backbone goes through ``timm.create_model`` as usual."""

    def build_backbone(self) -> nn.Module:
        if self.hparams.backbone != "mlp_mixer_tiny":
            return super().build_backbone()
        return MlpMixer(num_classes=int(self.hparams.num_classes), **self.hparams.backbone_kwargs)


class _StepProbe(L.Callback):
    """Snapshots the weights right before the first training step (after the Initializer ran) and keeps its loss."""

    def __init__(self) -> None:
        self.before: dict[str, torch.Tensor] = {}
        self.loss: float | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if not self.before:
            self.before = {k: v.detach().clone() for k, v in pl_module.backbone.state_dict().items()}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.loss is None:
            self.loss = float(outputs["loss"] if isinstance(outputs, dict) else outputs)


def _fit_one_step(backbone: str, kwargs: dict[str, Any], method: str) -> tuple[_Classifier, dict, _StepProbe,
                                                                                L.Trainer]:
    torch.manual_seed(0)
    model = _Classifier(backbone=backbone, backbone_kwargs=kwargs, num_classes=4,
                        init={"method": method, "seed": 0}, optimizer={"name": "adamw", "lr": 1e-3},
                        scheduler={"name": "cosine", "warmup_epochs": 0}, mixup=None, log_attention=False)
    constructed = {k: v.detach().clone() for k, v in model.backbone.state_dict().items()}
    dm = SyntheticDataModule(num_classes=4, image_size=32, num_train=16, num_val=8, batch_size=8)
    probe = _StepProbe()
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="32-true", fast_dev_run=1, callbacks=[probe],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, datamodule=dm)
    return model, constructed, probe, trainer


def _changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
    return {k for k in a if a[k].is_floating_point() and not torch.equal(a[k], b[k])}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_family_trains_one_step(case: tuple) -> None:
    _, backbone, kwargs, method, family, frozen = case
    model, constructed, probe, trainer = _fit_one_step(backbone, kwargs, method)

    init = next(c for c in trainer.callbacks if isinstance(c, Initializer))
    assert init.applied and init.report is not None
    assert (init.report.method, init.report.family) == (method, family)
    assert _changed(constructed, probe.before), f"{method} left every constructor weight as it was"

    assert trainer.global_step == 1
    assert probe.loss is not None and math.isfinite(probe.loss), f"loss of the step: {probe.loss}"
    after = {k: v.detach() for k, v in model.backbone.state_dict().items()}
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    trainable = {n for n, p in model.backbone.named_parameters() if p.requires_grad}
    moved = _changed(probe.before, after)
    # AdamW moves every parameter that got a gradient; the classifier head always gets one.
    assert moved & trainable, "the step changed no trainable weight"
    head = [n for n in trainable if n.startswith("head")]
    assert head and set(head) <= moved, f"head weights did not change: {sorted(set(head) - moved)}"

    if frozen is not None:
        spatial = {f"{name}.{p}" for name, conv in depthwise_convs(model.backbone) for p in ("weight", "bias")
                   if getattr(conv, p) is not None}
        assert len(spatial) == 2 * kwargs["depth"]
        if frozen:
            assert not spatial & trainable, "frozen spatial filters are trainable"
            assert not spatial & moved, f"frozen spatial filters changed: {sorted(spatial & moved)}"
        else:
            assert spatial <= trainable, f"spatial filters not trainable: {sorted(spatial - trainable)}"
            assert spatial <= moved, f"trained spatial filters did not change: {sorted(spatial - moved)}"
