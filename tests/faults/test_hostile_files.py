"""Fault class "hostile file": a checkpoint (or distributed-checkpoint folder, or dataset file) whose pickle runs code
when loaded, given to every subcommand that reads one.

Each case runs the real ``impulsevit`` command as a child in its own session (``harness.run``) and asserts: exit
status 2 (the refusal is a ``ConfigError``: found before any work), one error line naming the file, what it would
have called and ``--trust-checkpoint`` (not for data files), the marker file the pickle would create does not exist,
the folder the command ran in is exactly as before (nothing written, nothing left behind) and no process survives.
``--trust-checkpoint`` (and ``IMPULSEVIT_TRUST_CHECKPOINT=1``) load a benign legacy file (a real checkpoint plus an
``argparse.Namespace``, as timm's training checkpoints hold) that is refused without it (those runs are in this
process: what is checked is the loading, not the process).

Two real checkpoints are shared by the module, trained in this process: a 1-step tiny fit (a ``.ckpt`` file) and a
1-step ``fsdp2`` fit (a DCP folder). DCP folders are checked through ``export``, ``predict`` and ``fit`` (one
subcommand per kind of hostile part: they share one loader, ``impulsevit.safe_load``).
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from _cli_helpers import run_cli

from faults.harness import (
    TINY,
    assert_no_survivors,
    assert_one_line_error,
    evil_pickle,
    run,
    snapshot,
    write_evil_checkpoint,
)
from impulsevit.safe_load import load_checkpoint, trust_requested

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

STEP = ("--trainer.max_steps=1", "--trainer.limit_val_batches=1")
REFUSED = ("refused to load", "--trust-checkpoint")


def _fit(runs: Path, name: str, *extra: str) -> Path:
    """A real run in this process (no interpreter start-up to pay): its run directory."""
    run_cli("fit", "--recipe", str(TINY), f"--runs_dir={runs}", f"--name={name}", *STEP, *extra)
    return runs / name


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict[str, Path]:
    """``{"run": run dir of a 1-step tiny fit, "ckpt": its last.ckpt, "dcp": the last.ckpt folder of a 1-step fsdp2
    fit, "images": a folder with one image}``."""
    base = tmp_path_factory.mktemp("real")
    runs = base / "runs"
    run_dir = _fit(runs, "tiny")
    dcp_run = _fit(runs, "fsdp", "--trainer.strategy=fsdp2", "--model.ema_decay=null")
    images = base / "images"
    images.mkdir()
    from PIL import Image

    Image.new("RGB", (40, 40), (200, 30, 30)).save(images / "a.png")
    return {"run": run_dir, "ckpt": run_dir / "checkpoints" / "last.ckpt",
            "dcp": dcp_run / "checkpoints" / "last.ckpt", "images": images}


def test_the_projects_own_checkpoints_load_without_trust(real):
    """What fit writes today (a file, and a DCP folder's metadata, entries and meta.pt) passes the safe loader with
    nothing on its allow-list beyond torch's weights_only defaults."""
    from impulsevit.safe_load import SAFE_GLOBALS, check_distributed_checkpoint, load_distributed_checkpoint

    assert SAFE_GLOBALS == ()
    assert load_checkpoint(real["ckpt"], mmap=True, trust=False)["global_step"] == 1
    check_distributed_checkpoint(real["dcp"], trust=False)
    assert load_distributed_checkpoint(real["dcp"], trust=False)["global_step"] == 1


def _refused(res, marker: Path, before: dict[str, str], cwd: Path, *needles: str) -> str:
    """The command refused in one line (exit 2) naming ``needles``; nothing ran, nothing changed under ``cwd``."""
    line = assert_one_line_error(res, 2, *REFUSED, *needles)
    assert not marker.exists(), f"the hostile pickle ran: {marker} exists"
    assert snapshot(cwd) == before, "the refused command changed files"
    assert_no_survivors(res.sid)
    return line


def _evil(path: Path, marker: Path, real_ckpt: Path) -> Path:
    """A hostile checkpoint that otherwise looks like the real one (its entries, a higher step)."""
    base = load_checkpoint(real_ckpt)
    base["global_step"] = base["global_step"] + 100
    return write_evil_checkpoint(path, marker, base=base)


@pytest.fixture
def work(tmp_path) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    return w


# ---------------------------------------------------------------------------------------------- checkpoint files
@pytest.mark.parametrize("argv", [
    ("fit", "--resume", "{evil}"),
    ("test", "--resume", "{evil}"),
    ("validate", "--ckpt_path", "{evil}"),
])
def test_trainer_subcommands_refuse_a_checkpoint_that_runs_code(real, work, argv):
    marker = work.parent / "ran"
    evil = _evil(work / "evil.ckpt", marker, real["ckpt"])
    before = snapshot(work)
    args = [a.format(evil=evil) for a in argv]
    res = run(*args, "--recipe", str(TINY), f"--runs_dir={work / 'runs'}", "--name=victim", *STEP, cwd=work)
    _refused(res, marker, before, work, str(evil), "posix.system")


def test_fit_resume_auto_refuses_a_hostile_file_planted_in_the_run(real, work):
    marker = work.parent / "ran"
    run_dir = work / "runs" / "tiny"
    shutil.copytree(real["run"], run_dir)
    evil = _evil(run_dir / "checkpoints" / "epoch=9-step=999.ckpt", marker, real["ckpt"])
    before = snapshot(work)
    res = run("fit", "--recipe", str(TINY), f"--runs_dir={work / 'runs'}", "--name=tiny", "--resume", "auto", *STEP,
              cwd=work)
    _refused(res, marker, before, work, str(evil))


@pytest.mark.parametrize("sub", ["export", "predict"])
def test_export_and_predict_refuse_a_checkpoint_that_runs_code(real, work, sub):
    marker = work.parent / "ran"
    evil = _evil(work / "evil.ckpt", marker, real["ckpt"])
    target = [str(work / "out")] if sub == "export" else [str(real["images"]), "--out", str(work / "p.csv")]
    before = snapshot(work)
    res = run(sub, str(evil), *target, cwd=work)
    _refused(res, marker, before, work, str(evil), "posix.system")


# ---------------------------------------------------------------------------------------------- distributed checkpoints
def _hostile_metadata(real_dcp: Path, folder: Path, marker: Path) -> Path:
    shutil.copytree(real_dcp, folder)
    (folder / ".metadata").write_bytes(evil_pickle(marker))
    return folder


def _hostile_entry(real_dcp: Path, folder: Path, marker: Path) -> Path:
    """The real folder whose first non-tensor entry (an optimizer setting) is a pickle that runs code: a new shard
    file, and the metadata (written by DCP's own classes) pointing the entry at it."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    shutil.copytree(real_dcp, folder)
    with open(folder / ".metadata", "rb") as fh:
        meta = pickle.load(fh)  # our own file, written by the fixture's fit
    index = next(i for i in meta.storage_data if isinstance(meta.state_dict_metadata[i.fqn], BytesStorageMetadata))
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)
    (folder / "__9_0.distcp").write_bytes(buf.getvalue())
    info = meta.storage_data[index]
    info.relative_path, info.offset, info.length = "__9_0.distcp", 0, len(buf.getvalue())
    with open(folder / ".metadata", "wb") as fh:
        pickle.dump(meta, fh)
    return folder


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("sub", ["export", "fit"])
def test_a_distributed_checkpoint_with_hostile_metadata_is_refused(real, work, sub):
    marker = work.parent / "ran"
    folder = _hostile_metadata(real["dcp"], work / "dcp.ckpt", marker)
    before = snapshot(work)
    if sub == "export":
        res = run("export", str(folder), str(work / "out"), cwd=work)
    else:
        res = run("fit", "--recipe", str(TINY), f"--runs_dir={work / 'runs'}", "--name=victim", "--resume",
                  str(folder), "--trainer.strategy=fsdp2", "--model.ema_decay=null", *STEP, cwd=work)
    _refused(res, marker, before, work, str(folder / ".metadata"), "posix.system")


def test_a_distributed_checkpoint_with_a_hostile_entry_is_refused(real, work):
    marker = work.parent / "ran"
    folder = _hostile_entry(real["dcp"], work / "dcp.ckpt", marker)
    before = snapshot(work)
    res = run("predict", str(folder), str(real["images"]), "--out", str(work / "p.csv"), cwd=work)
    _refused(res, marker, before, work, str(folder), "optimizer", "posix.system")


# ---------------------------------------------------------------------------------------------- trusted legacy files
@pytest.fixture(scope="module")
def legacy(real, tmp_path_factory) -> Path:
    """The real checkpoint plus an ``argparse.Namespace`` (benign, but not what weights_only accepts)."""
    ckpt = load_checkpoint(real["ckpt"])
    ckpt["args"] = argparse.Namespace(lr=0.1)
    path = tmp_path_factory.mktemp("legacy") / "legacy.ckpt"
    torch.save(ckpt, path)
    return path


def test_a_legacy_checkpoint_is_refused_then_resumed_with_trust(legacy, work):
    common = ("--recipe", str(TINY), f"--runs_dir={work / 'runs'}", "--name=cont", "--resume", str(legacy),
              "--trainer.max_steps=2", "--trainer.limit_val_batches=1")
    before = snapshot(work)
    res = run("fit", *common, cwd=work)
    assert_one_line_error(res, 2, str(legacy), "argparse.Namespace", "--trust-checkpoint")
    assert snapshot(work) == before
    cli = run_cli("fit", *common, "--trust-checkpoint")  # in this process: the trust ends with the command
    assert cli.trainer.global_step == 2 and not trust_requested()
    assert load_checkpoint(work / "runs" / "cont" / "checkpoints" / "last.ckpt")["global_step"] == 2
    assert "trust" not in (work / "runs" / "cont" / "config.yaml").read_text()  # not part of the run's config


def test_export_and_predict_load_a_legacy_checkpoint_with_trust(legacy, real, work, monkeypatch, capsys):
    from impulsevit.cli import main

    assert main(["export", str(legacy), str(work / "out")]) == 2
    assert "--trust-checkpoint" in capsys.readouterr().err and not (work / "out").exists()
    assert main(["export", str(legacy), str(work / "out"), "--trust-checkpoint"]) == 0
    assert (work / "out" / "model.safetensors").is_file()
    monkeypatch.setenv("IMPULSEVIT_TRUST_CHECKPOINT", "1")
    assert main(["predict", str(legacy), str(real["images"]), "--out", str(work / "p.csv")]) == 0
    assert (work / "p.csv").read_text().startswith("path,")


# ------------------------------------------------------------------------------------- files that are no checkpoint
def _foreign_files(folder: Path, marker: Path) -> dict[str, tuple[Path, str]]:
    """``{case: (file, what the error line must say)}``: random bytes, and a plain (protocol-4) pickle whose global
    would run code: torch's weights-only loader refuses both with its own "Please file an issue" text."""
    rand = folder / "random.pth"
    rand.write_bytes(bytes(range(256)) * 16)  # opcode 0 is not a pickle opcode: no pickle, no torch.save file
    plain = folder / "plain.pth"
    plain.write_bytes(pickle.dumps({"x": _Touch(str(marker))}, protocol=4))
    return {"random": (rand, "neither a torch.save file nor a pickle"),
            "plain pickle": (plain, "a plain pickle, not a torch.save file, and holds code that will not be run")}


class _Touch:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("sub", ["pretrained", "export"])
def test_a_file_that_is_no_checkpoint_is_one_line_saying_what_it_is_without_the_trust_hint(sub, work, tmp_path):
    marker = tmp_path / "pwned"
    for case, (path, says) in _foreign_files(tmp_path, marker).items():
        before = snapshot(work)
        if sub == "pretrained":
            res = run("fit", "--recipe", str(TINY), "--runs_dir=runs", "--name=t", *STEP,
                      f"--model.pretrained={path}", cwd=work)
        else:
            res = run("export", str(path), "out", cwd=work)
        line = assert_one_line_error(res, 2, str(path), says)
        assert "--trust-checkpoint" not in line and "Please file an issue" not in res.err, (case, res.err)
        assert "Detected pickle protocol" not in res.err, res.err  # torch's warning before its refusal: not shown
        assert snapshot(work) == before and not marker.exists()
        assert_no_survivors(res.sid)
