"""When things go wrong, through the real ``impulsevit`` entry point (``main``): one-line errors with the right exit
status before any work, nothing half-made, one owner per run directory, smoke runs that ``--resume auto`` skips.

Each test reproduces a case of the "when things go wrong" report (full disks and damaged ``.beton`` files:
``test_disk_and_beton_failures.py``; ``submit --dry-run``: ``test_submit.py``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from _cli_helpers import TINY, tiny

from impulsevit.cli import main
from impulsevit.rundir import LOCK_NAME

SHORT = ("--trainer.max_epochs=1", "--data.init_args.num_train=32", "--data.init_args.num_val=16")


def fit(runs: Path, name: str, *extra: str, sub: str = "fit") -> list[str]:
    return tiny(runs, name, *SHORT, *extra, subcommand=sub)


def error_line(capsys, sub: str = "fit") -> str:
    """The ``impulsevit SUB: error: ...`` line of stderr (asserting there is exactly one and no traceback)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"impulsevit {sub}: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------------------- 3: smoke runs, resume
class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_fast_dev_run_leaves_no_checkpoint_and_resume_auto_names_what_it_skips(tmp_path, capsys):
    assert main(fit(tmp_path, "smoke", "--trainer.fast_dev_run=true")) == 0
    assert not list((tmp_path / "smoke").rglob("*.ckpt"))

    # a limit_* smoke run's checkpoint is not taken by the real run; a corrupt last.ckpt is named, not skipped silently
    assert main(fit(tmp_path, "lim", "--trainer.limit_train_batches=0.5")) == 0
    ckdir = tmp_path / "lim" / "checkpoints"
    good = sorted(p for p in ckdir.glob("*.ckpt") if p.name != "last.ckpt")
    assert good, list(ckdir.iterdir())
    last = ckdir / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    os.utime(last)  # the newest candidate
    seen = _Lines()
    logging.getLogger("impulsevit").addHandler(seen)
    try:
        assert main(fit(tmp_path, "lim", "--resume=auto")) == 0
    finally:
        logging.getLogger("impulsevit").removeHandler(seen)
    err = "\n".join(seen.lines)
    assert f"skipped {last}: not a complete checkpoint (truncated" in err
    assert f"skipped {good[0]}: written by a run with limit_train_batches=0.5 (this run: 1.0), a smoke test" in err
    assert "starting fresh" in err


# ----------------------------------------------------------------------------------------------------- 4: names
@pytest.mark.parametrize("name", ["exp/a", "../escaped", ".."])
def test_run_names_must_be_one_folder_inside_runs_dir(tmp_path, capsys, name):
    runs = tmp_path / "runs"
    assert main(fit(runs, name)) == 2
    assert "a run name must be a single folder name inside --runs_dir" in error_line(capsys)
    assert not runs.exists() and not (tmp_path / "escaped").exists()


# ------------------------------------------------------------------------------------- 5: one owner per run dir
def test_second_writer_is_stopped_and_stale_or_same_job_locks_are_taken_over(tmp_path, capsys, monkeypatch):
    run = tmp_path / "busy"
    run.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        lock = {"host": socket.gethostname(), "pid": owner.pid, "job": "4242", "started": "earlier"}
        (run / LOCK_NAME).write_text(json.dumps(lock))
        assert main(fit(tmp_path, "busy")) == 2
        line = error_line(capsys)
        assert f"run directory {run} is in use by pid {owner.pid}" in line and "(SLURM job 4242)" in line
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # nothing written next to the owner's files
        # a requeued SLURM job of the same run takes the lock over (the previous owner may look alive elsewhere)
        monkeypatch.setenv("SLURM_JOB_ID", "4242")
        assert main(fit(tmp_path, "busy", "--resume=auto")) == 0
        assert not (run / LOCK_NAME).exists() and (run / "checkpoints" / "last.ckpt").is_file()
    finally:
        owner.kill()
        owner.wait()
    # a stale lock (same host, pid gone) is taken over
    monkeypatch.delenv("SLURM_JOB_ID")
    (run / LOCK_NAME).write_text(json.dumps({**lock, "job": None}))
    assert main(fit(tmp_path, "busy", "--resume=auto")) == 0
    assert not (run / LOCK_NAME).exists()


@pytest.mark.parametrize("content", [b"", b'{"host": "ab', b"\x00\xff garbage", b"[]"])
def test_empty_or_unreadable_lock_is_stale_with_a_notice(tmp_path, capsys, content):
    """A 0-byte lock (what a start on a full disk left) or a garbled one no longer blocks the run directory forever
    ("in use by pid None on None since None"): it is replaced, with one line saying so, and released at the end."""
    run = tmp_path / "left"
    run.mkdir()
    (run / LOCK_NAME).write_bytes(content)
    assert main(fit(tmp_path, "left")) == 0
    err = capsys.readouterr().err
    notices = [ln for ln in err.splitlines() if "empty or unreadable" in ln]
    assert len(notices) == 1 and str(run / LOCK_NAME) in notices[0] and "in use by" not in err, err
    assert not (run / LOCK_NAME).exists() and (run / "checkpoints" / "last.ckpt").is_file()



