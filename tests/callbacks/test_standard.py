"""One set of callbacks for every run: a plain ``L.Trainer`` user and ``impulsevit fit`` get the same kinds, a
configured instance is kept, a second instance of a single-owner kind is an error; the Lightning internals the
package reads (``impulsevit._compat.lightning``) still behave as it relies on."""

from __future__ import annotations

import signal

import lightning as L
import pytest
from _cli_helpers import run_cli, tiny
from lightning.pytorch.callbacks import LearningRateMonitor

from impulsevit._compat.lightning import hand_back_signal_handlers, is_log_step
from impulsevit.callbacks import standard_callbacks
from impulsevit.callbacks.preemption import SlurmRequeue
from impulsevit.callbacks.rng_state import RNGStateCheckpoint
from impulsevit.callbacks.run_checkpoint import RunCheckpoint
from impulsevit.data import SyntheticDataModule
from impulsevit.training.module import ImageClassifier

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

BACKBONE = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, weight_init="skip")


def _model() -> ImageClassifier:
    return ImageClassifier("vit_tiny_patch16_224", BACKBONE, num_classes=4, init={"method": "impulse"},
                           optimizer={"lr": 1e-3}, ema_decay=None)


def _dm() -> SyntheticDataModule:
    return SyntheticDataModule(num_classes=4, image_size=16, num_train=16, num_val=8, batch_size=4)


def _kinds(trainer: L.Trainer) -> set[str]:
    return {type(c).__name__ for c in trainer.callbacks}


STANDARD = {"Initializer", "RNGStateCheckpoint", "SlurmRequeue", "NonFiniteLossGuard", "ThroughputLogger",
            "RunRecord", "LearningRateMonitor"}


def test_plain_trainer_and_cli_run_the_same_standard_callbacks(tmp_path):
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=tmp_path / "plain", logger=True,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(_model(), _dm())
    plain = _kinds(trainer)
    assert STANDARD <= plain
    cli = run_cli(*tiny(tmp_path, "cli", "--trainer.max_epochs=1"))
    assert STANDARD <= _kinds(cli.trainer)
    # the CLI adds only its run-directory parts on top: the checkpoint group and the config writer
    assert _kinds(cli.trainer) - plain <= {"RunCheckpoint", "RunConfigSaver", "ModelSummary", "TQDMProgressBar"}
    assert sum(isinstance(c, RunCheckpoint) for c in cli.trainer.callbacks) == 1


def test_a_configured_instance_is_kept_and_a_second_owner_is_an_error():
    mine = SlurmRequeue(requeue=False)
    out = standard_callbacks(init_method="impulse", init_seed=0, init_options={}, log_attention=False,
                             existing=[mine], has_logger=False)
    assert not any(isinstance(c, SlurmRequeue) for c in out)  # the user's stays the only one
    assert not any(isinstance(c, LearningRateMonitor) for c in out)  # no logger: Lightning's monitor would raise
    with pytest.raises(ValueError, match="2 SlurmRequeue callbacks"):
        standard_callbacks(init_method="impulse", init_seed=0, init_options={}, log_attention=False,
                           existing=[mine, SlurmRequeue()])


class _Cadence(L.Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
        self.seen.append((trainer.global_step, is_log_step(trainer)))


def test_is_log_step_follows_log_every_n_steps(tmp_path):
    probe = _Cadence()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, log_every_n_steps=3, default_root_dir=tmp_path,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, callbacks=[probe], limit_val_batches=0)
    trainer.fit(_model(), _dm())
    assert [s for s, log in probe.seen if log] == [3, 6]  # 8 steps, logged at every third


def test_hand_back_signal_handlers_replaces_only_the_callbacks_own_handler():
    class Connector:
        _original_handlers = {signal.SIGUSR1: "mine", signal.SIGTERM: "lightning"}

    class FakeTrainer:
        _signal_connector = Connector()

    trainer = FakeTrainer()
    hand_back_signal_handlers(trainer, "mine", {signal.SIGUSR1: None, signal.SIGTERM: "before"})  # type: ignore
    assert trainer._signal_connector._original_handlers == {signal.SIGUSR1: signal.SIG_DFL,
                                                            signal.SIGTERM: "lightning"}


def test_lightning_still_records_the_handlers_it_restores(tmp_path):
    """The attribute ``hand_back_signal_handlers`` edits exists on the pinned Lightning and holds what it restores."""
    class Probe(L.Callback):
        def on_train_start(self, trainer, pl_module):  # noqa: ANN001
            self.originals = dict(trainer._signal_connector._original_handlers)

    probe = Probe()
    before = signal.getsignal(signal.SIGUSR1)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, default_root_dir=tmp_path, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        callbacks=[probe], limit_val_batches=0)
    trainer.fit(_model(), _dm())
    assert signal.SIGUSR1 in probe.originals
    assert signal.getsignal(signal.SIGUSR1) == before  # SlurmRequeue's handler did not outlive the fit


def test_checkpoint_keys_of_the_checkpoint_callbacks_do_not_name_their_module():
    """Checkpoints store callback state under ``Callback.state_key``: the class's qualified name (plus, for
    ``ModelCheckpoint`` subclasses, its monitor / mode / intervals), never its module, so checkpoints written while
    these callbacks lived in ``impulsevit.training.checkpointing`` resume with the same keys."""
    assert RNGStateCheckpoint().state_key == "RNGStateCheckpoint"
    key = RunCheckpoint(monitor="val/acc1", mode="max", save_last=True).state_key
    assert key == ("RunCheckpoint{'monitor': 'val/acc1', 'mode': 'max', 'every_n_train_steps': 0, "
                   "'every_n_epochs': 1, 'train_time_interval': None}")
