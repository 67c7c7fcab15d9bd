"""Trackers add to the run's TensorBoard logger, never replace it (impulsevit/training/trackers.py): the run's
config.yaml, events and attention records stay in the run directory whatever loggers are added; each tracker holds the
same final val top-1 as TensorBoard; a preempted and resumed run is ONE W&B run (real ``wandb`` client, offline files)
and ONE MLflow run with continuous steps (a real ``mlflow server`` on 127.0.0.1, sqlite backend)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _cli_helpers import REPO, run_cli, scalars, tiny
from faults import harness
from jsonargparse import Namespace

from impulsevit.cli.trainer_cli import fit_summary
from impulsevit.errors import ConfigError
from impulsevit.training.trackers import TRACKERS_FILE, check_tracker_ready, check_trackers, place_logger_config

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

PREEMPT = '--trainer.callbacks=[{"class_path": "_cli_helpers.SignalAtStep", "init_args": {"step": 5}}]'
STEPS = 8  # tiny_synthetic: 2 epochs x 4 steps


def _run_files_in_place(run: Path) -> None:
    assert (run / "config.yaml").is_file()
    assert list(run.glob("events.out.tfevents.*"))
    assert len(list((run / "attention").glob("step_*.json"))) == 3  # init, epoch 1, epoch 2


def _last_tb(run: Path, tag: str = "val/acc1") -> tuple[int, float]:
    values = scalars(run, tag)
    assert values, f"no {tag} in {run}"
    return values[-1]


def _csv_last(path: Path, key: str = "val/acc1") -> tuple[int, float]:
    rows = [r for r in csv.DictReader(path.open()) if r.get(key)]
    assert rows, f"no {key} in {path}"
    return int(rows[-1]["step"]), float(rows[-1][key])


# ------------------------------------------------------------------------------------------------ pure parts
def test_place_logger_config_defaults_save_dir_to_run_and_passes_ids_back(tmp_path):
    wandb_default = Namespace(class_path="lightning.pytorch.loggers.WandbLogger",
                              init_args=Namespace(save_dir=".", id=None, version=None))
    mlflow_default = Namespace(class_path="lightning.pytorch.loggers.MLFlowLogger",
                               init_args=Namespace(save_dir="./mlruns", run_id=None, tracking_uri=None,
                                                   artifact_location=None))
    csv_given = Namespace(class_path="lightning.pytorch.loggers.CSVLogger", init_args=Namespace(save_dir="mine"))
    place_logger_config([wandb_default, mlflow_default, csv_given], tmp_path,
                        {"wandb": ["w1"], "mlflow": ["m1"]})
    assert wandb_default.init_args.save_dir == str(tmp_path) and wandb_default.init_args.id == "w1"
    assert mlflow_default.init_args.run_id == "m1"
    assert mlflow_default.init_args.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"  # not MLflow 3's refused
    assert mlflow_default.init_args.artifact_location == str(tmp_path / "mlartifacts")  # file store, not ./mlruns
    assert csv_given.init_args.save_dir == "mine"  # what the user gave stays


def test_tracker_names_are_checked():
    assert check_trackers("csv") == ["csv"]
    with pytest.raises(ConfigError, match="unknown tracker"):
        check_trackers("neptune")
    with pytest.raises(ConfigError, match="named twice"):
        check_trackers("csv,csv")


def test_a_tracker_that_cannot_start_is_refused_saying_what_to_set(tmp_path):
    """The defaults a new user has: no W&B login, no WANDB_* variable; an MLflow URI where nothing listens."""
    home = {"NETRC": str(tmp_path / "netrc"), "WANDB_CONFIG_DIR": str(tmp_path / "wb")}
    with pytest.raises(ConfigError, match=r"^--tracker wandb: W&B has no API key here .*`wandb login`.*WANDB_API_KEY"
                                          r".*WANDB_MODE=offline"):
        check_tracker_ready("wandb", home)
    check_tracker_ready("wandb", {**home, "WANDB_MODE": "offline"})
    check_tracker_ready("wandb", {**home, "WANDB_API_KEY": "x" * 40})
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")  # what `wandb login` writes
    check_tracker_ready("wandb", home)
    with pytest.raises(ConfigError, match="W&B has no API key"):  # a login to another server is not one to this one
        check_tracker_ready("wandb", {**home, "WANDB_BASE_URL": "https://wandb.example.org"})
    check_tracker_ready("mlflow", {})  # no URI: the run's own mlflow.db
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ConfigError, match=rf"^--tracker mlflow: the MLflow tracking server MLFLOW_TRACKING_URI={uri} "
                                          r"does not answer \(.*refused.*\); start it"):
        check_tracker_ready("mlflow", {"MLFLOW_TRACKING_URI": uri})


# ------------------------------------------------------------------------------------------------ CSV, in-process
def test_added_csv_logger_keeps_run_files_and_tensorboard_in_run_dir(tmp_path):
    """The issue's command: ``--trainer.logger+=CSVLogger --trainer.logger.save_dir=csv_logs`` used to move
    config.yaml, the events and the attention records to csv_logs/ and leave the run directory with checkpoints/."""
    csv_logs = tmp_path / "csv_logs"
    cli = run_cli(*tiny(tmp_path, "c", "--trainer.logger+=CSVLogger", f"--trainer.logger.save_dir={csv_logs}"))
    run = tmp_path / "c"
    _run_files_in_place(run)
    assert not list(csv_logs.rglob("config.yaml")) and not list(csv_logs.rglob("attention"))
    metrics = next(csv_logs.rglob("metrics.csv"))
    assert _csv_last(metrics) == _last_tb(run)  # same step, same final val top-1
    header = next(csv.reader(metrics.open()))
    assert "attention_evolution/images/distance/layer_00" in header  # the attention curves, as scalars
    summary = fit_summary(cli.trainer, run)
    assert f"tensorboard --logdir {tmp_path}" in summary
    assert f"CSVLogger:       {metrics.parent}" in summary


def test_tracker_csv_without_tensorboard_writes_in_run_dir(tmp_path):
    """``--tracker csv`` saves in <run>/csv/; ``--no_tensorboard`` drops only the TensorBoard logger: config.yaml
    and the attention records still go to the run directory."""
    cli = run_cli(*tiny(tmp_path, "c", "--tracker=csv", "--no_tensorboard"))
    run = tmp_path / "c"
    assert (run / "config.yaml").is_file() and len(list((run / "attention").glob("step_*.json"))) == 3
    assert not list(run.glob("events.out.tfevents.*"))
    step, acc = _csv_last(run / "csv" / "metrics.csv")
    assert step == STEPS - 1 and acc == pytest.approx(float(cli.trainer.callback_metrics["val/acc1"]))
    assert "tensorboard --logdir" not in fit_summary(cli.trainer, run)


# ------------------------------------------------------------------------------------------------ subprocess helpers
def _fit(tmp_path: Path, name: str, *extra: str, env: dict[str, str], code: int = 0) -> str:
    """``impulsevit fit`` on the tiny recipe as a child in its own session (tests/faults/harness.py): exit ``code``,
    and no process it started (W&B's ``wandb-core`` service included) outlives it. Returns its stderr."""
    env = {**env, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.setdefault("TMPDIR", str(tmp_path / "tmp"))  # W&B's media folder: not one another test's child can delete
    res = harness.run(*tiny(tmp_path, name, *extra), cwd=tmp_path, timeout=600, extra_env=env)
    assert res.rc == code, res.err[-4000:]
    harness.assert_no_survivors(res.sid, grace=30)
    return res.err


def _preempt_then_resume(tmp_path: Path, name: str, tracker: str, env: dict[str, str]) -> tuple[str, str]:
    """``fit`` SIGTERMed after step 5 (exit 143, preempted.ckpt), then ``fit --resume auto`` to the end."""
    first = _fit(tmp_path, name, f"--tracker={tracker}", PREEMPT, env=env, code=128 + signal.SIGTERM)
    assert (tmp_path / name / "checkpoints" / "preempted.ckpt").is_file()
    second = _fit(tmp_path, name, f"--tracker={tracker}", "--resume=auto", env=env)
    return first, second


# ------------------------------------------------------------------------------------------------ W&B, offline
def _wandb_records(path: Path) -> list:
    """The protobuf records of a W&B ``.wandb`` file (wandb's LevelDB-style log: a 7-byte file header, 32 KiB blocks
    of chunks with a 7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, block, out, parts = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if length == 0 and kind == 0:
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(parts)
            out.append(rec)
    return out


def _wandb_history(path: Path) -> tuple[str, list[dict]]:
    """(run id, history rows as {key: value}) of a ``.wandb`` file."""
    run_id, rows = None, []
    for rec in _wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run_id = rec.run.run_id
        elif kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in rec.history.item if item.value_json})
    return run_id, rows


@pytest.mark.slow
def test_wandb_offline_preempted_and_resumed_is_one_run(tmp_path):
    pytest.importorskip("wandb")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wb_config"),
           "WANDB_CACHE_DIR": str(tmp_path / "wb_cache"), "WANDB_DATA_DIR": str(tmp_path / "wb_data")}
    _, second = _preempt_then_resume(tmp_path, "w", "wandb", env)
    run = tmp_path / "w"
    _run_files_in_place(run)
    stored = json.loads((run / TRACKERS_FILE).read_text())["ids"]["wandb"]
    files = sorted(run.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 2  # one per process, both under the run directory
    histories = [_wandb_history(f) for f in files]
    assert {rid for rid, _ in histories} == set(stored) and len(stored) == 1  # the same W&B run
    steps = [row["trainer/global_step"] for _, rows in histories for row in rows if "val/acc1" in row]
    assert steps == [3, 7]  # epoch 0 before the preemption, epoch 1 after: continuous
    last = [row for row in histories[1][1] if "val/acc1" in row][-1]
    assert (last["trainer/global_step"], last["val/acc1"]) == pytest.approx(_last_tb(run))
    images = [k for _, rows in histories for row in rows for k in row if k.startswith("attention_evolution/images/")]
    assert any("layer_00" in k and "distance" not in k for k in images)  # the attention grids, as W&B images
    assert f"WandbLogger:     run {stored[0]} (offline)" in second


# ------------------------------------------------------------------------------------------------ MLflow server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 (sqlite backend, artifacts under tmp_path); its URI. Startup waits on
    ``/health`` with a bounded poll; the finalizer stops the server's process group."""
    pytest.importorskip("mlflow")
    exe = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or shutil.which("mlflow")
    if exe is None:
        pytest.skip("the mlflow command is not installed")
    port, home = _free_port(), tmp_path / "mlflow"
    home.mkdir()
    log = (home / "server.log").open("w")
    proc = subprocess.Popen([exe, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
                             "--artifacts-destination", str(home / "artifacts")],
                            cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            # no background job workers (huey): only the tracking API is used
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a cold start migrates the sqlite schema: ~70 s on a busy 2-core machine
        while True:
            assert proc.poll() is None, (home / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not answer /health in 300 s"
            time.sleep(0.5)
        yield uri
    finally:
        with_group = proc.pid
        try:
            os.killpg(with_group, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(with_group, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_mlflow_server_preempted_and_resumed_is_one_run_with_continuous_steps(tmp_path, mlflow_server):
    from mlflow import MlflowClient

    env = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": "trackers-test"}
    _, second = _preempt_then_resume(tmp_path, "m", "mlflow", env)
    run = tmp_path / "m"
    _run_files_in_place(run)
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("trackers-test")
    runs = client.search_runs([experiment.experiment_id])
    stored = json.loads((run / TRACKERS_FILE).read_text())["ids"]["mlflow"]
    assert [r.info.run_id for r in runs] == stored  # ONE MLflow run for the preempted and the resumed process
    rid = stored[0]
    assert runs[0].info.status == "FINISHED"
    val = [(m.step, m.value) for m in client.get_metric_history(rid, "val/acc1")]
    assert [s for s, _ in val] == [3, 7] and val[-1] == pytest.approx(_last_tb(run))
    loss_steps = sorted(m.step for m in client.get_metric_history(rid, "train/loss"))
    assert loss_steps == list(range(STEPS))  # continuous: no repeated or skipped step across the preemption
    params = runs[0].data.params
    assert params["config/model/backbone"] == "vit_tiny_patch16_224" and params["init/method"] == "impulse"
    assert "config/resume" not in params
    assert any("attention_evolution/images/distance/layer_00" == k for k in runs[0].data.metrics)
    assert f"MLFlowLogger:    run {rid}" in second and mlflow_server in second


@pytest.mark.slow
def test_mlflow_default_store_without_server_or_variable_resumes_into_the_same_run(tmp_path):
    """What a user gets with no MLflow server and no MLFLOW_* variable: the installed MLflow (3.x refuses its old file
    store) accepts the run's SQLite store ``<run>/mlflow.db``, nothing lands in the working directory, and a preempted
    run resumes into the same MLflow run."""
    from mlflow import MlflowClient

    assert not os.environ.get("MLFLOW_TRACKING_URI") and not os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    _, second = _preempt_then_resume(tmp_path, "d", "mlflow", {})
    run = tmp_path / "d"
    uri = f"sqlite:///{run / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("impulsevit").experiment_id])
    stored = json.loads((run / TRACKERS_FILE).read_text())["ids"]["mlflow"]
    assert [r.info.run_id for r in runs] == stored and runs[0].info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(stored[0], "train/loss")) == list(range(STEPS))
    assert (run / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists() and not (run / "mlruns").exists()
    assert f"MLFlowLogger:    run {stored[0]}" in second and uri in second