def test_fit_into_an_existing_run_refuses_unless_resume_or_overwrite(tmp_path, capsys):
    run = tmp_path / "twice"
    assert main(fit(tmp_path, "twice")) == 0
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert main(fit(tmp_path, "twice")) == 2
    line = error_line(capsys)
    assert f"run directory {run} already holds a run" in line
    assert "--resume auto" in line and "--name" in line and "--overwrite" in line
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before  # untouched

    (run / "hparams.yaml").write_text("stale: true\n")
    assert main(fit(tmp_path, "twice", "--overwrite=true", "--model.optimizer.lr=0.002")) == 0
    assert "stale" not in (run / "hparams.yaml").read_text()
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["optimizer"]["lr"] == 0.002
    assert len(list(run.glob("events.out.tfevents.*"))) == 1


def test_evaluation_never_touches_the_training_runs_files_and_needs_a_checkpoint(tmp_path, capsys):
    run = tmp_path / "ev"
    assert main(fit(tmp_path, "ev")) == 0
    cfg, hp = (run / "config.yaml").read_bytes(), (run / "hparams.yaml").read_bytes()
    events = sorted(run.glob("events.out.tfevents.*"))

    assert main(fit(tmp_path, "ev", sub="test")) == 2
    assert "impulsevit test evaluates a trained model: give --resume auto" in error_line(capsys, "test")

    assert main(fit(tmp_path, "ev", "--resume=auto", sub="test")) == 0
    assert (run / "config.yaml").read_bytes() == cfg and (run / "hparams.yaml").read_bytes() == hp
    assert sorted(run.glob("events.out.tfevents.*")) == events
    assert yaml.safe_load((run / "test" / "config.yaml").read_text())["resume"] == "auto"
    assert list((run / "test").glob("events.out.tfevents.*"))
    # explicitly asked for: the untrained model
    assert main(fit(tmp_path, "ev", "--untrained=true", sub="validate")) == 0


# -------------------------------------------------------------------------- 8: clear errors before any work
def _ffcv_imagefolder(tmp_path: Path, classes: int) -> list[str]:
    """Data options for an FFCV ImageFolder run whose cache directory must stay empty when validation fails."""
    from test_data_registry import save_jpeg

    for split in ("train", "val"):
        for c in range(classes):
            for j in range(2):
                save_jpeg(tmp_path / "imgs" / split / f"c{c}" / f"{j}.jpg", h=32, w=32, seed=10 * c + j)
    data = {"class_path": "impulsevit.data.ImageDataModule",
            "init_args": {"dataset": "imagefolder", "root": str(tmp_path / "imgs"), "image_size": 32,
                          "batch_size": 2, "num_workers": 1, "cache_dir": str(tmp_path / "cache")}}
    return [f"--data={json.dumps(data)}"]


@pytest.mark.ffcv
@pytest.mark.parametrize(
    ("extra", "classes", "expected"),
    [
        (["--model.init.method=impluse"], 2, "unknown init method 'impluse'"),
        (["--model.backbone=resnet18", "--model.backbone_kwargs={}"], 2,
         "init method 'impulse' does not apply to backbone 'resnet18' (ResNet)"),
        (["--model.backbone_kwargs.patch_size=5"], 2, "not divisible by the patch size 5"),
        ([], 1, "has 1 class(es); classification needs at least 2"),
    ],
    ids=["unknown-init", "impulse-on-resnet", "patch-size", "one-class"],
)
def test_configuration_errors_are_one_line_before_data_preparation(tmp_path, capsys, extra, classes, expected):
    pytest.importorskip("ffcv")
    args = fit(tmp_path / "runs", "bad", *_ffcv_imagefolder(tmp_path, classes), *extra)
    assert main(args) == 2
    assert expected in error_line(capsys)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("backend", ["torchvision", "convert"])
def test_a_validation_class_missing_from_training_is_an_error_naming_it(tmp_path, capsys, backend):
    """val/ holds a class folder train/ lacks: its images used to be dropped without a word (the val split is listed
    with train's classes). Now one line names the folder, through `fit` and through `convert`."""
    from test_data_registry import save_jpeg

    from impulsevit.data.convert_cli import main as convert_main

    for split, names in (("train", ["cat", "dog"]), ("val", ["bird", "cat", "dog"])):
        for name in names:
            for j in range(2):
                save_jpeg(tmp_path / "imgs" / split / name / f"{j}.jpg", h=32, w=32, seed=j)
    if backend == "convert":
        assert convert_main([str(tmp_path / "imgs"), str(tmp_path / "out"), "--split", "val", "--no-progress"]) == 2
        line = capsys.readouterr().err.strip()
    else:
        data = {"class_path": "impulsevit.data.ImageDataModule",
                "init_args": {"dataset": "imagefolder", "root": str(tmp_path / "imgs"), "image_size": 32,
                              "batch_size": 2, "num_workers": 0, "backend": "torchvision"}}
        assert main(fit(tmp_path / "runs", "cls", f"--data={json.dumps(data)}")) == 2
        line = error_line(capsys)
    assert f"{tmp_path / 'imgs' / 'val'} has 1 class folder(s) that the training split does not have: bird" in line


