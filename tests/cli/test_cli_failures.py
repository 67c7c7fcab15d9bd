"""When things go wrong, through the real ``impulsevit`` entry point (``main``): one-line errors with the right exit
status before any work, nothing half-made, one owner per run directory, smoke runs that ``--resume auto`` skips.

Each test reproduces a case of the "when things go wrong" report (full disks and damaged ``.beton`` files:
``data/storage/test_disk_and_beton_failures.py``; ``submit --dry-run``: ``cli/test_submit.py``).
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
from _cli_helpers import TINY, scalars, tiny

from impulsevit.cli import main
from impulsevit.run.rundir import LOCK_NAME
from impulsevit.training.checkpointing import latest_checkpoint

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

SHORT = ("--trainer.max_epochs=1", "--data.init_args.num_train=32", "--data.init_args.num_val=16")


def fit(runs: Path, name: str, *extra: str, sub: str = "fit") -> list[str]:
    return tiny(runs, name, *SHORT, *extra, subcommand=sub)


def status(args: list[str]) -> int:
    """``main(args)``'s exit status; a parse error leaves ``main`` as ``SystemExit(2)`` (the console script)."""
    try:
        return main(args)
    except SystemExit as e:
        return int(e.code or 0)


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
    assert main(fit(tmp_path, "busy", "--resume=auto", "--trainer.max_epochs=2")) == 0  # (not finished: trains)
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

    # Lightning's --ckpt_path is not a way into an existing run: refused like a new run, pointing to --resume (and,
    # as the checkpoint is in the run, not even with --overwrite, which would delete it); bytes and mtimes unchanged
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    last = run / "checkpoints" / "last.ckpt"
    for extra in ((), ("--overwrite",)):
        assert main(fit(tmp_path, "twice", f"--ckpt_path={last}", *extra)) == 2
        line = error_line(capsys)
        assert f"run directory {run} already holds a run" in line and "--ckpt_path does not continue a run" in line
        assert "--resume auto" in line and f"--resume {last}" in line
        assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files

    (run / "hparams.yaml").write_text("stale: true\n")
    # the bare flag the message suggests (`--overwrite=true` works too)
    assert main(fit(tmp_path, "twice", "--overwrite", "--model.optimizer.lr=0.002")) == 0
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
    # explicitly asked for: the untrained model (the bare flag the message suggests, or with a value)
    assert main(fit(tmp_path, "ev", "--untrained", sub="validate")) == 0
    assert main(fit(tmp_path, "ev", "--untrained=true", sub="validate")) == 0


# -------------------------------------------------------------------------- 8: clear errors before any work
def _ffcv_imagefolder(tmp_path: Path, classes: int) -> list[str]:
    """Data options for an FFCV ImageFolder run whose cache directory must stay empty when validation fails."""
    from _image_files import save_jpeg

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
    from _image_files import save_jpeg

    from impulsevit.data.storage.convert_cli import main as convert_main

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
    # a run folder stands for its latest checkpoint: the same check, the same refusal, naming that checkpoint
    latest = latest_checkpoint(tmp_path / "small")
    assert main(fit(tmp_path, "wide2", f"--resume={tmp_path / 'small'}", "--model.backbone_kwargs.embed_dim=32")) == 2
    assert f"--resume {latest} does not fit the model" in error_line(capsys)
    assert main(fit(tmp_path, "small", f"--resume={tmp_path / 'small'}", sub="test")) == 0


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
    # (Lightning's srun hint and _pytree deprecation, recorded here before, are silenced by impulsevit now)
    assert not [w for w in record if "LightningCLI's args parameter" in str(w.message)]


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


