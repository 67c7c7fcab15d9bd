"""Which run directory a command uses, which checkpoint ``--resume`` names in it, and what a new ``fit`` does with a
run already there. The lock and the inventory of a run directory are :mod:`impulsevit.run.rundir`'s."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lightning.pytorch import Trainer

from impulsevit.errors import ConfigError, RunDirError
from impulsevit.io import child_path
from impulsevit.run.rundir import RUN_NAME_RULE, clear_run, existing_run
from impulsevit.training.checkpointing import dangling_links, resume_candidate, run_folder_checkpoint, run_limits

log = logging.getLogger("impulsevit")


def run_dir_of(runs_dir: str | os.PathLike, name: str | None) -> Path:
    """``<runs_dir>/<name>`` (``name`` defaults to ``default``), through the one name resolver
    (:func:`impulsevit.io.child_path`: one folder name that stays inside ``runs_dir``).

    Raises:
        ConfigError: ``name`` is not one folder name inside ``runs_dir``.
    """
    return child_path(runs_dir, name or "default", "--name", RUN_NAME_RULE)


def resume_checkpoint(resume: str, run_dir: Path, sub: str, trainer: Trainer,
                      extra_dirs: tuple[str, ...] = ()) -> Path | None:
    """The checkpoint ``--resume RESUME`` names for subcommand ``sub``: a path (which must exist; a run folder stands
    for its latest complete checkpoint, :func:`~impulsevit.training.checkpointing.run_folder_checkpoint`), or for
    ``auto`` the
    newest usable one in ``run_dir`` / ``extra_dirs`` (the ones passed over are logged with the reason; a checkpoint
    of a smoke run with other ``trainer`` limits is one). None: ``fit`` starts fresh.

    Raises:
        ConfigError: no such checkpoint, or ``auto`` found none for a subcommand other than ``fit``.
    """
    if resume != "auto":
        path = Path(resume)
        if path.is_symlink() and not path.exists():
            raise ConfigError(f"--resume {resume!r}: a broken link (to {os.readlink(path)}, which does not exist)")
        if not path.exists():
            raise ConfigError(f"--resume {resume!r}: no such checkpoint")
        run = run_folder_checkpoint(path)
        if run is not None:
            log.info("impulsevit: --resume %s is a run folder: its latest checkpoint %s", resume, run)
        return path if run is None else run
    for link in dangling_links(run_dir, extra_dirs):
        log.warning("impulsevit: --resume auto: skipped %s: a broken link (to %s)", link, os.readlink(link))
    path, skipped = resume_candidate(run_dir, extra_dirs=extra_dirs, limits=run_limits(trainer))
    for line in skipped:
        log.warning("impulsevit: --resume auto: skipped %s", line)
    if path is None:
        if sub != "fit":
            why = f" ({len(skipped)} skipped, see above)" if skipped else ""
            raise ConfigError(f"--resume auto: no usable checkpoint in {run_dir} to {sub}{why}")
        log.info("impulsevit: --resume auto: no usable checkpoint in %s; starting fresh", run_dir)
    return path


def start_new_run(run_dir: Path, overwrite: bool, ckpt_path: str | os.PathLike | None = None) -> None:
    """Before a new run (``fit`` without ``--resume``, not a requeued job) in ``run_dir``: refuse when it already holds
    a run, or with ``overwrite`` delete that run's files. ``ckpt_path`` is a ``fit --ckpt_path`` given instead of
    ``--resume``: Lightning's way to start from a checkpoint is not a way into an existing run (the one way to continue
    one is ``--resume``), so it is refused there, with ``overwrite`` too when the checkpoint is inside ``run_dir``
    (deleting the run would delete it).

    Raises:
        RunDirError: ``run_dir`` holds a run and ``overwrite`` is false, or ``ckpt_path`` is one of its files (the
            message names what it found and the ``--resume`` that continues it).
    """
    found = existing_run(run_dir)
    if not found:
        return
    inside = ckpt_path is not None and Path(run_dir).resolve() in Path(ckpt_path).resolve().parents
    if ckpt_path is not None and (not overwrite or inside):
        raise RunDirError(f"run directory {run_dir} already holds a run ({', '.join(found)}); --ckpt_path does not "
                          f"continue a run: continue it with --resume auto (or --resume {ckpt_path}), or choose "
                          f"another --name" + ("" if inside else ", or pass --overwrite to delete it and start over"))
    if not overwrite:
        raise RunDirError(f"run directory {run_dir} already holds a run ({', '.join(found)}); continue it with "
                          f"--resume auto, choose another --name, or pass --overwrite to delete it and start over")
    log.warning("impulsevit: --overwrite: deleting the previous run in %s (%s)", run_dir, ", ".join(found))
    clear_run(run_dir)
