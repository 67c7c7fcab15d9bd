"""ImageClassifier: lr scaling, weight-decay / layer-decay groups, per-step cosine schedule, mixup, EMA, bad-input
errors, the non-finite-loss guard, checkpoint round trip, strategy names. Tiny models, CPU, single process."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from impulsevit import ImageClassifier
from impulsevit.callbacks import NonFiniteLossGuard
from impulsevit.data.loading.synthetic import SyntheticDataModule
from impulsevit.training.strategies import FSDP2Strategy, check_strategy, default_precision

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

VIT = dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, weight_init="skip")


def tiny(**kw) -> ImageClassifier:
    args = dict(backbone="vit_tiny_patch16_224", backbone_kwargs=dict(VIT), num_classes=10, init={"method": "impulse"},
                log_attention=False)
    args.update(kw)
    return ImageClassifier(**args)


def data(**kw) -> SyntheticDataModule:
    args = dict(num_classes=10, image_size=32, num_train=64, num_val=32, batch_size=16)
    args.update(kw)
    return SyntheticDataModule(**args)


def trainer(tmp_path: Path, **kw) -> L.Trainer:
    args = dict(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_progress_bar=False,
                enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                limit_val_batches=1, default_root_dir=tmp_path)
    args.update(kw)
    return L.Trainer(**args)


class LrRecorder(L.Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.lrs.append(max(g["lr"] for g in trainer.optimizers[0].param_groups))


@pytest.mark.parametrize(("scaling", "expected"), [("linear", 5e-4 * 64 / 512), ("sqrt", 5e-4 * math.sqrt(64 / 512)),
                                                    ("none", 5e-4)])
def test_lr_scales_with_global_batch(tmp_path: Path, scaling: str, expected: float) -> None:
    m = tiny(optimizer={"base_lr": 5e-4, "base_batch_size": 512, "lr_scaling": scaling},
             scheduler={"warmup_epochs": 0, "name": "constant"})
    rec = LrRecorder()
    trainer(tmp_path, accumulate_grad_batches=4, max_steps=1, callbacks=[rec]).fit(m, data())
    assert m.resolved["global_batch_size"] == 16 * 1 * 4
    assert m.resolved["lr"] == pytest.approx(expected)
    assert rec.lrs[0] == pytest.approx(expected)


def test_explicit_lr_wins(tmp_path: Path) -> None:
    m = tiny(optimizer={"lr": 3e-3, "base_lr": 1.0})
    trainer(tmp_path, max_steps=1).fit(m, data())
    assert m.resolved["lr"] == 3e-3


def test_weight_decay_filtered_off_bias_norm_pos_embed_cls_token(tmp_path: Path) -> None:
    m = tiny(optimizer={"lr": 1e-3, "weight_decay": 0.05})
    t = trainer(tmp_path, max_steps=1)
    t.fit(m, data())
    names = {id(p): n for n, p in m.backbone.named_parameters()}
    decay = {names[id(p)] for g in t.optimizers[0].param_groups if g["weight_decay"] > 0 for p in g["params"]}
    no_decay = {names[id(p)] for g in t.optimizers[0].param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert decay | no_decay == set(names.values()) and not decay & no_decay
    assert {"pos_embed", "cls_token", "blocks.0.attn.qkv.bias", "blocks.0.norm1.weight", "norm.weight"} <= no_decay
    assert {"blocks.0.attn.qkv.weight", "blocks.1.mlp.fc1.weight", "head.weight", "patch_embed.proj.weight"} <= decay
    assert all(g["weight_decay"] == 0.05 for g in t.optimizers[0].param_groups if g["weight_decay"] > 0)
    assert type(t.optimizers[0]).__name__ == "AdamW" and t.optimizers[0].defaults["eps"] == 1e-8


def test_layer_decay_scales_lr_by_depth(tmp_path: Path) -> None:
    m = tiny(optimizer={"lr": 1e-3, "layer_decay": 0.5}, scheduler={"name": "constant", "warmup_epochs": 0})
    t = trainer(tmp_path, max_steps=1)
    t.fit(m, data())
    names = {id(p): n for n, p in m.backbone.named_parameters()}
    scale = {names[id(p)]: g["lr_scale"] for g in t.optimizers[0].param_groups for p in g["params"]}
    assert scale["head.weight"] == 1.0
    assert scale["blocks.1.attn.qkv.weight"] == pytest.approx(0.5)  # the last block: one layer below the head
    assert scale["patch_embed.proj.weight"] < scale["blocks.0.attn.qkv.weight"] < scale["blocks.1.attn.qkv.weight"]
    assert scale["blocks.0.attn.qkv.weight"] / scale["patch_embed.proj.weight"] == pytest.approx(2.0)


def test_cosine_with_warmup_is_stepped_per_optimizer_step(tmp_path: Path) -> None:
    # 64 samples / batch 16 = 4 optimizer steps per epoch, 3 epochs = 12 steps, 1 warmup epoch = 4 steps
    m = tiny(optimizer={"lr": 1e-2}, scheduler={"warmup_epochs": 1, "warmup_lr": 1e-4, "min_lr": 1e-5})
    rec = LrRecorder()
    trainer(tmp_path, max_steps=-1, max_epochs=3, limit_val_batches=0, callbacks=[rec]).fit(m, data())
    lrs = rec.lrs
    assert len(lrs) == 12 and m.resolved["warmup_steps"] == 4 and m.resolved["total_steps"] == 12
    # timm / DeiT semantics (warmup_prefix=False): linear ramp from warmup_lr towards the peak over the warmup steps
    for t in range(4):
        assert lrs[t] == pytest.approx(1e-4 + t * (1e-2 - 1e-4) / 4)
    # ... then the cosine from the peak (t = 0) to min_lr (t = total_steps), evaluated at the optimizer step
    for t in range(4, 12):
        assert lrs[t] == pytest.approx(1e-5 + 0.5 * (1e-2 - 1e-5) * (1 + math.cos(math.pi * t / 12)))
    assert all(a > b for a, b in zip(lrs[4:], lrs[5:]))


def test_image_size_not_divisible_by_patch_fails_before_training(tmp_path: Path) -> None:
    m = tiny()
    t = trainer(tmp_path)
    with pytest.raises(ValueError, match=r"image size 30 .* not divisible by the patch size 4 of backbone "
                                         r"'vit_tiny_patch16_224'"):
        t.fit(m, data(image_size=30))
    assert t.global_step == 0


def test_image_size_mismatch_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"built for img_size 32 but the data has image_size 16.*img_size: 16"):
        trainer(tmp_path).fit(tiny(), data(image_size=16))


def test_num_classes_mismatch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"10 outputs but the data has 4 classes; set model.num_classes: 4"):
        trainer(tmp_path).fit(tiny(), data(num_classes=4))


def test_init_method_that_does_not_fit_the_backbone(tmp_path: Path) -> None:
    m = ImageClassifier("resnet10t", num_classes=10, init={"method": "impulse"}, log_attention=False)
    t = trainer(tmp_path)
    with pytest.raises(ValueError, match=r"init method 'impulse' does not fit backbone 'resnet10t'.*ResNet"):
        t.fit(m, data())
    assert t.global_step == 0


@pytest.mark.parametrize(("backbone", "method"), [("resnet10t", "timm"), ("convnext_atto", "torch")])
def test_any_timm_backbone_trains_with_baseline_inits(tmp_path: Path, backbone: str, method: str) -> None:
    m = ImageClassifier(backbone, num_classes=10, init={"method": method}, optimizer={"lr": 1e-3},
                        mixup={"mixup_alpha": 0.8, "cutmix_alpha": 1.0}, ema_decay=0.9)
    t = trainer(tmp_path, max_steps=2)
    t.fit(m, data(batch_size=8, num_train=16))  # one epoch = 2 steps, so validation runs
    assert t.global_step == 2
    assert {"train/loss", "val/acc1", "val/acc5", "val_ema/acc1"} <= set(t.callback_metrics)
    assert math.isfinite(float(t.callback_metrics["train/loss"]))


def test_unknown_config_key_is_named() -> None:
    with pytest.raises(TypeError, match=r"unknown key\(s\) \['mehtod'\] in model.init"):
        tiny(init={"mehtod": "impulse"})
    with pytest.raises(ValueError, match=r"cannot build timm model 'vit_nonexistent'"):
        ImageClassifier("vit_nonexistent")


def test_mixup_gives_smoothed_soft_targets_and_needs_even_batches(tmp_path: Path) -> None:
    m = tiny(mixup={"mixup_alpha": 0.8, "cutmix_alpha": 1.0}, label_smoothing=0.1)
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 10
    _, soft = m.mixup_fn(x, y)
    assert soft.shape == (8, 10)
    torch.testing.assert_close(soft.sum(1), torch.ones(8))
    assert float(soft.min()) == pytest.approx(0.1 / 10, rel=1e-5)
    with pytest.raises(ValueError, match="even batch size, got 7"):
        trainer(tmp_path).fit(m, data(batch_size=7))


def test_soft_target_loss_and_hard_loss_with_smoothing() -> None:
    m = tiny(label_smoothing=0.1)
    logits, y = torch.randn(4, 10), torch.tensor([1, 2, 3, 4])
    soft = torch.nn.functional.one_hot(y, 10).float() * 0.9 + 0.01
    assert m._loss(logits, soft) == pytest.approx(float(-(soft * logits.log_softmax(-1)).sum(-1).mean()), rel=1e-5)
    m.train()
    assert m._loss(logits, y) == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y,
                                                                                       label_smoothing=0.1)))


class EmaProbe(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.same_at_start = all(torch.equal(a, b) for a, b in zip(pl_module.ema.module.state_dict().values(),
                                                                    pl_module.backbone.state_dict().values()))


def test_ema_taken_after_init_updated_evaluated_and_checkpointed(tmp_path: Path) -> None:
    m = tiny(optimizer={"lr": 1e-2}, ema_decay=0.5)
    before = m.ema.module.pos_embed.detach().clone()
    probe = EmaProbe()
    t = trainer(tmp_path, max_steps=3, callbacks=[probe])
    t.fit(m, data(num_train=48))  # one epoch = 3 steps, so validation runs
    assert probe.same_at_start  # re-synchronised with the initialized backbone (impulse scales pos_embed)
    assert not torch.equal(before, m.ema.module.pos_embed)
    assert not torch.equal(m.ema.module.head.weight, m.backbone.head.weight)  # decayed average, not a copy
    assert {"val_ema/acc1", "val_ema/acc5", "val_ema/loss"} <= set(t.callback_metrics)
    path = tmp_path / "m.ckpt"
    t.save_checkpoint(path)
    loaded = ImageClassifier.load_from_checkpoint(path, weights_only=True)
    for k, v in m.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert any(k.startswith("ema.module.") for k in loaded.state_dict())
    assert loaded.hparams.init == {"method": "impulse", "seed": 0, "options": {}}


class NaNAtBatch(SyntheticDataModule):
    def __init__(self, bad_batch: int, **kw) -> None:
        super().__init__(**kw)
        self.bad_batch = bad_batch

    def train_dataloader(self) -> DataLoader:
        images, labels = self.train_set.tensors
        images = images.clone()
        bs = self.batch_size
        images[self.bad_batch * bs : (self.bad_batch + 1) * bs] = float("nan")
        return DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=bs, shuffle=False)


class Snapshot(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.last = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self.step = trainer.global_step


def test_nonfinite_loss_saves_last_good_state_and_stops(tmp_path: Path) -> None:
    m = tiny(optimizer={"lr": 1e-3})
    snap = Snapshot()
    ckdir = tmp_path / "run" / "checkpoints"
    t = trainer(tmp_path, max_steps=10, callbacks=[snap, L.pytorch.callbacks.ModelCheckpoint(dirpath=ckdir)],
                enable_checkpointing=True)
    with pytest.raises(FloatingPointError, match=r"non-finite training loss nan at optimizer step 2 \(epoch 0, "
                                                 r"batch 2\).*last_good.ckpt"):
        t.fit(m, NaNAtBatch(2, num_classes=10, image_size=32, num_train=64, num_val=16, batch_size=8))
    assert snap.step == 2
    ckpt = torch.load(ckdir / "last_good.ckpt", weights_only=False)
    assert not (ckdir / "last_good.ckpt.tmp").exists()
    for k, v in snap.last.items():  # the state after the last good step, not the NaN-poisoned one
        assert torch.equal(ckpt["state_dict"][k], v), k
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    guard = next(c for c in t.callbacks if isinstance(c, NonFiniteLossGuard))
    assert guard.saved_path == ckdir / "last_good.ckpt"


@pytest.mark.parametrize("bad_batch", [2, 7])  # 7: the last batch of the fit, caught at on_train_end
def test_nonfinite_loss_next_step_mode_names_the_bad_step_one_step_later(tmp_path: Path, bad_batch: int) -> None:
    m = tiny(optimizer={"lr": 1e-3})
    snap = Snapshot()
    t = trainer(tmp_path, max_steps=8, callbacks=[snap, NonFiniteLossGuard(check="next_step")])
    with pytest.raises(FloatingPointError, match=rf"non-finite loss, gradients or weights at optimizer step "
                                                 rf"{bad_batch} \(epoch 0, batch {bad_batch}\).*found one step later"):
        t.fit(m, NaNAtBatch(bad_batch, num_classes=10, image_size=32, num_train=64, num_val=16, batch_size=8))
    assert snap.step == bad_batch + 1  # the bad step ran (its update applied); the error came at the next one
    assert not (tmp_path / "run" / "checkpoints" / "last_good.ckpt").exists()


def test_strategy_names_and_precision() -> None:
    t = L.Trainer(strategy="fsdp2", accelerator="cpu", devices=1, logger=False)
    assert isinstance(t.strategy, FSDP2Strategy) and t.strategy._tensor_parallel_size == 1
    from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry

    assert StrategyRegistry["fsdp"]["strategy"] is FSDPStrategy  # Lightning's own name is left alone
    from impulsevit.training.strategies import BF16DDPStrategy

    t = L.Trainer(strategy="ddp_bf16", accelerator="cpu", devices=1, logger=False)
    assert isinstance(t.strategy, BF16DDPStrategy) and t.strategy._ddp_comm_hook.__name__ == "bf16_compress_hook"
    with pytest.raises(ValueError, match="use trainer.strategy: fsdp2"):
        check_strategy("fsdp")
    check_strategy("ddp")
    assert default_precision("cpu") == "32-true" and default_precision("gpu") == "bf16-mixed"


def test_dense_peak_flops_cover_h200_names() -> None:
    from impulsevit.callbacks.throughput import peak_flops

    assert peak_flops("NVIDIA H200", torch.bfloat16) == 989.5e12  # what torch.cuda.get_device_name reports (SXM)
    assert peak_flops("NVIDIA H200 NVL", torch.bfloat16) == 835e12
    assert peak_flops("NVIDIA H200", "tfloat32") == 494.7e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", torch.bfloat16) is None  # left to Lightning's own table
