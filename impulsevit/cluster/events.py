"""Job state read from the run directory (no ``squeue``/``sacct``): ``<run dir>/slurm/events.log``.

The batch script written by :func:`impulsevit.cluster.sbatch.render_sbatch` appends one line per event::

    2026-01-01T12:00:00 job=123 restart=0 event=start host=node1 nodes=node[1-4] ntasks=32
    2026-01-01T12:30:00 job=123 restart=0 event=signal signal=TERM
    2026-01-01T12:30:02 job=123 restart=0 event=exit rc=143
    2026-01-01T12:32:10 job=123 restart=1 event=start host=node7 ...

and the preemption callback adds ``event=checkpoint path=… step=N`` and ``event=requeue rc=…`` lines.
``restart`` is SLURM's ``SLURM_RESTART_COUNT`` (same job id after a requeue). The tasks of an array job share the
file of the submitted run directory (``job=<array id>_<task id>``); :func:`job_state` does not separate them.
"""

from __future__ import annotations

import os
import urllib.parse

from impulsevit.env import slurm_job_id
from impulsevit.eventlog import append_event, events_path

__all__ = ["append_event", "events_path", "job_state", "read_events", "slurm_job_id"]  # the writer: impulsevit.eventlog


def read_events(run_dir: str | os.PathLike) -> list[dict[str, str]]:
    """All events of the run, oldest first, as dicts (``time``, ``job``, ``restart``, ``event`` and the rest)."""
    path = events_path(run_dir)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        stamp, _, rest = line.partition(" ")
        ev = {"time": stamp}
        for tok in rest.split():
            key, sep, value = tok.partition("=")
            if sep:
                ev[key] = urllib.parse.unquote(value)
        if "event" in ev:
            out.append(ev)
    return out


def job_state(run_dir: str | os.PathLike) -> str:
    """``pending`` (no event yet), ``running``, ``requeued`` (a successful ``scontrol requeue`` since the last start:
    waiting to restart), ``completed`` (last exit rc=0) or ``failed`` (last exit rc≠0).

    Only what the job wrote is known: a job killed with SIGKILL, or one still waiting in the queue after
    ``impulsevit submit``, shows its last recorded state.
    """
    state = "pending"
    for ev in read_events(run_dir):
        if ev["event"] == "start":
            state = "running"
        elif ev["event"] == "requeue" and ev.get("rc") == "0":
            state = "requeued"
        elif ev["event"] == "exit" and state != "requeued":
            state = "completed" if ev.get("rc") == "0" else "failed"
    return state
