"""The one reader of the SLURM / launcher environment (a leaf: no impulsevit imports), used by the run directory's
owner check, the preemption callback, the event log and the fit command line."""

from __future__ import annotations

import os

__all__ = ["slurm_job_id", "slurm_restart_count"]


def slurm_job_id() -> str | None:
    """``$SLURM_JOB_ID``, or ``<array job id>_<task id>`` inside an array job; ``None`` outside SLURM."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def slurm_restart_count() -> int:
    """``$SLURM_RESTART_COUNT``: how often SLURM requeued this job (0 outside SLURM, unset or empty)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
