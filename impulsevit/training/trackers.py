"""Trackers add to the run's TensorBoard logger, never replace it; the run's own files stay in the run directory.

A run's own files (``config.yaml``, ``attention/``, ``trackers.json``) live in its *run directory*,
:func:`run_directory`: the one ``impulsevit fit`` names (``<runs_dir>/<name>``; ``<run>/<subcommand>`` for
validate / test / predict), whatever loggers the command line adds; for a plain ``Trainer`` (no CLI) it is Lightning's
``trainer.log_dir`` of the first TensorBoard logger, else of the first logger. Never ``loggers[0]``'s choice under the
CLI: a ``--trainer.logger+=CSVLogger --trainer.logger.save_dir=csv_logs`` keeps its CSV files in ``csv_logs/`` and the
run's files in the run directory.

Extra trackers (``--tracker wandb,mlflow,csv`` or ``--trainer.logger+=WandbLogger|MLFlowLogger|CSVLogger``):

* :func:`check_trackers` refuses, before any work, a tracker that is not installed or cannot start (W&B online
  without an API key, an MLflow tracking server that does not answer: :func:`check_tracker_ready`);
* :func:`place_logger_config` defaults their save location to the run directory (a ``save_dir`` left at the class's
  default: W&B's ``.``; MLflow without a tracking URI gets the SQLite store ``<run>/mlflow.db``,
  :func:`mlflow_store`); :func:`tracker_loggers` builds the ``--tracker`` ones there;
* :func:`record_trackers` keeps each W&B run id / MLflow run id in ``<run>/trackers.json`` (atomic, rank 0), and a
  resumed ``fit`` (``--resume``, a requeued SLURM job) passes them back (:func:`resume_ids`: ``WandbLogger(id=...)``,
  whose ``resume`` is ``"allow"``; ``MLFlowLogger(run_id=...)``), so a preempted and resumed run is one W&B / MLflow
  run with continuous steps;
* :func:`log_text` / :func:`log_image` send the init report and the attention images to every logger that takes them
  (TensorBoard; W&B's ``log_text`` / ``log_image``; MLflow's text artifact). Not supported: images to MLflow or CSV
  (Lightning's loggers have no ``log_image`` there; their attention curves arrive as scalars).

Neither ``wandb`` nor ``mlflow`` is a dependency (extras ``impulsevit[wandb]``, ``impulsevit[mlflow]``).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from impulsevit._compat.lightning import flat_hyperparams, mlflow_tracking_uri
from impulsevit.errors import ConfigError, MissingExtraError, missing_extra
from impulsevit.io import atomic_write_json

log = logging.getLogger("impulsevit")

__all__ = [
    "cli_run_directory",
    "TRACKERS",
    "TRACKERS_FILE",
    "check_logger_config",
    "check_tracker_ready",
    "check_trackers",
    "describe",
    "dropped",
    "guard_tracker",
    "guarded",
    "log_hyperparams",
    "log_image",
    "log_text",
    "MLFLOW_HTTP_DEFAULTS",
    "mlflow_store",
    "place_logger_config",
    "record_trackers",
    "resume_ids",
    "run_directory",
    "tracker_loggers",
]

TRACKERS_FILE = "trackers.json"
# --tracker NAME: the package it needs (the extra of the same name installs it)
TRACKERS: dict[str, str | None] = {"wandb": "wandb", "mlflow": "mlflow", "csv": None}
# the class-name stem in a logger's class_path -> tracker kind
_KINDS = {"WandbLogger": "wandb", "MLFlowLogger": "mlflow"}


def kind_of(logger: Logger | str) -> str:
    """``tensorboard`` / ``wandb`` / ``mlflow`` / ``csv`` / the class name, of a logger or a ``class_path``."""
    name = logger.rsplit(".", 1)[-1] if isinstance(logger, str) else type(logger).__name__
    if not isinstance(logger, str):
        for cls in type(logger).__mro__:
            if cls.__name__ in (*_KINDS, "TensorBoardLogger", "CSVLogger"):
                name = cls.__name__
                break
    return {**_KINDS, "TensorBoardLogger": "tensorboard", "CSVLogger": "csv"}.get(name, name)


# ------------------------------------------------------------------ the run directory
def cli_run_directory(trainer: L.Trainer) -> Path | None:
    """The run directory the CLI gave its resolved-config writer; ``None`` outside the CLI. Matched by class name, so
    that callers need not import Lightning's CLI module (it needs jsonargparse, which a bare GPU machine may lack)."""
    for cb in trainer.callbacks:
        run_dir = getattr(cb, "run_dir", None)
        if run_dir is not None and type(cb).__name__ == "RunConfigSaver":
            return Path(run_dir)
    return None


