"""The Trainer's integer-or-fraction arguments through the real CLI (``cli/parser.py``,
``ImpulseArgumentParser.add_lightning_class_args``): an integer written on the command line or in a YAML file is a
batch count (``limit_val_batches=1``: one batch), a decimal a fraction (``0.5``; ``1.0``: all batches), in every
subcommand, in the run's ``config.yaml`` and on resume.

The tiny recipe has 4 training batches and 2 validation / test / predict batches (64 and 32 images of 16); so one
batch and all batches differ in every stage.
"""

from __future__ import annotations

import lightning as L
import pytest
import yaml
from _cli_helpers import run_cli, tiny

pytestmark = pytest.mark.slow  # trains (tests/README.md, Lanes)

COUNTER = "--trainer.callbacks+=test_batch_limits.CountBatches"


class CountBatches(L.Callback):
    """Counts the batches each stage ran (the sanity check's not counted)."""

    def __init__(self) -> None:
        self.ran = {"train": 0, "validate": 0, "test": 0, "predict": 0}

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.ran["train"] += 1

    def on_validation_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.ran["validate"] += 0 if trainer.sanity_checking else 1

    def on_test_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.ran["test"] += 1

    def on_predict_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.ran["predict"] += 1


def ran(cli: object) -> dict[str, int]:
    (counter,) = [c for c in cli.trainer.callbacks if isinstance(c, CountBatches)]  # type: ignore[attr-defined]
    return counter.ran


@pytest.mark.parametrize(("subcommand", "given", "expected", "batches"), [
    ("validate", "1", 1, 1),
    ("test", "1", 1, 1),
    ("predict", "1", 1, 1),
    ("validate", "0.5", 0.5, 1),
    ("validate", "1.0", 1.0, 2),
])
def test_an_integer_on_the_command_line_counts_batches(tmp_path, subcommand, given, expected, batches):
    """``--trainer.limit_<stage>_batches=1`` is the int 1 (one batch), ``0.5`` / ``1.0`` stay floats (a fraction)."""
    key = f"limit_{'val' if subcommand == 'validate' else subcommand}_batches"
    cli = run_cli(*tiny(tmp_path, "eval", f"--trainer.{key}={given}", "--untrained", COUNTER, subcommand=subcommand))
    value = getattr(cli.trainer, key)
    assert value == expected and type(value) is type(expected)
    assert ran(cli)[subcommand] == batches


@pytest.fixture(scope="module")
def one_batch_fit(tmp_path_factory):
    """``fit`` of one epoch with ``limit_train_batches: 1`` in a YAML file and ``--trainer.limit_val_batches=1`` on
    the command line: (runs_dir, the CLI)."""
    runs = tmp_path_factory.mktemp("runs")
    overlay = runs / "one_batch.yaml"
    overlay.write_text("trainer:\n  limit_train_batches: 1\n")
    cli = run_cli(*tiny(runs, "one", "--config", str(overlay), "--trainer.limit_val_batches=1",
                        "--trainer.max_epochs=1", "--trainer.num_sanity_val_steps=0", COUNTER))
    return runs, cli


def test_an_integer_in_yaml_and_on_the_command_line_counts_batches_in_fit(one_batch_fit):
    _, cli = one_batch_fit
    for key in ("limit_train_batches", "limit_val_batches"):
        value = getattr(cli.trainer, key)
        assert value == 1 and type(value) is int, (key, value)
    assert ran(cli) == {"train": 1, "validate": 1, "test": 0, "predict": 0}


def test_the_saved_config_keeps_the_ints_and_resumes_with_them(one_batch_fit):
    """``config.yaml`` writes ``1``, not ``1.0``; ``fit --config <run>/config.yaml --resume auto`` reads it back as
    ints, so the checkpoint's run limits (``training/checkpointing.run_limits``) match and it is resumed, not skipped
    as a smoke test's."""
    runs, first = one_batch_fit
    saved = yaml.safe_load((runs / "one" / "config.yaml").read_text())["trainer"]
    assert (saved["limit_train_batches"], saved["limit_val_batches"]) == (1, 1)
    assert type(saved["limit_train_batches"]) is int and type(saved["limit_val_batches"]) is int
    cli = run_cli("fit", "--config", str(runs / "one" / "config.yaml"), f"--runs_dir={runs}", "--name=one",
                  "--resume=auto", "--trainer.max_epochs=2")
    assert cli.start_step == first.trainer.global_step == 1  # resumed from the first fit's checkpoint
    assert cli.trainer.global_step == 2 and type(cli.trainer.limit_val_batches) is int
    assert ran(cli) == {"train": 1, "validate": 1, "test": 0, "predict": 0}
