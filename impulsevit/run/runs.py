"""``impulsevit runs [DIR]``: one table of every run under a runs directory (default ``runs``) or a study.

Read from each run's own plain files only (no checkpoint is opened): ``run.json`` (the summary
:class:`~impulsevit.callbacks.run_record.RunRecord` keeps: state, epoch / step, last and best ``val/acc1``, wall time),
``config.yaml`` (backbone, init method), the lock ``.lock`` (:mod:`impulsevit.run.rundir`), the job's events log
``slurm/events.log`` (:mod:`impulsevit.cluster.events`) and, in a study, ``study.json`` and the run's
``status.json`` (:mod:`impulsevit.study`).

Status, first that applies:

- ``running``: the lock is held by a live process (same host: its pid exists; another host: the lock is taken as
  held, since its process cannot be checked from here);
- what ``run.json`` says the fit ended with: ``finished``, ``preempted`` (SIGTERM / SIGUSR1 checkpoint, or
  requeued per the events log), ``interrupted`` (Ctrl-C) or ``failed`` (reason: the exception; or the job's
  ``exit rc=N`` from the events log);
- ``interrupted`` also for a run whose last record is ``running`` but whose lock is gone (killed without a word:
  SIGKILL, out of memory, a node failure);
- runs without ``run.json`` (older runs): the events log's last exit, the study's ``status.json``, else ``unknown``.

Layout: ``DIR`` is a study (has ``study.json``: its planned runs), a single run directory, or a folder of run
directories and study directories (one level: a study's runs are listed grouped under the study's name).
Every value is read through one typed reader (:class:`_Fields`): a value of another type than the key holds (a number
where a list is expected, ``"high"`` as an accuracy, a mapping as the backbone, ``true`` as a step) is unknown for that
cell, and the row's ``unreadable`` names the file and key once (``impulsevit runs`` prints it on stderr); the other
cells and the other runs are listed as usual, and a sort puts unknown values last.
Pure functions (:func:`scan` -> :class:`RunRow` list -> :func:`select` -> :func:`format_table`) plus :func:`main`.
Not supported: runs on remote (fsspec) paths; checking a lock held on another host.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import yaml

from impulsevit.argparser import ArgumentParser
from impulsevit.callbacks.run_record import SUMMARY_NAME
from impulsevit.cluster.events import read_events
from impulsevit.errors import ConfigError
from impulsevit.procs import alive
from impulsevit.run.rundir import LOCK_NAME, existing_run

__all__ = ["STATUSES", "RunRow", "format_table", "main", "read_run", "scan", "select"]

STATUSES = ("running", "finished", "preempted", "interrupted", "failed", "unknown")
_STUDY_STATE = {"done": "finished", "failed": "failed", "requeued": "preempted", "running": "interrupted"}


@dataclasses.dataclass
class RunRow:
    """One run as ``impulsevit runs`` lists it (``None``: not known from the run's files)."""

    name: str
    path: str
    group: str = ""  # the study a run belongs to ("" for a plain run)
    recipe: str | None = None
    backbone: str | None = None
    init_method: str | None = None
    status: str = "unknown"
    reason: str | None = None
    epoch: int | None = None
    max_epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    best_val_acc1: float | None = None
    last_val_acc1: float | None = None
    wall_seconds: float | None = None
    last_event: str | None = None
    updated: str | None = None
    unreadable: list[str] = dataclasses.field(default_factory=list)  # "FILE: KEY is VALUE, not TYPE", one per key


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "a mapping"}


class _Fields:
    """Typed reads of one parsed file (a JSON / YAML mapping): :meth:`get` returns the value of ``key`` when it has the
    expected type, else None, and records ``FILE: KEY is VALUE, not TYPE`` once in ``notes``. ``bool`` is not a
    number; an ``int`` is a float; a missing key or a ``null`` is unknown without a note."""

    def __init__(self, data: Any, source: Path, notes: list[str], prefix: str = "") -> None:
        self.source, self.notes, self.prefix = source, notes, prefix
        if data is not None and not isinstance(data, dict):
            self._note("", data, dict)
            data = None
        self.data: dict[str, Any] = data or {}

    def _note(self, key: str, value: Any, kind: type) -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        where = f"{self.prefix}{key}" or "the file"
        note = f"{self.source}: {where} is {shown}, not {_TYPE_NAMES[kind]}"
        if note not in self.notes:
            self.notes.append(note)

    def get(self, key: str, kind: type) -> Any:
        """``data[key]`` when it is a ``kind`` (``float``: any real number, as ``float``; ``list``: of strings or
        numbers, or of mappings), else None."""
        value = self.data.get(key)
        if value is None:
            return None
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if ok and kind is list and not (all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value)
                                        or all(isinstance(v, dict) for v in value)):
            ok = False
        if not ok:
            self._note(key, value, kind)
            return None
        return value

    def sub(self, key: str) -> _Fields:
        """The mapping under ``key`` read the same way (an absent or mistyped one: empty)."""
        return _Fields(self.get(key, dict), self.source, self.notes, f"{self.prefix}{key}.")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def live_lock(run_dir: Path) -> dict[str, Any] | None:
    """The lock's owner when ``run_dir``'s lock is held by a live process (see the module docstring), else None."""
    lock = _read_json(run_dir / LOCK_NAME)
    if lock is None or lock.get("pid") is None:
        return None
    if lock.get("host") != socket.gethostname():
        return lock
    try:
        return lock if alive(int(lock["pid"])) else None
    except (TypeError, ValueError):
        return None