def run_directory(trainer: L.Trainer) -> Path | None:
    """Where the run's own files go (see the module docstring); ``None``: no run directory (no CLI and no logger, or
    ``fast_dev_run``, which replaces the loggers and the config writer).

    Under the CLI it is the ``run_dir`` of the resolved-config writer
    (:class:`~impulsevit.callbacks.config_saver.RunConfigSaver`). Collective for a plain ``Trainer`` (Lightning's
    ``log_dir`` broadcasts from rank 0): call it on every rank."""
    run_dir = cli_run_directory(trainer)
    if run_dir is not None:
        return run_dir
    if not trainer.loggers:
        return None
    tb = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
    log_dir = tb.log_dir if tb is not None else trainer.log_dir  # None under fast_dev_run (a DummyLogger)
    return Path(log_dir) if log_dir else None


# ------------------------------------------------------------------ --tracker and --trainer.logger
def check_trackers(spec: str | Sequence[str] | None) -> list[str]:
    """The ``--tracker`` names (comma-separated or a list), checked: known and installed.

    Raises:
        ConfigError: an unknown name, or one whose package is not installed (names the extra to install).
    """
    if not spec:
        return []
    names = [n.strip().lower() for n in (spec.split(",") if isinstance(spec, str) else spec) if n.strip()]
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"--tracker {name!r}: unknown tracker; expected one or more of {', '.join(TRACKERS)} "
                              f"(comma-separated), or any Lightning logger with --trainer.logger+=CLASS")
        package = TRACKERS[name]
        if package is not None and not _installed(package):
            raise MissingExtraError(f"--tracker {name}: {missing_extra(package)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--tracker {','.join(names)}: a tracker named twice")
    for name in names:
        check_tracker_ready(name)
    return names


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported and its distribution is installed (Lightning's loggers check the latter:
    without it ``WandbLogger`` / ``MLFlowLogger`` refuse to start)."""
    import importlib.metadata

    try:
        if importlib.util.find_spec(package) is None:
            return False
        importlib.metadata.version(package)
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return False
    return True


def check_logger_config(logger_cfg: Any, trackers: Sequence[str]) -> None:
    """Refuse, before any work, a ``trainer.logger`` (the parsed value: ``False`` / ``True`` / ``None``, a
    ``class_path`` namespace or a list of them) that cannot work with the ``--tracker`` names ``trackers``: every
    logger off (``--trainer.logger=false``) with a ``--tracker`` asked for (a contradiction), or a W&B / MLflow
    logger (``--trainer.logger+=WandbLogger``) whose package is not installed (the extra to install; Lightning
    would say only "Not a valid subclass of Logger").

    Raises:
        ConfigError: one line naming the setting (:class:`~impulsevit.errors.MissingExtraError` for a package).
    """
    if logger_cfg is False and trackers:
        raise ConfigError(f"--tracker {','.join(trackers)} with --trainer.logger=false: trainer.logger=false turns "
                          f"every logger off, the trackers too; drop one of the two")
    entries = logger_cfg if isinstance(logger_cfg, list) else [logger_cfg]
    for entry in entries:
        class_path = getattr(entry, "class_path", None) if not isinstance(entry, Logger) else None
        kind = kind_of(class_path) if isinstance(class_path, str) else None
        package = TRACKERS.get(kind) if kind else None
        if package is not None and not _installed(package):
            raise MissingExtraError(f"--trainer.logger {class_path.rsplit('.', 1)[-1]}: "
                                    f"{missing_extra(package, needed_for=class_path)}")


_WANDB_NO_LOGIN = frozenset({"offline", "disabled", "dryrun"})


def _wandb_credentials(environ: Mapping[str, str]) -> str | None:
    """Where W&B would find an API key without prompting, as wandb reads them (its environment variables, the
    ``machine`` of its server in ``~/.netrc`` / ``$NETRC``, which ``wandb login`` writes, or ``api_key`` in its
    settings file); None when nowhere. Read here, not through wandb, whose credential lookup is internal."""
    import configparser
    import netrc
    from urllib.parse import urlparse

    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if environ.get(var):
            return var
    host = urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    try:
        if path.is_file() and netrc.netrc(str(path)).authenticators(host):
            return str(path)
    except (OSError, netrc.NetrcParseError):
        pass
    settings = Path(environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb") / "settings"
    parser = configparser.ConfigParser()
    try:
        parser.read(settings)
    except (OSError, configparser.Error):
        return None
    return str(settings) if parser.get("default", "api_key", fallback=None) else None


def _unreachable(uri: str, timeout: float = 5.0) -> str | None:
    """Why an ``http(s)://`` tracking server does not answer (connection refused, unknown host, a timeout), else
    None: any HTTP answer, even an error status, means a server is there. Other schemes are not probed."""
    import urllib.error
    import urllib.request

    if not uri.lower().startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return str(reason) or type(reason).__name__


def _not_mlflow(uri: str, timeout: float = 5.0) -> str | None:
    """Why the ``http(s)://`` server at ``uri`` (which answers) is not an MLflow tracking server: its ``/health``
    is 404 / 405 (a plain web server, another service; MLflow's answers ``OK``), else None."""
    import urllib.error
    import urllib.request

    if not uri.lower().startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            return None
    except urllib.error.HTTPError as e:
        return f"GET /health answered {e.code} {e.reason}" if e.code in (404, 405) else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _unwritable_sqlite(uri: str) -> str | None:
    """Why MLflow cannot write the SQLite store of a ``sqlite:///PATH`` URI (``sqlite:////abs`` absolute,
    ``sqlite:///rel`` relative to the working directory): its folder is missing or not writable (SQLite writes a
    journal beside the database), or the database file is read-only; else None (other schemes: None)."""
    if not uri.lower().startswith("sqlite:///"):
        return None
    raw = uri[len("sqlite:///"):].split("?", 1)[0]
    if not raw or raw == ":memory:":
        return None
    path = Path(raw)
    folder = path.parent
    if not folder.is_dir():
        return f"the folder of its SQLite database, {folder}, does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder of its SQLite database, {folder}, is not writable"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f"its SQLite database {path} is read-only"
    return None


def check_tracker_ready(name: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse, before any work, a ``--tracker`` that is installed but cannot start: W&B online with no API key (no
    ``WANDB_API_KEY``, never ``wandb login``), MLflow at an ``MLFLOW_TRACKING_URI`` whose server does not answer
    (probed with one ``GET /health``, 5 s), that answers as no MLflow server does (``/health`` 404: a plain web
    server), or a ``sqlite:///`` store in a folder that cannot be written. ``environ``: the environment (default
    ``os.environ``). An MLflow without
    a tracking URI needs nothing: it writes to ``<run>/mlflow.db`` (:func:`mlflow_store`).

    Raises:
        ConfigError: one line saying what to set.
    """
    environ = os.environ if environ is None else environ
    if name == "wandb":
        if environ.get("WANDB_MODE", "").lower() in _WANDB_NO_LOGIN or _wandb_credentials(environ):
            return
        raise ConfigError("--tracker wandb: W&B has no API key here (never logged in); run `wandb login`, or set "
                          "WANDB_API_KEY, or WANDB_MODE=offline to write the run locally (sync it later with "
                          "`wandb sync`)")
    if name == "mlflow":
        uri = environ.get("MLFLOW_TRACKING_URI")
        why = _unreachable(uri) if uri else None
        if why is not None:
            raise ConfigError(f"--tracker mlflow: the MLflow tracking server MLFLOW_TRACKING_URI={uri} does not "
                              f"answer ({why}); start it, set MLFLOW_TRACKING_URI to one that runs, or unset it to "
                              f"write to <run>/mlflow.db")
        why = _not_mlflow(uri) if uri else None
        if why is not None:
            raise ConfigError(f"--tracker mlflow: MLFLOW_TRACKING_URI={uri} is not an MLflow tracking server "
                              f"({why}); set it to the address `mlflow server` prints, or unset it to write to "
                              f"<run>/mlflow.db")
        why = _unwritable_sqlite(uri) if uri else None
        if why is not None:
            raise ConfigError(f"--tracker mlflow: MLFLOW_TRACKING_URI={uri}: {why}; point it at a folder you can "
                              f"write, or unset it to write to <run>/mlflow.db")


def mlflow_store(run_dir: Path) -> tuple[str, str]:
    """``(tracking URI, artifact location)`` of an MLflow logger given no tracking URI: a SQLite database
    ``<run>/mlflow.db`` (MLflow 3 refuses its file store ``mlruns/`` unless ``MLFLOW_ALLOW_FILE_STORE`` is set) and
    the artifacts in ``<run>/mlartifacts/`` (MLflow's default for a database store is ``./mlruns`` of the working
    directory). Browse with ``mlflow ui --backend-store-uri sqlite:///<run>/mlflow.db``."""
    run_dir = Path(run_dir).absolute()
    return f"sqlite:///{run_dir / 'mlflow.db'}", str(run_dir / "mlartifacts")


def _default_of(class_path: str, arg: str) -> Any:
    """The default of ``arg`` in the constructor of ``class_path`` (``inspect.Parameter.empty`` when none)."""
    import importlib

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return inspect.signature(cls).parameters[arg].default
    except (ImportError, AttributeError, KeyError, ValueError):
        return inspect.Parameter.empty


def place_logger_config(logger_cfg: Any, run_dir: Path, ids: Mapping[str, list[str]] | None = None) -> None:
    """In place, on the parsed ``trainer.logger`` (a ``class_path`` / ``init_args`` namespace or a list of them):
    a ``save_dir`` left at its class's default becomes ``run_dir``; with ``ids`` (a resumed run's
    :func:`resume_ids`) a W&B logger without ``id`` / ``version`` gets the stored id and an MLflow logger without
    ``run_id`` the stored run id, in order of appearance. Other values (bools, ``None``, instances) are left alone."""
    entries = logger_cfg if isinstance(logger_cfg, list) else [logger_cfg]
    used: dict[str, int] = {}
    for entry in entries:
        class_path = getattr(entry, "class_path", None) if not isinstance(entry, Logger) else None
        init = getattr(entry, "init_args", None)
        if not isinstance(class_path, str) or init is None:
            continue
        kind = kind_of(class_path)
        if kind == "mlflow" and not init.get("tracking_uri") and not os.environ.get("MLFLOW_TRACKING_URI") and \
                init.get("save_dir") == _default_of(class_path, "save_dir"):
            init["tracking_uri"], artifacts = mlflow_store(run_dir)
            if "artifact_location" in init and init.get("artifact_location") is None:
                init["artifact_location"] = artifacts
        elif "save_dir" in init and init.get("save_dir") == _default_of(class_path, "save_dir"):
            init["save_dir"] = str(run_dir)
        stored = (ids or {}).get(kind) or []
        index = used.get(kind, 0)
        used[kind] = index + 1
        if index >= len(stored):
            continue
        if kind == "wandb" and init.get("id") is None and init.get("version") is None:
            init["id"] = stored[index]
        elif kind == "mlflow" and init.get("run_id") is None:
            init["run_id"] = stored[index]


def tracker_loggers(names: Iterable[str], run_dir: Path, run_name: str,
                    ids: Mapping[str, list[str]] | None = None) -> list[Logger]:
    """The ``--tracker`` loggers, saving in ``run_dir``: ``csv`` -> ``<run>/csv/metrics.csv``; ``wandb`` -> W&B run
    ``run_name`` in project ``$WANDB_PROJECT`` (default ``impulsevit``), files in ``<run>/wandb/`` (offline with
    ``WANDB_MODE=offline``); ``mlflow`` -> run ``run_name`` in experiment ``$MLFLOW_EXPERIMENT_NAME`` (default
    ``impulsevit``) at ``$MLFLOW_TRACKING_URI`` (default ``<run>/mlflow.db``, :func:`mlflow_store`). With ``ids``
    (a resumed run) the W&B / MLflow logger continues the stored run."""
    out: list[Logger] = []
    for name in names:
        stored = ((ids or {}).get(name) or [None])[0]
        if name == "csv":
            out.append(CSVLogger(save_dir=str(run_dir), name="csv", version=""))
        elif name == "wandb":
            from lightning.pytorch.loggers import WandbLogger

            out.append(WandbLogger(name=run_name, save_dir=str(run_dir), id=stored,
                                   project=os.environ.get("WANDB_PROJECT", "impulsevit")))
        elif name == "mlflow":
            from lightning.pytorch.loggers import MLFlowLogger

            uri, artifacts = mlflow_store(run_dir)
            if os.environ.get("MLFLOW_TRACKING_URI"):
                uri, artifacts = os.environ["MLFLOW_TRACKING_URI"], None
            out.append(MLFlowLogger(experiment_name=os.environ.get("MLFLOW_EXPERIMENT_NAME", "impulsevit"),
                                    run_name=run_name, tracking_uri=uri, artifact_location=artifacts,
                                    run_id=stored))
    return out


# ------------------------------------------------------------------ a tracker that stops answering
MLFLOW_HTTP_DEFAULTS: dict[str, str] = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                                        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
"""MLflow's HTTP settings for a run's MLflow logger, each where the environment does not set it: a request gives up
after a 10 s timeout and 2 retries (about 5 s of back-off) instead of MLflow's 120 s and 7 retries (minutes per
call), so a tracking server that dies mid-run is noticed in seconds and a SIGTERM stops the run promptly."""
_GUARDED = ("log_metrics", "log_hyperparams", "log_graph", "save", "finalize", "after_save_checkpoint")
_DROPPED = "_impulsevit_dropped"


def dropped(logger: Logger) -> bool:
    """Whether :func:`guard_tracker` dropped ``logger`` (its server stopped answering)."""
    return bool(getattr(logger, _DROPPED, False))


def _tracker_failures() -> tuple[type[BaseException], ...]:
    """What an MLflow client raises when its server stops answering (an ``MlflowException`` after its retries, a
    ``requests`` error, an ``OSError``)."""
    found: list[type[BaseException]] = [OSError]
    try:
        from mlflow.exceptions import MlflowException

        found.append(MlflowException)
    except ImportError:
        pass
    try:
        from requests import RequestException

        found.append(RequestException)
    except ImportError:
        pass
    return tuple(found)


def _drop(logger: Logger, exc: BaseException) -> None:
    if dropped(logger):
        return
    setattr(logger, _DROPPED, True)
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    log.warning("impulsevit: the MLflow tracking server at %s stopped answering (%s: %s); training goes on without "
                "it (the run's TensorBoard events and run.json keep every value)", mlflow_tracking_uri(logger),
                type(exc).__name__, reason)


def guarded(logger: Logger, call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` for ``logger`` unless it was dropped; an MLflow logger whose server fails the call
    (:func:`_tracker_failures`; not an error the server answered with, MLflow's ``RestException``, which is raised)
    is dropped, with one warning, and None returned. Other loggers' calls run as they are."""
    if dropped(logger):
        return None
    if kind_of(logger) != "mlflow":
        return call(*args, **kwargs)
    try:
        return call(*args, **kwargs)
    except _tracker_failures() as e:
        if type(e).__name__ == "RestException":  # the server answered, refusing the request: not an outage
            raise
        _drop(logger, e)
        return None


def guard_tracker(logger: Logger, environ: Any = None) -> None:
    """In place: an MLflow logger (``--tracker mlflow`` or ``--trainer.logger+=MLFlowLogger``) whose server stops
    answering mid-run is dropped, with one warning line, and training goes on (docs/guarantees.md); its requests are
    bounded (:data:`MLFLOW_HTTP_DEFAULTS`, set in ``environ``, default ``os.environ``, where not set). The logger's
    calls that reach the server (``log_metrics``, ``log_hyperparams``, ``finalize``, ...) go through
    :func:`guarded`. Other loggers are left alone (W&B buffers offline by itself)."""
    if kind_of(logger) != "mlflow":
        return
    environ = os.environ if environ is None else environ
    for key, value in MLFLOW_HTTP_DEFAULTS.items():
        environ.setdefault(key, value)
    for name in _GUARDED:
        method = getattr(logger, name, None)
        if callable(method) and not getattr(method, "_impulsevit_guarded", False):
            def call(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                return guarded(logger, _method, *args, **kwargs)

            call._impulsevit_guarded = True  # type: ignore[attr-defined]
            setattr(logger, name, call)


# ------------------------------------------------------------------ ids kept in the run directory
def _tracker_id(logger: Logger) -> str | None:
    kind = kind_of(logger)
    if kind == "wandb":
        return str(logger.experiment.id)  # creates the W&B run if needed (rank 0)
    if kind == "mlflow":
        return str(logger.run_id)  # creates the MLflow run if needed
    return None


def describe(logger: Logger) -> str:
    """Where ``logger`` writes, in one phrase (for the end summary): a directory, or the MLflow run at its URI."""
    kind = kind_of(logger)
    if kind == "mlflow":
        gone = "; dropped mid-run: the server stopped answering" if dropped(logger) else ""
        return f"run {logger.run_id} (experiment {logger.experiment_id}) at {mlflow_tracking_uri(logger)}{gone}"
    if kind == "wandb":
        exp = logger.experiment
        where = getattr(exp, "dir", None) or logger.save_dir
        mode = getattr(getattr(exp, "settings", None), "mode", None)
        return f"run {exp.id}{f' ({mode})' if mode else ''} in {Path(where).parent if where else '?'}"
    where = getattr(logger, "log_dir", None) or logger.save_dir
    return str(where)


def record_trackers(run_dir: Path, loggers: Sequence[Logger]) -> dict[str, list[str]]:
    """Write ``<run_dir>/trackers.json`` (atomic): per kind, the run ids of the W&B / MLflow loggers in order, and
    every logger's kind and location. Call on global rank 0 (creates the trackers' runs). Returns the ids."""
    ids: dict[str, list[str]] = {}
    entries = []
    for lg in loggers:
        kind = kind_of(lg)
        rid = _tracker_id(lg)
        if rid is not None:
            ids.setdefault(kind, []).append(rid)
        entries.append({"kind": kind, "id": rid, "where": describe(lg)})
    if ids or any(e["kind"] != "tensorboard" for e in entries):
        atomic_write_json(run_dir / TRACKERS_FILE, {"ids": ids, "loggers": entries})
    return ids


def resume_ids(run_dir: Path) -> dict[str, list[str]]:
    """The W&B / MLflow run ids :func:`record_trackers` kept in ``run_dir`` (empty when none or unreadable: a
    resumed run then starts new tracker runs, and says so)."""
    path = run_dir / TRACKERS_FILE
    if not path.exists():
        return {}
    try:
        ids = json.loads(path.read_text()).get("ids") or {}
        return {str(k): [str(i) for i in v] for k, v in ids.items() if isinstance(v, list)}
    except (OSError, ValueError, AttributeError) as e:
        log.warning("impulsevit: %s unreadable (%s); trackers start new runs", path, e)
        return {}


# ------------------------------------------------------------------ logging to every tracker
def flush_loggers(loggers: Iterable[Logger]) -> None:
    """Write out now what each logger has buffered: TensorBoard's queued events (its writer flushes only every
    120 s or 10 events otherwise) and a CSV logger's rows. W&B and MLflow send as they log (nothing to do). Safe on
    every rank (the other ranks' experiments are no-op stand-ins)."""
    for lg in loggers:
        if isinstance(lg, TensorBoardLogger):
            lg.experiment.flush()
        elif isinstance(lg, CSVLogger):
            lg.save()


def log_hyperparams(loggers: Iterable[Logger], params: Mapping[str, Any]) -> None:
    """``params`` to every logger. MLflow keeps a parameter's first value (it refuses a changed one): on a resumed run
    the parameters it already holds are skipped, a changed value logged to the ``impulsevit`` logger."""
    for lg in loggers:
        if kind_of(lg) != "mlflow":
            lg.log_hyperparams(dict(params))
        elif not dropped(lg):
            guarded(lg, _mlflow_hyperparams, lg, params)


def _mlflow_hyperparams(lg: Logger, params: Mapping[str, Any]) -> None:
    """The MLflow half of :func:`log_hyperparams`: the parameters the run does not hold yet."""
    flat = flat_hyperparams(dict(params))
    held = lg.experiment.get_run(lg.run_id).data.params
    changed = [k for k, v in flat.items() if k in held and held[k] != str(v)[:250]]
    if changed:
        log.warning("impulsevit: MLflow run %s keeps its first value of %s (MLflow parameters cannot change)",
                    lg.run_id, ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else ""))
    fresh = {k: v for k, v in flat.items() if k not in held}
    if fresh:
        lg.log_hyperparams(fresh)


def log_text(loggers: Iterable[Logger], tag: str, text: str, step: int) -> None:
    """``text`` (markdown) to TensorBoard (``add_text``), W&B (a one-cell table) and MLflow (artifact
    ``<tag>.md``); other loggers get nothing."""
    for lg in loggers:
        kind = kind_of(lg)
        if kind == "tensorboard":
            lg.experiment.add_text(tag, text, global_step=step)
        elif kind == "wandb":
            lg.log_text(key=tag, columns=["text"], data=[[text]], step=step)
        elif kind == "mlflow":
            guarded(lg, lambda lg=lg: lg.experiment.log_text(lg.run_id, text, f"{tag}.md"))


def log_image(loggers: Iterable[Logger], tag: str, image: torch.Tensor, step: int) -> None:
    """A ``(3, H, W)`` image in ``[0, 1]`` to TensorBoard and to every logger with a ``log_image`` (W&B, Neptune)."""
    hwc = None
    for lg in loggers:
        if isinstance(lg, TensorBoardLogger):
            lg.experiment.add_image(tag, image, global_step=step, dataformats="CHW")
        elif callable(getattr(lg, "log_image", None)):
            if hwc is None:
                hwc = image.detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy()
            lg.log_image(key=tag, images=[hwc], step=step)
