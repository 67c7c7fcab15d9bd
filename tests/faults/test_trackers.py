"""Faults around trackers (``--tracker``, impulsevit/training/trackers.py), through the real command in its own
session: a
wrong tracker name is one line before any work. (A SIGTERM mid-fit with W&B / MLflow on, and no process left behind:
tests/training/test_trackers.py, whose preempted runs go through this harness.)"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import socket
import sys

import pytest

from faults.harness import (
    TINY,
    assert_no_survivors,
    assert_one_line_error,
    run,
    snapshot,
)

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


def test_unknown_tracker_is_one_line_and_writes_nothing(tmp_path):
    before = snapshot(tmp_path)
    res = run("fit", "--recipe", TINY, "--runs_dir=runs", "--name=t", "--tracker=wandb,tensorbored", cwd=tmp_path)
    assert_one_line_error(res, 2, "--tracker 'tensorbored'", "unknown tracker")
    assert_no_survivors(res.sid)
    assert snapshot(tmp_path) == before


def _new_user(tmp_path) -> dict[str, str]:  # noqa: ANN001
    """The environment of a user who never logged in to W&B: a home without ``.netrc`` or W&B settings, no
    ``WANDB_*`` key or mode."""
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "NETRC": str(home / ".netrc"), "WANDB_CONFIG_DIR": str(home / ".config" / "wandb"),
            "WANDB_API_KEY": "", "WANDB_MODE": "", "WANDB_IDENTITY_TOKEN_FILE": ""}


def test_wandb_without_a_login_is_refused_before_work_saying_what_to_set(tmp_path):
    env = _new_user(tmp_path)
    before = snapshot(tmp_path)
    res = run("fit", "--recipe", TINY, "--runs_dir=runs", "--name=t", "--tracker=wandb", cwd=tmp_path, extra_env=env)
    assert [ln for ln in res.err_lines if ln != "Seed set to 0"] == res.err_lines[-1:], res.err
    assert_one_line_error(res, 2, "impulsevit fit: error: --tracker wandb: W&B has no API key here",
                          "`wandb login`", "WANDB_API_KEY", "WANDB_MODE=offline")
    assert_no_survivors(res.sid)
    assert snapshot(tmp_path) == before  # no run folder, no wandb/ folder


def test_mlflow_at_a_server_that_does_not_answer_is_refused_before_work_naming_the_uri(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    before = snapshot(tmp_path)
    res = run("fit", "--recipe", TINY, "--runs_dir=runs", "--name=t", "--tracker=mlflow", cwd=tmp_path,
              extra_env={"MLFLOW_TRACKING_URI": uri})
    assert [ln for ln in res.err_lines if ln != "Seed set to 0"] == res.err_lines[-1:], res.err
    assert_one_line_error(res, 2, f"--tracker mlflow: the MLflow tracking server MLFLOW_TRACKING_URI={uri} does not "
                                  "answer", "refused")
    assert_no_survivors(res.sid)
    assert snapshot(tmp_path) == before


def test_a_tracker_with_every_logger_off_is_a_contradiction_refused_before_work(tmp_path):
    before = snapshot(tmp_path)
    res = run("fit", "--recipe", TINY, "--runs_dir=runs", "--name=t", "--tracker=wandb", "--trainer.logger=false",
              cwd=tmp_path, extra_env={"WANDB_MODE": "offline"})
    assert_one_line_error(res, 2, "--tracker wandb with --trainer.logger=false")
    assert_no_survivors(res.sid)
    assert snapshot(tmp_path) == before


class _NoWandb(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name.split(".")[0] == "wandb":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_a_logger_class_whose_package_is_not_installed_names_the_extra_before_work(tmp_path, monkeypatch, capsys):
    """``--trainer.logger+=WandbLogger`` (as docs/usage.md shows) on a machine where wandb was never installed (its
    import fails and its distribution is unknown, which is what Lightning's ``WandbLogger`` checks): the extra to
    install, not jsonargparse's "Not a valid subclass of Logger". In this process (``main``, the real command's
    entry), where the package can be hidden."""
    from impulsevit.cli import main

    for mod in [m for m in sys.modules if m.split(".")[0] == "wandb"]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(sys, "meta_path", [_NoWandb(), *sys.meta_path])
    version = importlib.metadata.version

    def without_wandb(name: str) -> str:
        if name == "wandb":
            raise importlib.metadata.PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(importlib.metadata, "version", without_wandb)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    rc = main(["fit", "--recipe", str(TINY), "--runs_dir=runs", "--name=t", "--trainer.logger+=WandbLogger"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and err[-1].startswith("impulsevit fit: error: --trainer.logger WandbLogger: "), err
    assert "the 'wandb' package is not installed" in err[-1] and "pip install 'impulsevit[wandb]'" in err[-1], err
    assert "Not a valid subclass" not in "\n".join(err)
    assert not [ln for ln in err if "GPU available" in ln], err  # refused before the trainer was built
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize("where", ["fit overrides", "--then-args"])
def test_study_checks_the_tracker_once_before_the_first_run(tmp_path, where):
    """``study --tracker wandb`` without a W&B login: fit's one line, exit 2, before any run starts (no study folder,
    no ``study_fit.log``), not one failure per run with the reason in each run's log."""
    env = _new_user(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    tracker = ["--tracker", "wandb"] if where == "fit overrides" else ["--then", str(TINY),
                                                                       "--then-args=--tracker wandb"]
    res = run("study", "--recipe", TINY, "--runs-dir=runs", "--methods=impulse,random", "--seeds=1", *tracker,
              cwd=work, extra_env=env)
    assert_one_line_error(res, 2, "impulsevit study: error: --tracker wandb: W&B has no API key here")
    assert_no_survivors(res.sid)
    assert snapshot(work) == {}