def _format_event(ev: dict[str, str]) -> str:
    rest = " ".join(f"{k}={v}" for k, v in ev.items() if k not in ("time", "job", "restart", "event", "path", "host",
                                                                   "nodes", "ntasks"))
    return f"{ev['event']}{' ' + rest if rest else ''} ({ev['time']})"


def read_run(run_dir: str | os.PathLike, group: str = "", recipe: str | None = None,
             study_status: dict[str, Any] | None = None) -> RunRow:
    """What ``run_dir``'s files say about the run (see the module docstring for the status rules; a value of the
    wrong type is unknown and named in ``RunRow.unreadable``)."""
    run_dir = Path(run_dir)
    notes: list[str] = []
    summary = _Fields(_read_json(run_dir / SUMMARY_NAME), run_dir / SUMMARY_NAME, notes)
    model = _Fields(_read_config(run_dir / "config.yaml"), run_dir / "config.yaml", notes).sub("model")
    init = model.sub("init")
    recipes = summary.get("recipes", list) or []
    row = RunRow(
        name=run_dir.name, path=str(run_dir), group=group,
        recipe=recipe or (",".join(map(str, recipes)) if recipes else None),
        backbone=model.get("backbone", str) or summary.get("backbone", str),
        init_method=init.get("method", str) or summary.get("init_method", str),
        epoch=summary.get("epoch", int), max_epochs=summary.get("max_epochs", int),
        step=summary.get("global_step", int), total_steps=summary.get("total_steps", int),
        best_val_acc1=summary.get("best_val_acc1", float), last_val_acc1=summary.get("last_val_acc1", float),
        wall_seconds=summary.get("wall_seconds", float), updated=summary.get("updated", str), unreadable=notes,
    )
    state, reason = summary.get("state", str), summary.get("reason", str)
    study = _Fields(study_status, run_dir / "status.json", notes)
    study_state, study_rc = study.get("state", str), study.get("returncode", int)
    events = read_events(run_dir)
    last_exit = next((ev for ev in reversed(events) if ev["event"] in ("exit", "requeue")), None)
    if events:
        row.last_event = _format_event(events[-1])
    elif state:
        row.last_event = f"{state} ({row.updated})"
    lock = live_lock(run_dir)
    if lock is not None:
        row.status = "running"
        row.reason = f"pid {lock.get('pid')} on {lock.get('host')}"
    elif state in ("finished", "preempted", "interrupted", "failed"):
        row.status, row.reason = state, reason
        if state == "failed" and not row.reason and last_exit is not None:
            row.reason = _format_event(last_exit)
    elif last_exit is not None and last_exit["event"] == "requeue" and last_exit.get("rc") == "0":
        row.status, row.reason = "preempted", "requeued"
    elif last_exit is not None and last_exit["event"] == "exit" and last_exit.get("rc") not in (None, "0"):
        row.status, row.reason = "failed", _format_event(last_exit)
    elif state == "running":
        row.status, row.reason = "interrupted", "stopped without a record (killed?); its lock is gone"
    elif last_exit is not None and last_exit["event"] == "exit":
        row.status = "finished"
    elif study_state in _STUDY_STATE:
        row.status = _STUDY_STATE[study_state]
        if row.status == "failed":
            row.reason = f"exit {study_rc}"
    return row


def _is_run(path: Path) -> bool:
    return path.is_dir() and bool((path / SUMMARY_NAME).exists() or (path / LOCK_NAME).exists() or existing_run(path))


def _study_rows(study_dir: Path) -> list[RunRow]:
    notes: list[str] = []
    plan = _Fields(_read_json(study_dir / "study.json"), study_dir / "study.json", notes)
    recipe = plan.get("recipe", str)
    recipe = Path(recipe).stem if recipe else None
    names = []
    for i, planned in enumerate(plan.get("runs", list) or []):
        name = _Fields(planned, study_dir / "study.json", notes, f"runs[{i}].").get("name", str)
        if name and name not in names:
            names.append(name)
    names += sorted(p.name for p in study_dir.iterdir() if p.name not in names and _is_run(p))
    rows = []
    for name in names:
        rdir = study_dir / name
        status = _read_json(rdir / "status.json")
        if not rdir.is_dir():
            rows.append(RunRow(name=name, path=str(rdir), group=study_dir.name, recipe=recipe, status="unknown",
                               reason="not started"))
        else:
            rows.append(read_run(rdir, group=study_dir.name, recipe=recipe, study_status=status))
        rows[-1].unreadable[:0] = notes  # the plan's unreadable keys (printed once however many rows carry them)
    return rows


