"""Conversion outside the training job, on the real loopback SLURM cluster (tests/slurm_cluster.py).

- ``impulsevit submit`` for a recipe whose FFCV ``.beton`` files are missing submits a conversion job first and the
  training job with ``--dependency=afterok:<id>``: the training job is held on that dependency, then finds both files
  up to date (it reuses them, converts nothing) and completes.
- In a 2-task run, ``prepare_data`` refuses to convert a split above ``storage.convert_limit`` and the job stops with
  the exact ``impulsevit convert`` command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import slurm_cluster  # noqa: F401  (the module-scoped pytest fixture)

from impulsevit.cluster.events import job_state
from impulsevit.data.storage.convert import read_manifest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _cli() -> list[str]:
    """The ``impulsevit`` script of this environment (as an sbatch job would run it), else ``python -m``."""
    exe = Path(sys.executable).parent / "impulsevit"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "impulsevit.cli"]

RECIPE = """# Fashion-MNIST subset on the FFCV backend, tiny ViT, for the conversion-job tests
seed_everything: 0
trainer:
  max_epochs: 1
  log_every_n_steps: 1
  enable_progress_bar: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  limit_train_batches: 2
  limit_val_batches: 1
checkpoint: {monitor: null, save_top_k: 0, save_last: true}
model:
  backbone: vit_tiny_patch16_224
  backbone_kwargs: {img_size: 28, patch_size: 7, depth: 1, embed_dim: 32, num_heads: 2}
  init: {method: torch, seed: 0}
  log_attention: false
data:
  class_path: impulsevit.data.ImageDataModule
  init_args: {dataset: fashion_mnist, backend: ffcv, image_size: 28, batch_size: 8, num_workers: 1,
              train_subset: 64, val_subset: 32, crop_pct: 1.0}
"""


@pytest.fixture(scope="module")
def ws(tmp_path_factory, slurm_cluster):  # noqa: F811
    root = tmp_path_factory.mktemp("convjobs")
    (root / "fmnist.yaml").write_text(RECIPE)
    tests_dir = Path(__file__).resolve().parents[1]  # tests/: slurm_cluster.py
    env = {**slurm_cluster.env, "PYTHONPATH": os.pathsep.join([str(tests_dir), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "IMPULSEVIT_CACHE": str(root / "cache")}
    return {"root": root, "env": env, "cluster": slurm_cluster}


def _submit(ws, name: str, *extra: str) -> str:
    proc = subprocess.run([*_cli(), "submit", "--recipe", "fmnist.yaml", "--runs-dir", "runs", "--name", name, *extra],
                          cwd=ws["root"], env=ws["env"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _wait(ws, name: str, timeout: float = 900.0) -> str:  # a loaded 2-core machine: minutes per job
    run_dir = ws["root"] / "runs" / name
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        state = job_state(run_dir)
        if state in ("completed", "failed"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"{name}: no end after {timeout} s\n{ws['cluster'].logs()}")


def test_missing_betons_get_a_conversion_job_and_training_waits_for_it(ws):
    out = _submit(ws, "conv")
    conv = re.search(r"Submitted conversion job (\d+)", out)
    train = re.search(r"Submitted batch job (\d+)", out)
    assert conv and train, out
    shown = ws["cluster"].run(["scontrol", "show", "job", train.group(1)]).stdout
    assert f"Dependency=afterok:{conv.group(1)}" in shown, shown  # held until the conversion succeeded
    run_dir = ws["root"] / "runs" / "conv"
    assert (run_dir / "convert.sbatch").read_text().count(" convert fashion_mnist ") == 2
    state = _wait(ws, "conv")
    conv_log = (run_dir / "slurm" / f"convert-{conv.group(1)}.out").read_text()
    train_log = (run_dir / "slurm" / f"{train.group(1)}.out").read_text()
    assert state == "completed", conv_log + train_log
    assert "writing 64 images" in conv_log and "writing 32 images" in conv_log, conv_log
    assert "up to date (64 images), skipped" in train_log and "up to date (32 images), skipped" in train_log, train_log
    assert "writing" not in train_log, train_log
    betons = sorted((ws["root"] / "cache" / "ffcv").glob("fashion_mnist-*.beton"))
    assert len(betons) == 2 and all(read_manifest(b) for b in betons)


def test_two_task_run_refuses_to_convert_a_large_split_and_names_the_command(ws):
    _submit(ws, "limit", "--tasks-per-node", "2", "--trainer.strategy=ddp", "--no-convert-job",
            "--data.init_args.train_subset=48", "--data.init_args.storage.convert_limit=40")
    assert _wait(ws, "limit") == "failed"
    run_dir = ws["root"] / "runs" / "limit"
    log = "".join(p.read_text() for p in (run_dir / "slurm").glob("*.out"))
    assert "convert_limit=40" in log and "a 2-process run does not convert them" in log, log
    assert re.search(r"impulsevit convert fashion_mnist \S+fashion_mnist-train-raw-n48-\S+\.beton --split train "
                     r"--preset raw .*--subset 48", log), log
    assert not list((ws["root"] / "cache" / "ffcv").glob("fashion_mnist-train-raw-n48-*.beton"))
