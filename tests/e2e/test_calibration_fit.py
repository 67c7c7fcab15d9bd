"""impulse's ``pseudo_input='calibration'`` through ``impulsevit fit``: the Initializer reads the batch from the
training data, records its identity, keeps it on resume, and refuses a batch larger than the split in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _cli_helpers import run_cli, subprocess_env
from faults.harness import Result, assert_one_line_error

pytestmark = pytest.mark.slow  # trains and starts processes (tests/README.md, Lanes)


def test_fit_reads_the_batch_from_the_training_data_and_records_it(tmp_path):
    """Through ``impulsevit fit`` (the quickstart recipe on 256 images, its FFCV backend): the Initializer takes the
    first ``calibration_images`` training images (rank 0, broadcast) and run.json names them; a resumed run keeps the
    record and does not read them again."""
    common = ["--recipe", "quickstart", "--data.init_args.train_subset=256", "--data.init_args.val_subset=64",
              "--data.init_args.batch_size=32", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
              "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false", "--model.log_attention=false",
              "--model.init.options.pseudo_input=calibration", "--model.init.options.calibration_images=40",
              f"--data.init_args.cache_dir={tmp_path / 'cache'}", f"--runs_dir={tmp_path}", "--name=cal"]
    run_cli("fit", *common, "--trainer.max_epochs=1")
    record = json.loads((tmp_path / "cal" / "run.json").read_text())
    assert record["init_calibration"]["images"] == 40 and record["init_calibration"]["shape"][0] == 40
    assert len(record["init_calibration"]["sha256"]) == 64
    resumed = run_cli("fit", *common, "--trainer.max_epochs=2", "--resume=auto")
    again = json.loads((tmp_path / "cal" / "run.json").read_text())
    assert again["epoch"] == 2 and again["init_calibration"] == record["init_calibration"]
    init = next(c for c in resumed.trainer.callbacks if type(c).__name__ == "Initializer")
    assert init.skipped_reason is not None and init.skipped_reason.startswith("resumed from")
    # more calibration images than the training split has: one line, exit 2, no run folder left behind
    too_many = [a.replace("calibration_images=40", "calibration_images=400").replace("--name=cal", "--name=many")
                for a in common]
    done = subprocess.run([sys.executable, "-m", "impulsevit.cli", "fit", *too_many], env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert_one_line_error(Result(done.returncode, done.stdout, done.stderr, 0), 2, "the training split gave 256",
                          "model.init.options.calibration_images")
    assert not (tmp_path / "many").exists()
