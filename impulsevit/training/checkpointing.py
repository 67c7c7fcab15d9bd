"""Crash-safe checkpoints: atomic writes and discovery of the newest *complete* checkpoint.

- :class:`AtomicCheckpointIO` writes through :func:`impulsevit.io.atomic_write` (temp file, fsync,
  ``os.replace``): a reader (or a resumed job after SIGKILL / preemption / node failure) sees either the old file or
  the new one, never a truncated one. A killed write leaves only a ``*.tmp-<host>-<pid>`` file, which discovery ignores.
- :func:`latest_checkpoint` is what ``impulsevit fit --resume auto`` uses: among ``<run_dir>/checkpoints/*.ckpt`` and
  Lightning's SLURM ``<run_dir>/hpc_ckpt_*.ckpt`` it returns the complete one with the highest stored step (the
  newest modification time among equal steps).
- :func:`save_checkpoint` is the one way the run's callbacks write a checkpoint: every rank takes part, it is
  written under a temp name and rank 0 renames it into place (atomic for files; a distributed checkpoint folder
  replaces the old one in three steps, see :func:`impulsevit.io.commit`).
- :func:`load_weights` is the one way weights enter a model (``export``, ``predict``, a resumed fit through
  ``ImageClassifier.load_state_dict``, a pretrained source): ``load_state_dict`` whose mismatch report (hundreds of
  lines, or only its first line "Error(s) in loading state_dict for X:" where a caller kept one) becomes a one-line
  :class:`~impulsevit.errors.ConfigError` naming where the weights came from and the first tensors that are missing,
  unexpected or of another shape (:func:`weights_mismatch` is the same for code that calls ``load_state_dict``
  itself).
- :func:`checkpoint_dir` is where every writer of a run's checkpoints puts them; :func:`run_limits` (stored under
  :data:`RUN_KEY`) records how the saving run was limited, so discovery skips the checkpoints of smoke runs.

The callbacks that write checkpoints or add to them live in :mod:`impulsevit.callbacks`:
:class:`~impulsevit.callbacks.run_checkpoint.RunCheckpoint` (``ModelCheckpoint`` with a ``last.ckpt`` that is always
the newest state) and :class:`~impulsevit.callbacks.rng_state.RNGStateCheckpoint` (every rank's RNG states).

Not supported: remote (fsspec URL) checkpoint paths; atomicity of FSDP2 *distributed* checkpoints (a directory written
by several ranks; :func:`is_complete_checkpoint` instead requires its ``meta.pt``, written last by rank 0, to be newer
than every shard).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.io import TorchCheckpointIO

from impulsevit._compat.checkpoint import distributed_meta_file
from impulsevit.errors import ConfigError, mismatch_text, state_dict_mismatch
from impulsevit.io import TEMP_RE, atomic_write, atomic_write_text, commit, remove, temp_path
from impulsevit.safe_load import UntrustedFileError, load_checkpoint, trust_requested

__all__ = [
    "AtomicCheckpointIO",
    "atomic_torch_save",
    "atomic_write_text",
    "checkpoint_candidates",
    "checkpoint_dir",
    "checkpoint_step",
    "config_diff",
    "dangling_links",
    "is_complete_checkpoint",
    "is_distributed_checkpoint",
    "latest_checkpoint",
    "load_weights",
    "resume_candidate",
    "run_limits",
    "save_checkpoint",
    "shapes_mismatch",
    "smoke_reason",
    "weights_mismatch",
]

_TMP_RE = TEMP_RE


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` atomically (:func:`impulsevit.io.atomic_write`); a full disk, read-only or forbidden
    location raises :class:`impulsevit.io.WriteError` naming the path.

    Raises:
        ValueError: ``path`` is a URL (``scheme://``); only local filesystems are supported.
    """
    atomic_write(path, lambda fh: torch.save(obj, fh))


def _storage_as_saved(storage: Any, location: str) -> Any:
    """``map_location`` of Lightning's ``TorchCheckpointIO.load_checkpoint``: each storage as deserialized."""
    return storage


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning ``CheckpointIO`` whose ``save_checkpoint`` is atomic (temp file + fsync + rename).

    Used by every strategy that saves through a ``CheckpointIO`` (single device, DDP, FSDP2 with full-state
    checkpoints). Loading goes through :func:`impulsevit.safe_load.load_checkpoint` (``weights_only=True`` and the
    project's allow-list; ``weights_only=False`` from the caller, ``--trust-checkpoint`` or
    ``IMPULSEVIT_TRUST_CHECKPOINT=1`` trust the file); removal is Lightning's. ``storage_options`` are not supported
    (as in Lightning's ``TorchCheckpointIO``), nor are remote paths.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(
                "AtomicCheckpointIO.save_checkpoint(..., storage_options=...) is not supported; got "
                f"{storage_options!r}"
            )
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path: str | Path, map_location: Any = _storage_as_saved,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")  # Lightning's contract (and message)
        trust = trust_requested(True if weights_only is False else None)
        return load_checkpoint(path, map_location=map_location, trust=trust)