def test_resume_checkpoint_that_does_not_fit_names_the_differing_settings(tmp_path, capsys):
    assert main(fit(tmp_path, "small", "--trainer.limit_train_batches=0.5")) == 0
    ckpt = tmp_path / "small" / "checkpoints" / "last.ckpt"
    assert main(fit(tmp_path, "wide", f"--resume={ckpt}", "--model.backbone_kwargs.embed_dim=32")) == 2
    line = error_line(capsys)
    assert f"--resume {ckpt} does not fit the model" in line
    assert "model.backbone_kwargs.embed_dim: 64 in the checkpoint, 32 now" in line
    assert not (tmp_path / "wide").exists()
    # same tensor shapes, another function: 4 heads of 16 channels instead of 2 of 32
    assert main(fit(tmp_path, "heads", f"--resume={ckpt}", "--model.backbone_kwargs.num_heads=4")) == 2
    line = error_line(capsys)
    assert f"--resume {ckpt} does not fit the model: same tensor shapes" in line
    assert "model.backbone_kwargs.num_heads: 2 in the checkpoint, 4 now" in line and "drop_path" not in line, line
    assert not (tmp_path / "heads").exists()
    assert main(fit(tmp_path, "reg", f"--resume={ckpt}", "--model.backbone_kwargs.drop_path_rate=0.0")) == 0
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(ckpt.read_bytes()[:5000])
    assert main(fit(tmp_path, "t", f"--resume={truncated}")) == 2
    assert f"--resume {truncated}: not a readable checkpoint (truncated" in error_line(capsys)
    assert main(fit(tmp_path, "t", f"--resume={tmp_path / 'missing.ckpt'}")) == 2
    assert "no such checkpoint" in error_line(capsys)


def test_read_only_runs_dir_is_one_line(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {proc.stderr.decode().strip()}")
    try:
        assert main(fit(ro, "x")) == 1
        line = error_line(capsys)
        assert f"cannot write {ro / 'x'}: read-only file system" in line
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_yaml_syntax_error_names_the_recipe_and_no_args_warning(tmp_path, capsys):
    bad = tmp_path / "broken.yaml"
    bad.write_text(TINY.read_text().replace("max_epochs: 2", "max_epochs: [2"))
    assert main(["fit", "--recipe", str(bad), f"--runs_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "invalid YAML" in err and "<unicode string>" not in err
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert main(fit(tmp_path, "quiet", "--trainer.fast_dev_run=true")) == 0
    assert record  # warnings are recorded here (Lightning emits others) ...
    assert not [w for w in record if "LightningCLI's args parameter" in str(w.message)]  # ... but not this one


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="unknown init method"):
        main([*fit(tmp_path, "dbg", "--model.init.method=nosuch"), "--debug"])
    assert torch.is_tensor(torch.zeros(1))  # the process is intact after the error


# ------------------------------------------------------------------------------------------- divergence (NaN guard)
DIVERGE = ("--model.optimizer.lr=1e2", "--model.scheduler.warmup_epochs=1.25", "--trainer.max_epochs=4")


def _all_finite(folder: Path) -> dict[str, bool]:
    return {p.name: all(torch.isfinite(v).all() for v in torch.load(p, map_location="cpu", weights_only=False)
                        ["state_dict"].values() if v.is_floating_point()) for p in sorted(folder.glob("*.ckpt"))}


@pytest.mark.parametrize("check", ["every_step", "next_step"])
def test_divergence_stops_with_one_line_and_every_checkpoint_stays_finite(tmp_path, capsys, check):
    """A finite but huge loss whose update gives NaN weights (the issue's reproduction): the run stops at that step
    with one line naming the good checkpoint, and no checkpoint writer ever wrote a non-finite state — every_step
    saves last_good.ckpt before the update; next_step (one step late, as on GPUs) refuses last.ckpt at the bad
    step (written every step here) and names the previous one."""
    extra = ["--trainer.callbacks+=impulsevit.callbacks.NonFiniteLossGuard", f"--trainer.callbacks.check={check}"]
    if check == "next_step":
        extra.append("--checkpoint.every_n_train_steps=1")
    assert main(tiny(tmp_path, "nan", *DIVERGE, *extra)) == 1
    line = error_line(capsys)
    ckdir = tmp_path / "nan" / "checkpoints"
    assert "training diverged: non-finite" in line and "at optimizer step 3 (epoch 0, batch 3)" in line, line
    good = ckdir / ("last_good.ckpt" if check == "every_step" else "last.ckpt")
    assert f"--resume {good}" in line, line
    finite = _all_finite(ckdir)
    assert good.name in finite and all(finite.values()), finite