# ------------------------------------------------------------------- bad arguments: one line, no usage, nothing made
def _empty_recipe(tmp: Path) -> str:
    (tmp / "empty.yaml").write_text("")
    return str(tmp / "empty.yaml")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--trainer.max_epoch=1"], "unknown key 'trainer.max_epoch'; did you mean 'trainer.max_epochs'?"),
        (["--trainer.max_epochs=abc"], "key 'trainer.max_epochs': value 'abc' is not valid (expected int | None)"),
        (["--model.optimizer.lr=abc"], "key 'model.optimizer.lr': value 'abc' is not valid (expected float | None)"),
        (["--data.init_args.image_size=abc"], "key 'data.init_args.image_size': value 'abc' is not valid"),
        (["--model.init.metod=impulse"], "unknown key 'model.init.metod'; did you mean 'model.init.method'?"),
        (["--overwrite=maybe"], "--overwrite"),
    ],
    ids=["unknown-key", "wrong-type", "wrong-type-nested", "wrong-type-data", "unknown-nested", "bad-flag-value"],
)
def test_bad_keys_and_values_are_one_line_without_the_usage(tmp_path, capsys, extra, expected):
    assert status(fit(tmp_path / "runs", "bad", *extra)) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and lines[0].startswith("impulsevit fit: error: ") and expected in lines[0], err
    assert "usage:" not in err and "Traceback" not in err and "Given value type" not in err
    assert "(valid keys: impulsevit fit --help)" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_an_empty_recipe_names_the_file(tmp_path, capsys):
    empty = _empty_recipe(tmp_path)
    assert status(["fit", "--recipe", empty, f"--runs_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert f"error: recipe {empty} is empty (expected keys such as trainer:, model:, data:)" in err
    assert len(err.strip().splitlines()) == 1 and "Unexpected config" not in err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------- a failed or refused start leaves nothing that blocks the retry
def _folder_data(tmp_path: Path, root: Path, backend: str = "torchvision", **extra: object) -> str:
    """``--data=...`` for a torchvision ImageFolder run on ``root`` (32 px, 2 images a batch)."""
    data = {"class_path": "impulsevit.data.ImageDataModule",
            "init_args": {"dataset": "imagefolder", "root": str(root), "backend": backend, "image_size": 32,
                          "batch_size": 2, "num_workers": 0, "cache_dir": str(tmp_path / "cache"), **extra}}
    return f"--data={json.dumps(data)}"


def _image_tree(root: Path, classes: int = 2, per_class: int = 2) -> Path:
    from _image_files import save_jpeg

    for split in ("train", "val"):
        for c in range(classes):
            for j in range(per_class):
                save_jpeg(root / split / f"c{c}" / f"{j}.jpg", h=32, w=32, seed=10 * c + j)
    return root


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


@pytest.mark.parametrize(
    ("case", "status_", "expected"),
    [
        ("missing-root", 2, "data.root {tmp}/nothere does not exist (dataset 'imagefolder'; expected "
                            "{tmp}/nothere/train/<class>/<image> and {tmp}/nothere/val/<class>/<image>)"),
        ("empty-imagefolder", 2, "ImageFolder root {tmp}/empty has no train/ folder (expected "
                                 "{tmp}/empty/train/<class>/<image> and {tmp}/empty/val/<class>/<image>)"),
        ("no-val-split", 2, "ImageFolder root {tmp}/noval has no val/ folder"),
        ("no-class-folders", 2, "ImageFolder {tmp}/noclass/train has no class sub-folders"),
        ("fashion-mnist-root-without-files", 1, "dataset 'fashion_mnist', split 'train': missing "
                                                "train-images-idx3-ubyte[.gz] under {tmp}/fm"),
        ("resume-a-folder", 2, "--resume {tmp}/adir: a folder, not a checkpoint"),
        ("runs-dir-is-a-file", 2, "--runs_dir {tmp}/afile/runs: {tmp}/afile is a file, not a folder"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " not in v else "",
)
def test_a_failed_start_is_one_line_leaves_nothing_and_the_retry_runs(tmp_path, capsys, case, status_, expected):
    """Bad data roots (found at construction or, for a dataset's own files, while loading: after the event file was
    opened), a folder given to --resume and a --runs_dir that is a file: one line naming the path, exit status, no
    run directory left (nor the --runs_dir parent the command created), and the same command with the mistake fixed
    starts (not refused as "already holds a run")."""
    runs = tmp_path / "runs" / "nested"
    good = _folder_data(tmp_path, _image_tree(tmp_path / "imgs"))
    data, extra = good, []
    (tmp_path / "empty").mkdir()
    (tmp_path / "noval" / "train" / "c0").mkdir(parents=True)
    (tmp_path / "noclass" / "train").mkdir(parents=True)
    (tmp_path / "noclass" / "val").mkdir(parents=True)
    (tmp_path / "fm").mkdir()
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    roots = {"missing-root": "nothere", "empty-imagefolder": "empty", "no-val-split": "noval",
             "no-class-folders": "noclass"}
    if case in roots:
        data = _folder_data(tmp_path, tmp_path / roots[case])
    elif case == "fashion-mnist-root-without-files":
        data = _folder_data(tmp_path, tmp_path / "fm").replace('"imagefolder"', '"fashion_mnist"')
    elif case == "resume-a-folder":
        extra = [f"--resume={tmp_path / 'adir'}"]
    before = _files(tmp_path)
    bad_runs = tmp_path / "afile" / "runs" if case == "runs-dir-is-a-file" else runs
    assert status(tiny(bad_runs, "r", *SHORT, data, *extra)) == status_
    assert expected.format(tmp=tmp_path) in error_line(capsys)
    assert _files(tmp_path) == before  # nothing written or removed: no run dir, no lock, no cache, no runs/ parent
    assert status(tiny(runs, "r", *SHORT, good)) == 0  # the retry is not refused
    assert (runs / "r" / "checkpoints" / "last.ckpt").is_file()


def test_a_failed_resume_adds_nothing_to_the_run(tmp_path, capsys):
    """A resume that fails in setup (after Lightning opened a new event file) takes that file back: the run holds what
    it held, and ``--resume auto`` with the mistake fixed continues it."""
    good = _folder_data(tmp_path, _image_tree(tmp_path / "imgs", classes=10, per_class=1))  # Fashion-MNIST's 10
    assert status(tiny(tmp_path, "r", *SHORT, good)) == 0
    (tmp_path / "fm").mkdir()
    bad = _folder_data(tmp_path, tmp_path / "fm").replace('"imagefolder"', '"fashion_mnist"')
    before = _files(tmp_path / "r")
    assert status(tiny(tmp_path, "r", *SHORT, bad, "--resume=auto", "--trainer.max_epochs=2")) == 1
    assert f"missing train-images-idx3-ubyte[.gz] under {tmp_path / 'fm'}" in error_line(capsys)
    assert _files(tmp_path / "r") == before
    assert status(tiny(tmp_path, "r", "--trainer.max_epochs=2", good, "--resume=auto")) == 0
    assert len(list((tmp_path / "r").glob("events.out.tfevents.*"))) == 2


def test_a_dangling_best_ckpt_link_is_named_not_a_traceback(tmp_path, capsys):
    """A ``best.ckpt`` link whose target was deleted: ``--resume auto`` passes over it with one line and continues from
    ``last.ckpt``; given to ``--resume`` it is one error line naming the link and its target."""
    assert main(fit(tmp_path, "dl", "--trainer.limit_train_batches=0.5")) == 0
    link = tmp_path / "dl" / "checkpoints" / "best.ckpt"
    link.symlink_to("epoch=9-step=99.ckpt")
    seen = _Lines()
    logging.getLogger("impulsevit").addHandler(seen)
    try:
        assert main(fit(tmp_path, "dl", "--trainer.limit_train_batches=0.5", "--trainer.max_epochs=2",
                        "--resume=auto")) == 0
    finally:
        logging.getLogger("impulsevit").removeHandler(seen)
    assert seen.lines.count(f"impulsevit: --resume auto: skipped {link}: a broken link (to epoch=9-step=99.ckpt)") == 1
    capsys.readouterr()
    assert main(fit(tmp_path, "dl", f"--resume={link}", sub="test")) == 2
    assert f"--resume '{link}': a broken link (to epoch=9-step=99.ckpt, which does not exist)" in \
        error_line(capsys, "test")
    assert link.is_symlink()  # not ours to remove


def test_a_changed_batch_size_on_a_mid_epoch_resume_is_one_line_before_work(tmp_path, capsys):
    stop = '--trainer.callbacks=[{"class_path": "_cli_helpers.StopAfterStep", "init_args": {"step": 1}}]'
    assert main(fit(tmp_path, "mid", stop)) == 0  # 2 steps an epoch: last.ckpt is 1 batch into epoch 0
    before = _files(tmp_path / "mid")
    assert main(fit(tmp_path, "mid", "--resume=auto", "--data.init_args.batch_size=8")) == 2
    line = error_line(capsys)
    assert "the checkpoint was taken 1 batches into epoch 0 with data.batch_size 16, this run has 8" in line
    assert "resume with data.init_args.batch_size=16" in line and str(tmp_path / "mid" / "checkpoints") in line
    assert _files(tmp_path / "mid") == before
    assert main(fit(tmp_path, "mid", "--resume=auto")) == 0  # with the checkpoint's batch size it continues


def test_resume_auto_on_a_finished_run_says_so_and_does_no_work(tmp_path):
    assert main(fit(tmp_path, "done")) == 0
    before = _files(tmp_path / "done")
    seen = _Lines()
    logging.getLogger("impulsevit").addHandler(seen)
    try:
        assert main(fit(tmp_path, "done", "--resume=auto")) == 0
    finally:
        logging.getLogger("impulsevit").removeHandler(seen)
    assert [ln for ln in seen.lines if "is finished" in ln] == [
        f"impulsevit: {tmp_path / 'done'} is finished (1 of max_epochs 1 epochs done; "
        f"{tmp_path / 'done' / 'checkpoints' / 'last.ckpt'}): nothing to resume; raise --trainer.max_epochs to train "
        f"on, or evaluate it: impulsevit test ... --resume auto"]
    assert _files(tmp_path / "done") == before  # no sanity check, no new event file, config untouched
    assert main(fit(tmp_path, "done", "--resume=auto", "--trainer.max_epochs=2")) == 0  # a longer plan trains on
    assert len(list((tmp_path / "done").glob("events.out.tfevents.*"))) == 2


def test_fit_ends_on_a_summary_without_lightnings_noise(tmp_path, capsys, caplog):
    """The end-of-run summary (run dir, best / last checkpoint, final val top-1, TensorBoard command); no litlogger tip,
    no srun hint, no ``_pytree`` deprecation, no "`weights_only` was not set" after each checkpoint, no notice that
    the console callbacks replace Lightning's defaults, no "0 Total Flops"."""
    seen = _Lines()
    logging.getLogger("impulsevit").addHandler(seen)
    try:
        with warnings.catch_warnings(record=True) as record, caplog.at_level(logging.INFO):
            warnings.simplefilter("always")
            assert main(fit(tmp_path, "sum", "--trainer.max_epochs=2", "--trainer.enable_progress_bar=true",
                            "--trainer.enable_model_summary=true")) == 0
    finally:
        logging.getLogger("impulsevit").removeHandler(seen)
    run = tmp_path / "sum"
    text = "\n".join([*(r.getMessage() for r in caplog.records), capsys.readouterr().err,
                      *(str(w.message) for w in record)])
    for noise in ("Tip: For seamless cloud", "The `srun` command is available", "LeafSpec",
                  "`weights_only` was not set", "will override existing callbacks", "0         Total Flops"):
        assert noise not in text, noise
    summary = next(ln for ln in seen.lines if ln.startswith("impulsevit: run finished"))
    best = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["callbacks"]
    score = next(v["best_model_score"] for k, v in best.items() if k.startswith("RunCheckpoint"))
    assert summary.splitlines() == [
        f"impulsevit: run finished: {run}",
        f"  best checkpoint: {next(v['best_model_path'] for k, v in best.items() if k.startswith('RunCheckpoint'))} "
        f"(val/acc1 {float(score):.4f})",
        f"  last checkpoint: {run / 'checkpoints' / 'last.ckpt'}",
        f"  final val/acc1:  {scalars(run, 'val/acc1')[-1][1]:.4f} (after 2 epoch(s), step 4)",
        f"  TensorBoard:     tensorboard --logdir {tmp_path}"]