RUN_KEY = "impulsevit_run"
"""Checkpoint entry written by :class:`~impulsevit.callbacks.run_checkpoint.RunCheckpoint`: how the saving run was
limited."""


def _load_head(path: Path, refuse: bool = False) -> dict | None:
    """The checkpoint dict (memory-mapped: tensors are not read) when it loads and has ``global_step``, else None.
    A file that would run code when loaded is never loaded (:mod:`impulsevit.safe_load`): with ``refuse`` its
    :class:`~impulsevit.safe_load.UntrustedFileError` is raised, else it counts as not loading."""
    try:
        obj = load_checkpoint(path, mmap=True)
    except UntrustedFileError:
        if refuse:
            raise
        return None
    except Exception:  # noqa: BLE001 - any failure to load means "not a usable checkpoint"
        return None
    return obj if isinstance(obj, dict) and "global_step" in obj else None


def _loads(path: Path) -> bool:
    return _load_head(path) is not None


def run_limits(trainer: Trainer) -> dict[str, Any]:
    """How ``trainer`` limits a run: ``fast_dev_run`` and the ``limit_*_batches`` settings (plain values). Stored in
    every checkpoint by :class:`RunCheckpoint` so ``--resume auto`` can skip checkpoints of smoke runs."""
    return {"fast_dev_run": bool(trainer.fast_dev_run),
            "limit_train_batches": trainer.limit_train_batches, "limit_val_batches": trainer.limit_val_batches}


def smoke_reason(saved: dict[str, Any] | None, now: dict[str, Any] | None) -> str | None:
    """Why a checkpoint saved under limits ``saved`` must not be resumed by a run with limits ``now`` (None: fine).
    A ``fast_dev_run`` checkpoint is never resumed automatically; a ``limit_train_batches`` / ``limit_val_batches``
    that differs from the current run's marks a smoke test."""
    if not saved:
        return None
    if saved.get("fast_dev_run"):
        return "written by a fast_dev_run smoke test"
    for key in ("limit_train_batches", "limit_val_batches"):
        a, b = saved.get(key), None if now is None else now.get(key)
        if now is not None and (a != b or type(a) is not type(b)):  # 1 (one batch) is not 1.0 (all batches)
            return f"written by a run with {key}={saved.get(key)} (this run: {now.get(key)}), a smoke test"
    return None


def resume_candidate(run_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = (),
                     limits: dict[str, Any] | None = None) -> tuple[Path | None, list[str]]:
    """``--resume auto``: the furthest complete checkpoint (highest stored step) of a run directory whose run limits
    match ``limits`` (see :func:`smoke_reason`), and one line per candidate before it that was skipped
    (``path: why``).

    Raises:
        UntrustedFileError: a candidate would run code when loaded (:mod:`impulsevit.safe_load`); it is refused, not
            skipped, so a legacy checkpoint that needs ``--trust-checkpoint`` never makes ``fit`` start afresh.
    """
    skipped = []
    for candidate in checkpoint_candidates(run_dir, extra_dirs):
        if candidate.is_dir():
            if is_complete_checkpoint(candidate):
                return candidate, skipped
            skipped.append(f"{candidate}: an unfinished distributed checkpoint")
            continue
        head = _load_head(candidate, refuse=True) if candidate.stat().st_size > 0 else None
        if head is None:
            skipped.append(f"{candidate}: not a complete checkpoint (truncated, empty or unreadable)")
            continue
        why = smoke_reason(head.get(RUN_KEY), limits)
        if why is not None:
            skipped.append(f"{candidate}: {why}")
            continue
        return candidate, skipped
    return None, skipped