def scan(directory: str | os.PathLike) -> list[RunRow]:
    """Every run under ``directory`` (a runs directory, a study or a single run; see the module docstring).

    Raises:
        ConfigError: ``directory`` does not exist or is not a folder.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"{directory}: no such runs directory (give the --runs_dir of the runs, or a study's folder)")
    if (root / "study.json").exists():
        return _study_rows(root)
    if _is_run(root):
        return [read_run(root)]
    rows: list[RunRow] = []
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.name.startswith("."):
            continue
        if (child / "study.json").exists():
            rows += _study_rows(child)
        elif _is_run(child):
            rows.append(read_run(child))
    return rows


SORT_KEYS = ("name", "status", "best", "last", "wall", "updated", "step")


def select(rows: list[RunRow], status: list[str] | None = None, recipe: str | None = None,
           sort: str = "name") -> list[RunRow]:
    """``rows`` with one of ``status`` and whose recipe contains ``recipe``, sorted by ``sort`` within each group
    (``best`` / ``last`` / ``wall`` / ``updated`` / ``step``: highest first, unknown last)."""
    out = [r for r in rows if (not status or r.status in status) and (not recipe or recipe in (r.recipe or ""))]
    if sort in ("name", "status"):
        return sorted(out, key=lambda r: (r.group, getattr(r, sort), r.name))
    field = {"best": "best_val_acc1", "last": "last_val_acc1", "wall": "wall_seconds", "step": "step"}.get(sort, sort)

    def key(r: RunRow) -> tuple:
        v = getattr(r, field)
        return (r.group, v is None, "" if v is None else v, r.name)

    ordered = sorted(out, key=key)
    # highest first within each group: reverse the known values only
    result: list[RunRow] = []
    for group in dict.fromkeys(r.group for r in ordered):
        members = [r for r in ordered if r.group == group]
        known = [r for r in members if getattr(r, field) is not None]
        result += sorted(known, key=lambda r: getattr(r, field), reverse=True)
        result += [r for r in members if getattr(r, field) is None]
    return result


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * float(v):.2f}"


def _wall(v: float | None) -> str:
    return "-" if v is None else str(datetime.timedelta(seconds=round(float(v))))


def _progress(r: RunRow) -> tuple[str, str]:
    epoch = "-" if r.epoch is None else f"{r.epoch}" + (f"/{r.max_epochs}" if r.max_epochs not in (None, -1) else "")
    step = "-" if r.step is None else f"{r.step}" + (f"/{r.total_steps}" if r.total_steps else "")
    return epoch, step


def format_table(rows: list[RunRow]) -> str:
    """A plain-text table of ``rows``, a header line per study group. Epoch: completed epochs as the run counts them
    (``current_epoch``); top-1 in %."""
    head = ("run", "status", "recipe", "backbone", "init", "epoch", "step", "best", "last", "wall", "last event")
    lines: list[tuple[str, ...]] = []
    groups: list[tuple[int, str]] = []  # (index in lines, study name)
    group = None
    for r in rows:
        if r.group != group:
            group = r.group
            if group:
                groups.append((len(lines), group))
        status = r.status + (f" ({r.reason})" if r.reason and r.status in ("failed", "preempted") else "")
        lines.append((r.name, status, r.recipe or "-", r.backbone or "-", r.init_method or "-", *_progress(r),
                      _pct(r.best_val_acc1), _pct(r.last_val_acc1), _wall(r.wall_seconds), r.last_event or "-"))
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths[:-1]) + "  {}"
    out = [fmt.format(*head)]
    starts = dict(groups)
    for i, ln in enumerate(lines):
        if i in starts:
            out.append(f"study {starts[i]}:")
        out.append(fmt.format(*ln))
    return "\n".join(line.rstrip() for line in out)


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="impulsevit runs", description="One table of every run under a runs directory "
                                "or a study (read from the runs' own files).")
    p.add_argument("directory", nargs="?", default="runs", help="runs directory, study or run (default: runs)")
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    p.add_argument("--status", default=None, help=f"comma-separated statuses to keep ({', '.join(STATUSES)})")
    p.add_argument("--recipe", default=None, help="keep runs whose recipe contains this text")
    p.add_argument("--sort", default="name", choices=SORT_KEYS, help="sort key within each study (default: name)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``impulsevit runs``; exit status 0 (also when no run is found: the table is then empty).

    Raises:
        ConfigError: an unknown ``--status``, or ``DIR`` is not a folder.
    """
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    status = [s.strip() for s in args.status.split(",") if s.strip()] if args.status else None
    unknown = [s for s in status or [] if s not in STATUSES]
    if unknown:
        raise ConfigError(f"--status {','.join(unknown)}: not a status; expected one of {', '.join(STATUSES)}")
    rows = select(scan(args.directory), status=status, recipe=args.recipe, sort=args.sort)
    for note in dict.fromkeys(n for r in rows for n in r.unreadable):
        print(f"impulsevit runs: warning: {note}; shown as unknown", file=sys.stderr)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    else:
        print(format_table(rows))
    return 0
