"""One owner per run directory: run names, the lock file, and the "existing run" rule of ``impulsevit fit``.

- :func:`check_name`: a run name is one path component (no ``/``, ``\\``, ``..``, ``.``, no leading ``-``, not empty),
  so ``<runs_dir>/<name>`` can neither split into nested folders nor escape ``runs_dir``.
- :class:`RunDirLock`: ``<run_dir>/.lock`` (JSON: host, pid, SLURM job id, start time), created exclusively with its
  content (a temp file hard-linked into place, so it never exists empty). A second writer fails with a message naming
  the owner; an empty or unreadable lock (a leftover) is stale, replaced with a one-line notice. A lock is also taken
  over when it is stale (same host, its pid is gone), when it belongs to this process, or when it carries this
  process's SLURM job id (a requeued job of the same run, possibly on another node). Not supported: detecting a dead
  owner on *another* host without a job id (remove ``.lock`` by hand; the message says so), pid reuse by an unrelated
  process on the same host.
- :func:`existing_run` / :func:`clear_run`: what makes a directory an existing run (a config, checkpoints, event
  files), and what ``--overwrite`` removes (those; cluster files such as ``submit.sbatch`` / ``slurm/`` are kept).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from impulsevit.env import slurm_job_id
from impulsevit.errors import ConfigError, RunDirError
from impulsevit.io import check_child_name, disk_errors, remove, temp_path
from impulsevit.procs import alive

__all__ = ["LOCK_NAME", "RUN_NAME_RULE", "RunDirLock", "check_name", "check_runs_dir", "clear_run", "existing_run",
           "launch_rank", "run_files"]

LOCK_NAME = ".lock"
_EVAL_DIRS = ("validate", "test", "predict")


RUN_NAME_RULE = "a run name must be a single folder name inside --runs_dir"


def check_name(name: str) -> str:
    """``name`` if it is a usable run name (one path component), else :class:`ConfigError` saying why
    (:func:`impulsevit.io.check_child_name`; the run directory itself: :func:`impulsevit.io.child_path`)."""
    return check_child_name(name, "--name", RUN_NAME_RULE)


def check_runs_dir(runs_dir: str | os.PathLike) -> None:
    """:class:`ConfigError` when ``runs_dir`` (or a folder above it) exists as something other than a folder."""
    path = Path(runs_dir)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                what = "a broken link" if not p.exists() else "a file"
                raise ConfigError(f"--runs_dir {runs_dir}: {p} is {what}, not a folder; choose a folder for the run "
                                  f"directories")
            return


def launch_rank() -> int:
    """This process's rank as its launcher sets it (``RANK`` / ``SLURM_PROCID`` / ``LOCAL_RANK``; 0 when unset): the
    run directory is owned by rank 0 only."""
    ranks = [os.environ.get(k) for k in ("RANK", "SLURM_PROCID", "LOCAL_RANK")]
    return max((int(r) for r in ranks if r and r.isdigit()), default=0)


class RunDirLock:
    """``<run_dir>/.lock`` held by this process while it writes the run (see the module docstring).

    Call :meth:`acquire` before the first write and :meth:`release` at the end (also after a failure). ``release``
    removes the run directory again when this lock created it and nothing else was written; ``release(discard=True)``
    (a start that failed before its first training step) first removes the run files (:func:`run_files`) that were
    not there at :meth:`acquire` — so a failed start leaves nothing that refuses the retry, and nothing it did not
    create is touched.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.held = False
        self.created_dirs: list[Path] = []
        self.existing: set[Path] = set()

    def owner(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "job": slurm_job_id(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def _takeover_reason(self, other: dict) -> str | None:
        me = self.owner()
        if other.get("job") and other.get("job") == me["job"]:
            return f"the lock belongs to this SLURM job ({me['job']}, requeued)"
        if other.get("host") == me["host"]:
            pid = int(other.get("pid") or -1)
            if pid == me["pid"]:
                return "the lock belongs to this process"
            if pid <= 0 or not alive(pid):
                return f"stale lock of pid {pid}, which is gone"
        return None

    def _create(self, text: str) -> bool:
        """Create the lock holding ``text`` unless it exists (False then). The content is written to a temp file
        first and hard-linked into place (``link`` fails on an existing name, like ``O_EXCL``), so the lock never
        exists empty: an empty one can only be a leftover (e.g. of a start on a full disk by an older version).
        Filesystems without hard links fall back to ``O_EXCL`` + write."""
        tmp = temp_path(self.path)
        try:
            tmp.write_text(text)
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            return True
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _read_other(self) -> dict | None:
        """The JSON of an existing lock; None when it is empty, unreadable or not a lock's JSON."""
        try:
            other = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return None
        return other if isinstance(other, dict) and other.get("pid") is not None else None

    def acquire(self) -> None:
        """Take the lock; raises :class:`RunDirError` naming the owner when another live process holds it."""
        with disk_errors(self.run_dir):
            missing = [p for p in (self.run_dir, *self.run_dir.parents) if not p.exists()]
            self.created_dirs = sorted(missing, key=lambda p: -len(p.parts))  # the run dir and new parents
            self.run_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.owner())
        for _ in range(3):
            with disk_errors(self.path):
                if self._create(text):
                    self.held = True
                    self.existing = set(run_files(self.run_dir))
                    return
            other = self._read_other()
            if other == {}:
                continue  # released between the attempt and the read: try again
            if other is None:
                print(f"impulsevit: {self.path} is empty or unreadable (left by a start that failed while taking it); "
                      "treated as stale and replaced", file=sys.stderr)
                reason: str | None = "an empty or unreadable lock"
            else:
                reason = self._takeover_reason(other)
            if reason is None:
                raise RunDirError(
                    f"run directory {self.run_dir} is in use by pid {other.get('pid')} on "
                    f"{other.get('host')}" + (f" (SLURM job {other['job']})" if other.get("job") else "") +
                    f" since {other.get('started')}; wait for it to finish, use another --name, or delete "
                    f"{self.path} if that process is gone") from None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        raise RunDirError(f"could not take the lock {self.path} (another process keeps re-creating it)")

    def release(self, discard: bool = False) -> None:
        """Remove the lock (and, with ``discard``, the run files this holder created; see the class)."""
        if not self.held:
            return
        self.held = False
        if discard:
            for p in sorted(set(run_files(self.run_dir)) - self.existing, key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):  # deepest first; a folder goes only when empty
                    p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
        with contextlib.suppress(OSError):
            if json.loads(self.path.read_text()).get("pid") == os.getpid():
                self.path.unlink()
        if self.created_dirs:
            with contextlib.suppress(OSError):
                for d in sorted((p for p in self.run_dir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    d.rmdir()  # only empty folders go; anything written keeps the run directory
                for d in self.created_dirs:  # the run directory, then the parents this lock created (--runs_dir)
                    d.rmdir()


def existing_run(run_dir: str | os.PathLike) -> list[str]:
    """What makes ``run_dir`` an existing training run: ``config.yaml``, ``hparams.yaml``, event files and
    checkpoints (names relative to ``run_dir``; empty when none)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p.name for p in (run_dir / "config.yaml", run_dir / "hparams.yaml") if p.exists()]
    events = list(run_dir.glob("events.out.tfevents.*"))
    ckpts = [*(run_dir / "checkpoints").glob("*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")]
    if events:
        found.append(f"{len(events)} event file(s)")
    if ckpts:
        found.append(f"{len(ckpts)} checkpoint(s)")
    return found


def run_files(run_dir: str | os.PathLike) -> list[Path]:
    """The files and folders ``fit`` writes in ``run_dir`` (what :func:`existing_run` looks for): ``config.yaml``,
    ``hparams.yaml``, ``trackers.json``, ``run.json`` (the run's summary), event files, ``checkpoints/`` and
    ``attention/`` and everything in them, Lightning's ``hpc_ckpt_*.ckpt``."""
    run_dir = Path(run_dir)
    found = [p for p in (run_dir / "config.yaml", run_dir / "hparams.yaml", run_dir / "trackers.json",
                         run_dir / "run.json") if p.exists()]
    found += [*run_dir.glob("events.out.tfevents.*"), *run_dir.glob("hpc_ckpt_*.ckpt")]
    for folder in (run_dir / "checkpoints", run_dir / "attention"):
        if folder.is_dir():
            found += [folder, *folder.rglob("*")]
    return found


def clear_run(run_dir: str | os.PathLike) -> None:
    """Remove a previous run's files for ``--overwrite``: config, hparams, ``run.json``, event files, checkpoints, the
    attention records, the trackers' ids (a new run starts new W&B / MLflow runs), ``--tracker csv``'s ``csv/`` and the
    evaluation sub-folders; other files (``submit.sbatch``, ``slurm/``, the lock, W&B's ``wandb/``) stay."""
    run_dir = Path(run_dir)
    for p in [run_dir / "config.yaml", run_dir / "hparams.yaml", run_dir / "run.json", run_dir / "checkpoints",
              run_dir / "attention", run_dir / "trackers.json", run_dir / "csv",
              *run_dir.glob("events.out.tfevents.*"), *run_dir.glob("hpc_ckpt_*.ckpt"),
              *(run_dir / d for d in _EVAL_DIRS)]:
        remove(p)