def is_distributed_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written as a distributed checkpoint (it holds DCP's ``.metadata``): the only
    directory a checkpoint writer may replace (:func:`impulsevit.io.commit` ``replace_dir``)."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and (path / ".metadata").is_file()


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a finished Lightning checkpoint that can be resumed from.

    A file must not be a temp file, and must load (:func:`impulsevit.safe_load.load_checkpoint` memory-mapped: the zip
    directory at the end of the file and the pickle are read, tensors are not) into a dict with ``global_step``. A
    distributed-checkpoint directory must hold DCP's ``.metadata`` and a loadable ``meta.pt`` that is at least as new
    as every other file in it.
    """
    path = Path(path)
    if _TMP_RE.search(path.name):
        return False
    if path.is_file():
        return path.stat().st_size > 0 and _loads(path)
    if path.is_dir():
        meta = distributed_meta_file(path)
        if not (meta.is_file() and (path / ".metadata").is_file()):
            return False
        newest_other = max(f.stat().st_mtime_ns for f in path.iterdir() if f.name != meta.name)
        return meta.stat().st_mtime_ns >= newest_other and _loads(meta)
    return False


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The ``global_step`` stored in a checkpoint (a file: its pickle, loaded with tensors memory-mapped, not read; a
    distributed checkpoint folder: its ``meta.pt``), or None when it does not load."""
    path = Path(path)
    if path.is_dir():
        path = distributed_meta_file(path)
    head = _load_head(path) if path.is_file() and path.stat().st_size > 0 else None
    return int(head["global_step"]) if head is not None else None


def checkpoint_candidates(run_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = ()) -> list[Path]:
    """``<run_dir>/checkpoints/*.ckpt``, ``<run_dir>/hpc_ckpt_*.ckpt`` and ``<d>/*.ckpt`` for each extra dir, furthest
    first: by the ``global_step`` stored in each (:func:`checkpoint_step`), ties broken by modification time, then
    name. Modification times alone mislead after a copy (``cp``, ``rsync``, a restore), which can make an older
    ``preempted.ckpt`` the newest file. Checkpoints that do not load come first (the callers report them as
    skipped). Temp files and ``last_good.ckpt`` are excluded; completeness is not checked here."""
    run_dir = Path(run_dir)
    found: set[Path] = set()
    folders: set[Path] = set()
    for d in (run_dir / "checkpoints", *map(Path, extra_dirs)):
        if d.is_dir() and d.resolve() not in folders:  # one folder named twice (relative, absolute) is read once
            folders.add(d.resolve())
            found.update(p for p in d.glob("*.ckpt") if p.exists())  # not a broken link (see dangling_links)
    if run_dir.is_dir():
        found.update(run_dir.glob("hpc_ckpt_*.ckpt"))
    # last_good.ckpt (NonFiniteLossGuard) is a mid-step snapshot taken before a NaN/inf loss: resuming it as-is would
    # usually hit the same loss again, so `--resume auto` never picks it; resume it explicitly with `--resume PATH`.
    found = {p for p in found if not _TMP_RE.search(p.name) and p.name != "last_good.ckpt"}

    def order(p: Path) -> tuple[float, int, str]:
        step = checkpoint_step(p)
        return (float("inf") if step is None else step, p.stat().st_mtime_ns, p.name)

    return sorted(found, key=order, reverse=True)


def dangling_links(run_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = ()) -> list[Path]:
    """The ``*.ckpt`` names among :func:`checkpoint_candidates`' folders that are links to nothing (a ``best.ckpt``
    whose target was deleted); :func:`checkpoint_candidates` passes over them."""
    dirs = {d.resolve() for d in (Path(run_dir) / "checkpoints", *map(Path, extra_dirs)) if d.is_dir()}
    return sorted(p for d in dirs for p in d.glob("*.ckpt") if p.is_symlink() and not p.exists())


def run_folder_checkpoint(path: str | os.PathLike) -> Path | None:
    """Where a checkpoint is expected (``impulsevit export``, ``predict``, ``model.pretrained``), a run folder stands
    for the checkpoint ``--resume auto`` would pick in it (:func:`latest_checkpoint`): that checkpoint when ``path``
    is a run folder — a folder holding ``checkpoints/`` and no distributed checkpoint's ``.metadata`` — else None (a
    file, a distributed checkpoint folder, an exported model folder: the caller's own checks apply).

    Raises:
        ConfigError: a run folder with no complete checkpoint (names the folder and what it looked for).
    """
    path = Path(path)
    if not path.is_dir() or (path / ".metadata").is_file() or not (path / "checkpoints").is_dir():
        return None
    found = latest_checkpoint(path)
    if found is None:
        raise ConfigError(f"{path} is a run folder with no complete checkpoint in {path / 'checkpoints'} (the run "
                          f"stopped before its first checkpoint?); give a .ckpt file")
    return found


def latest_checkpoint(run_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = ()) -> Path | None:
    """The furthest complete checkpoint of a run directory (see :func:`checkpoint_candidates`), or ``None``."""
    for candidate in checkpoint_candidates(run_dir, extra_dirs):
        if is_complete_checkpoint(candidate):
            return candidate
    return None


def checkpoint_dir(trainer: Trainer) -> Path:
    """Where a run's checkpoints live: the trainer's ``ModelCheckpoint`` ``dirpath``, else
    ``<default_root_dir>/checkpoints`` (the one rule every writer of the run's checkpoints uses)."""
    cb = trainer.checkpoint_callback
    dirpath = getattr(cb, "dirpath", None) if cb is not None else None
    return Path(dirpath) if dirpath else Path(trainer.default_root_dir) / "checkpoints"


def save_checkpoint(trainer: Trainer, path: str | os.PathLike, tag: str, weights_only: bool = False) -> Path:
    """Write the trainer's checkpoint to ``path``: a collective, every rank calls it.

    Rank 0 clears ``<path>.tmp-<tag>`` (``tag`` must be the same on every rank: a distributed checkpoint is a folder
    all ranks write into), a barrier, ``trainer.save_checkpoint`` into that temp name, a barrier, rank 0 moves it over
    ``path`` (:func:`impulsevit.io.commit`, replacing a distributed checkpoint folder), a barrier. A process killed
    before the rename leaves only the temp name, which discovery ignores. Returns ``path`` as a :class:`Path`.
    """
    path = Path(path)
    tmp = temp_path(path, tag)
    if trainer.is_global_zero:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove(tmp)
    trainer.strategy.barrier(f"save-checkpoint-{tag}-start")
    trainer.save_checkpoint(tmp, weights_only=weights_only)  # the path is given: no "was not set" line
    trainer.strategy.barrier(f"save-checkpoint-{tag}-written")
    if trainer.is_global_zero:
        commit(tmp, path, replace_dir=is_distributed_checkpoint(path))
    trainer.strategy.barrier(f"save-checkpoint-{tag}-done")
    return path


@contextlib.contextmanager
def weights_mismatch(source: str) -> Iterator[None]:
    """Around a ``load_state_dict`` call: its strict mismatch report (``RuntimeError("Error(s) in loading state_dict
    for X: ...")``) is raised as one line, ``SOURCE: the weights do not fit the model X: N tensor(s) missing from the
    weights (first: ...); M tensor(s) unexpected (first: ...) — ...`` (:func:`impulsevit.errors.state_dict_mismatch`),
    a :class:`~impulsevit.errors.ConfigError` (exit status 2) raised from it. Any other exception passes unchanged.
    ``source`` names where the weights came from (``checkpoint runs/a/last.ckpt``)."""
    try:
        yield
    except RuntimeError as e:
        why = state_dict_mismatch(e)
        if why is None:
            raise
        raise ConfigError(f"{source}: {why}") from e


def load_weights(model: torch.nn.Module, state: Mapping[str, torch.Tensor], *, source: str, strict: bool = True,
                 assign: bool = False) -> tuple[list[str], list[str]]:
    """Load ``state`` (parameter / buffer name -> tensor, the names of ``model.state_dict()``) into ``model`` in place
    with ``model.load_state_dict(state, strict=strict, assign=assign)``; the one way impulsevit puts weights into a
    model. Returns ``(missing keys, unexpected keys)`` (both empty when ``strict``).

    Raises:
        ConfigError: the tensors do not fit the model (names not in the model, model tensors the state lacks, or
            another shape; with ``strict=False`` only a shape): one line naming ``source`` and the first tensors that
            differ (:func:`weights_mismatch`). Nothing is guaranteed about the model's weights after this error.
    """
    with weights_mismatch(source):
        result = model.load_state_dict(dict(state), strict=strict, assign=assign)
    return list(result.missing_keys), list(result.unexpected_keys)


def shapes_mismatch(model: Mapping[str, tuple[int, ...]], weights: Mapping[str, tuple[int, ...]]) -> str | None:
    """How tensors named and shaped ``weights`` (name -> shape) differ from a model's (``model``, name -> shape), in
    :func:`impulsevit.errors.mismatch_text`'s words (missing and differing names in the model's order, unexpected
    ones in the weights'); None when every name and shape agrees. For checks that have only the shapes (a
    checkpoint read memory-mapped, before a resume)."""
    missing = [k for k in model if k not in weights]
    unexpected = [k for k in weights if k not in model]
    shapes = [(k, weights[k], model[k]) for k in model if k in weights and tuple(weights[k]) != tuple(model[k])]
    return mismatch_text(missing, unexpected, shapes) or None


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any], then: str = "in the checkpoint",
                now: str = "now") -> list[str]:
    """``key: OLD <then>, NEW <now>`` for every dotted key of two nested settings dicts whose value differs (missing:
    ``unset``; a list equals the tuple of the same items), sorted by key. The one comparison of saved model settings
    with the current ones: a resume's (:func:`impulsevit.run.preflight.check_resume`) and a pretrained source's
    (:func:`impulsevit.training.pretrained.check_architecture`, ``then="in the source", now="in the model"``)."""
    a, b = _flat(dict(old)), _flat(dict(new))
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k, "unset"), b.get(k, "unset")
        if va != vb and not (isinstance(va, list | tuple) and isinstance(vb, list | tuple) and list(va) == list(vb)):
            out.append(f"{k}: {va} {then}, {vb} {now}")
    return out
