"""The writer of a run directory's event log, ``<run dir>/slurm/events.log`` (a leaf below every layer that appends
to it: the preemption callback, and the reader :mod:`impulsevit.cluster.events`, which documents the format)."""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path

from impulsevit.env import slurm_job_id, slurm_restart_count

__all__ = ["append_event", "encode", "events_path"]


def events_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "slurm" / "events.log"


def encode(value: str) -> str:
    return "".join(urllib.parse.quote(c) if c.isspace() or c == "%" else c for c in value)


def append_event(log_file: str | os.PathLike, /, **fields: object) -> None:
    """Append one ``key=value`` event line to ``log_file`` (timestamp, job id and restart count from the
    SLURM environment are added). Values are percent-encoded where they hold whitespace or ``%`` (a path with a
    space stays one token), and :func:`impulsevit.cluster.events.read_events` decodes them; the job script's own
    values have neither."""
    job = slurm_job_id() or "-"
    head = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} job={job} restart={slurm_restart_count()}"
    body = " ".join(f"{k}={encode(str(v))}" for k, v in fields.items())
    path = Path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:  # one short write per line; O_APPEND keeps lines whole
        f.write(f"{head} {body}\n")
