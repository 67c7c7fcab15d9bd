"""Faults around trackers (``--tracker``, impulsevit/training/trackers.py), through the real command in its own
session: a
wrong tracker name is one line before any work. (A SIGTERM mid-fit with W&B / MLflow on, and no process left behind:
tests/training/test_trackers.py, whose preempted runs go through this harness.)"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from faults.harness import (
    TINY,
    assert_no_survivors,
    assert_one_line_error,
    kill_session,
    run,
    snapshot,
    start,
    wait_for,
)
from impulsevit.safe_load import load_checkpoint

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


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder nobody can write: a read-only tmpfs (as root, whom file modes do not stop), else mode 0o555."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({proc.stderr.strip() or proc.returncode})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_mlflow_sqlite_store_in_a_read_only_folder_is_one_line_before_work(tmp_path, read_only_folder):
    uri = f"sqlite:///{read_only_folder / 'mlflow.db'}"
    work = tmp_path / "work"
    work.mkdir()
    res = run("fit", "--recipe", TINY, "--runs_dir=runs", "--name=t", "--tracker=mlflow", cwd=work,
              extra_env={"MLFLOW_TRACKING_URI": uri})
    assert_one_line_error(res, 2, f"--tracker mlflow: MLFLOW_TRACKING_URI={uri}", str(read_only_folder),
                          "is not writable")
    assert [ln for ln in res.err_lines if ln != "Seed set to 0"] == res.err_lines[-1:], res.err
    assert_no_survivors(res.sid)
    assert snapshot(work) == {}


def test_mlflow_uri_of_a_plain_web_server_is_one_line_before_work(tmp_path):
    """A loopback ``http.server`` (404 for every MLflow path) given as MLFLOW_TRACKING_URI."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    work = tmp_path / "work"
    work.mkdir()
    try:
        res = run("fit", "--recipe", TINY, "--runs_dir=runs", "--name=t", "--tracker=mlflow", cwd=work,
                  extra_env={"MLFLOW_TRACKING_URI": uri})
    finally:
        server.shutdown()
        server.server_close()
    assert_one_line_error(res, 2, f"--tracker mlflow: MLFLOW_TRACKING_URI={uri} is not an MLflow tracking server",
                          "404")
    assert [ln for ln in res.err_lines if ln != "Seed set to 0"] == res.err_lines[-1:], res.err
    assert_no_survivors(res.sid)
    assert snapshot(work) == {}


@pytest.fixture
def mlflow_app(tmp_path, monkeypatch):
    """MLflow's real tracking server app (``mlflow.server.app``: what ``mlflow server`` runs in its workers; SQLite
    store, no job workers) served from a thread of this process on 127.0.0.1 — seconds to start where the
    ``mlflow server`` command takes a minute on a busy machine; yields ``(uri, stop, store)``, ``stop()`` killing it
    (the port then refuses connections), ``store`` the tracking URI of its SQLite database (readable after it died)."""
    pytest.importorskip("mlflow")
    from werkzeug.serving import WSGIRequestHandler, make_server

    home = tmp_path / "mlflow-server"
    home.mkdir()
    environ = dict(os.environ)  # MLflow's server app sets MLFLOW_TRACKING_URI (and more) in this process: put back
    monkeypatch.setenv("_MLFLOW_SERVER_FILE_STORE", f"sqlite:///{home / 'mlflow.db'}")
    monkeypatch.setenv("_MLFLOW_SERVER_ARTIFACT_ROOT", str(home / "artifacts"))
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    from mlflow.server import app

    class Quiet(WSGIRequestHandler):  # this server's request lines off; werkzeug's own class (moto's too) untouched
        def log_request(self, *args: object, **kwargs: object) -> None:
            pass

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stopped = []

    def stop() -> None:
        if not stopped:
            stopped.append(True)
            server.shutdown()
            server.server_close()

    uri = f"http://127.0.0.1:{server.server_port}"
    from mlflow import MlflowClient

    MlflowClient(uri).search_experiments()  # the store exists (its tables created) before the fit starts
    try:
        yield uri, stop, f"sqlite:///{home / 'mlflow.db'}"
    finally:
        stop()
        os.environ.clear()
        os.environ.update(environ)  # later tests on this worker (tests/training/test_trackers.py) see no server


def test_an_mlflow_server_that_dies_mid_run_is_dropped_in_one_line_and_sigterm_stops_the_run(tmp_path, mlflow_app):
    """The MLflow server is killed while the fit trains: within seconds one warning line says it stopped answering,
    training goes on without it (the run's own files keep everything, docs/guarantees.md), and a SIGTERM during the
    outage stops the run in seconds with its checkpoint (exit 143), no traceback, nothing left running."""
    from mlflow import MlflowClient

    uri, stop, store = mlflow_app
    run_dir = tmp_path / "runs" / "m"
    proc = start("fit", "--recipe", TINY, f"--runs_dir={tmp_path / 'runs'}", "--name=m", "--tracker=mlflow",
                 "--trainer.max_epochs=1000", cwd=tmp_path,
                 extra_env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "dies"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for(lambda: (run_dir / "trackers.json").exists() or proc.poll() is not None, timeout=180,
                 what="the MLflow run to start")
        assert proc.poll() is None, "".join(lines)[-3000:]
        rid = json.loads((run_dir / "trackers.json").read_text())["ids"]["mlflow"][0]
        client = MlflowClient(store)
        wait_for(lambda: bool(client.get_metric_history(rid, "train/loss")) or proc.poll() is not None, timeout=120,
                 what="the first training steps in MLflow")
        stop()
        t_stop = time.monotonic()
        said = lambda: [ln for ln in lines if "stopped answering" in ln]  # noqa: E731
        wait_for(lambda: bool(said()) or proc.poll() is not None, timeout=60, what="the fit to notice")
        noticed = time.monotonic() - t_stop
        assert proc.poll() is None, "".join(lines)[-3000:]  # still training
        time.sleep(1.0)
        assert proc.poll() is None, "".join(lines)[-3000:]
        os.kill(proc.pid, signal.SIGTERM)
        t_term = time.monotonic()
        proc.wait(timeout=60)
        stopped_in = time.monotonic() - t_term
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
        proc.wait()
        reader.join(timeout=10)
    err = "".join(lines)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err, err[-4000:]
    assert len(said()) == 1 and uri in said()[0] and "training goes on without it" in said()[0], said()
    assert noticed < 30 and stopped_in < 20, (noticed, stopped_in)
    ckpt = load_checkpoint(run_dir / "checkpoints" / "preempted.ckpt", mmap=True)  # resumable
    sent = max(m.step for m in client.get_metric_history(rid, "train/loss"))
    assert ckpt["global_step"] > sent + 2, (ckpt["global_step"], sent)  # trained on after the server died
    assert_no_survivors(proc.pid)
