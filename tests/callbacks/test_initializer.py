"""The Initializer callback, single process: runs once, never on resume (bit-identical continuation), keeps the
optimizer's references valid, fails before training on bad options, and checks ranks with real digests."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

import impulsevit.init as ii
from impulsevit import ImageClassifier
from impulsevit.callbacks import Initializer
from impulsevit.callbacks.initializer import generator_digest, tensor_digests
from impulsevit.data.loading.synthetic import SyntheticDataModule
from impulsevit.init.api import InitResult
from impulsevit.init.vit_layout import is_vit

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

VIT = dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, weight_init="skip")
CALLS: list[int] = []


@ii.register("counted_impulse", family="vit", matches=is_vit)
def _counted_impulse(model: torch.nn.Module, generator: torch.Generator, options: dict) -> InitResult:
    """Test-only method: impulse, counting how often it runs."""
    CALLS.append(1)
    report = ii.initialize(model, "impulse", generator=generator, **options)
    return InitResult(options=report.options, offsets=report.offsets)


class OrderedData(SyntheticDataModule):
    """No shuffling: a resumed run sees exactly the batches an uninterrupted one sees."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=False, drop_last=True)


def tiny(method: str = "counted_impulse", **kw) -> ImageClassifier:
    return ImageClassifier("vit_tiny_patch16_224", dict(VIT), num_classes=4, init={"method": method, **kw},
                           optimizer={"lr": 1e-3}, scheduler={"warmup_epochs": 0.5}, label_smoothing=0.0,
                           log_attention=False)


class StopAt(L.Callback):
    """Simulates an interruption after ``step`` optimizer steps (the schedule still spans the full run)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def fit(tmp_path: Path, model: ImageClassifier, max_steps: int, ckpt_path: str | None = None,
        callbacks: list | None = None) -> L.Trainer:
    L.seed_everything(7, verbose=False)
    t = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=1,
                  default_root_dir=tmp_path, callbacks=callbacks or [])
    t.fit(model, OrderedData(num_classes=4, image_size=32, num_train=32, num_val=8, batch_size=8), ckpt_path=ckpt_path)
    return t


def init_callback(t: L.Trainer) -> Initializer:
    return next(c for c in t.callbacks if isinstance(c, Initializer))


@pytest.mark.slow
def test_resume_never_reinitializes_and_continues_bit_identically(tmp_path: Path) -> None:
    CALLS.clear()
    straight = tiny()
    fit(tmp_path / "a", straight, max_steps=8)  # 4 steps per epoch: 2 epochs
    assert len(CALLS) == 1

    first = tiny()
    t1 = fit(tmp_path / "b", first, max_steps=8, callbacks=[StopAt(4)])
    assert t1.global_step == 4
    ckpt = next((tmp_path / "b").rglob("*.ckpt"))
    state = torch.load(ckpt, weights_only=False)
    (key,) = [k for k in state["callbacks"] if k.startswith("Initializer")]
    assert state["callbacks"][key]["applied"] is True and state["callbacks"][key]["method"] == "counted_impulse"
    assert init_callback(t1).applied and len(CALLS) == 2

    resumed = tiny()
    t2 = fit(tmp_path / "b", resumed, max_steps=8, ckpt_path=str(ckpt))
    assert len(CALLS) == 2  # the initializer did not run again
    assert "resumed from" in init_callback(t2).skipped_reason
    assert t2.global_step == 8
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{name}: resumed run diverged from the uninterrupted one"


class OptimizerProbe(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        opt = trainer.optimizers[0]
        self.in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
        self.params = {id(p) for p in pl_module.backbone.parameters()}
        self.init = {n: p.detach().clone() for n, p in pl_module.backbone.named_parameters()}


def test_optimizer_state_valid_after_init(tmp_path: Path) -> None:
    m = tiny()
    probe = OptimizerProbe()
    t = fit(tmp_path, m, max_steps=1, callbacks=[probe])
    assert probe.in_opt == probe.params  # the optimizer holds the very tensors the init wrote into
    # the init really changed them (impulse multiplies pos_embed by 18) and the step updated the initialized values
    assert probe.init["pos_embed"].std() > 0.1
    opt_state = t.optimizers[0].state
    for name, p in m.backbone.named_parameters():
        assert p in opt_state and int(opt_state[p]["step"]) == 1, name
        assert not torch.equal(p.detach(), probe.init[name]), name


def test_bad_option_fails_before_training_naming_method_and_backbone(tmp_path: Path) -> None:
    # a name no handler of the method takes: refused at construction, with the closest valid name
    with pytest.raises(ValueError, match=r"^model.init.options: unknown option\(s\) \['gain_qq'\] for init method "
                                         r"'impulse' \(did you mean 'gain_qk'\?\)"):
        ImageClassifier("vit_tiny_patch16_224", dict(VIT), num_classes=4,
                        init={"method": "impulse", "options": {"gain_qq": 7.0}}, log_attention=False)
    # a value of the wrong type for the family that applies: refused before training, the model untouched
    m = ImageClassifier("vit_tiny_patch16_224", dict(VIT), num_classes=4,
                        init={"method": "impulse", "options": {"gain_qk": "high"}}, log_attention=False)
    before = {k: v.clone() for k, v in m.backbone.state_dict().items()}
    with pytest.raises(TypeError, match=r"init method 'impulse' does not fit backbone 'vit_tiny_patch16_224'.*"
                                        r"option 'gain_qk' of init method 'impulse' \(vit\) must be float"):
        fit(tmp_path, m, max_steps=1)
    for k, v in m.backbone.state_dict().items():  # nothing was modified (weight_init=skip garbage may hold NaN)
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, equal_nan=True, msg=k)


def test_unknown_method_is_named_at_construction() -> None:
    with pytest.raises(ValueError, match=r"^model.init.method: unknown init method 'impluse'; available: .*impulse"):
        tiny("impluse")
    # the one check is ImageClassifier's / the CLI's (impulsevit.init.check_init_method); the callback only dispatches
    with pytest.raises(ValueError, match=r"unknown init method 'impluse'"):
        Initializer("impluse").on_fit_start(L.Trainer(logger=False, enable_checkpointing=False), tiny("impulse"))


def test_state_dict_round_trip() -> None:
    cb = Initializer("impulse", seed=3, options={"gain_qk": 5.0})
    cb.applied = True
    other = Initializer("impulse", seed=3)
    other.load_state_dict(cb.state_dict())
    assert other.applied and cb.state_dict()["options"] == {"gain_qk": 5.0}
    # the key a checkpoint stores the state under: the same for the same (method, seed), distinct otherwise
    assert other.state_key == cb.state_key
    assert len({cb.state_key, Initializer("impulse", seed=4).state_key, Initializer("mimetic", seed=3).state_key}) == 3


def test_digests_see_seed_draws_and_values() -> None:
    g0, g1 = ii.make_generator(0), ii.make_generator(1)
    assert not torch.equal(generator_digest(g0, 0), generator_digest(g1, 0))  # same seed value, other stream
    before = generator_digest(g0, 0).clone()
    torch.randn(3, generator=g0)
    assert not torch.equal(before, generator_digest(g0, 0))  # the number of draws shows
    m = torch.nn.Linear(3, 2)
    names, d = tensor_digests(m)
    assert names == ["weight", "bias"] and d.shape == (2, 3)
    with torch.no_grad():
        m.weight[0, 0] += 1e-3
    assert not torch.equal(d, tensor_digests(m)[1])
