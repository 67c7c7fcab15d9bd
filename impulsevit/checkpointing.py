"""Crash-safe checkpoints: atomic writes, discovery of the newest *complete* checkpoint, RNG state in checkpoints.

- :class:`AtomicCheckpointIO` writes through :func:`impulsevit.io.atomic_write` (temp file, fsync,
  ``os.replace``): a reader (or a resumed job after SIGKILL / preemption / node failure) sees either the old file or
  the new one, never a truncated one. A killed write leaves only a ``*.tmp-<host>-<pid>`` file, which discovery ignores.
- :func:`latest_checkpoint` is what ``impulsevit fit --resume auto`` uses: among ``<run_dir>/checkpoints/*.ckpt`` and
  Lightning's SLURM ``<run_dir>/hpc_ckpt_*.ckpt`` it returns the newest (modification time) that is complete.
- :class:`RunCheckpoint` is Lightning's ``ModelCheckpoint`` with a ``last.ckpt`` that is always the newest state.
- :class:`RNGStateCheckpoint` stores the global torch / numpy / python RNG states in each checkpoint and restores them
  on resume, so stochastic parts of training (mixup, drop path, dropout) continue their streams after a resume.

Not supported: remote (fsspec URL) checkpoint paths; atomicity of FSDP2 *distributed* checkpoints (a directory written
by several ranks; :func:`is_complete_checkpoint` instead requires its ``meta.pt``, written last by rank 0, to be newer
than every shard).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from impulsevit.io import TEMP_RE, atomic_write, atomic_write_text

__all__ = [
    "AtomicCheckpointIO",
    "RNGStateCheckpoint",
    "RunCheckpoint",
    "atomic_torch_save",
    "atomic_write_text",
    "checkpoint_candidates",
    "is_complete_checkpoint",
    "latest_checkpoint",
    "resume_candidate",
    "run_limits",
    "smoke_reason",
]

_TMP_RE = TEMP_RE
_DCP_META = "meta.pt"  # Lightning's name for the non-tensor part of a distributed checkpoint (rank 0, written last)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` atomically (:func:`impulsevit.io.atomic_write`); a full disk, read-only or forbidden
    location raises :class:`impulsevit.io.WriteError` naming the path.

    Raises:
        ValueError: ``path`` is a URL (``scheme://``); only local filesystems are supported.
    """
    atomic_write(path, lambda fh: torch.save(obj, fh))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning ``CheckpointIO`` whose ``save_checkpoint`` is atomic (temp file + fsync + rename).

    Used by every strategy that saves through a ``CheckpointIO`` (single device, DDP, FSDP2 with full-state
    checkpoints). Loading and removal are Lightning's. ``storage_options`` are not supported (as in Lightning's
    ``TorchCheckpointIO``), nor are remote paths.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(
                "AtomicCheckpointIO.save_checkpoint(..., storage_options=...) is not supported; got "
                f"{storage_options!r}"
            )
        atomic_torch_save(checkpoint, path)


RUN_KEY = "impulsevit_run"  # checkpoint entry written by RunCheckpoint: how the run that saved it was limited


def _load_head(path: Path) -> dict | None:
    """The checkpoint dict (memory-mapped: tensors are not read) when it loads and has ``global_step``, else None."""
    try:
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
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
    """``--resume auto``: the newest complete checkpoint of a run directory whose run limits match ``limits`` (see
    :func:`smoke_reason`), and one line per newer candidate skipped (``path: why``)."""
    skipped = []
    for candidate in checkpoint_candidates(run_dir, extra_dirs):
        if candidate.is_dir():
            if is_complete_checkpoint(candidate):
                return candidate, skipped
            skipped.append(f"{candidate}: an unfinished distributed checkpoint")
            continue
        head = _load_head(candidate) if candidate.stat().st_size > 0 else None
        if head is None:
            skipped.append(f"{candidate}: not a complete checkpoint (truncated, empty or unreadable)")
            continue
        why = smoke_reason(head.get(RUN_KEY), limits)
        if why is not None:
            skipped.append(f"{candidate}: {why}")
            continue
        return candidate, skipped
    return None, skipped


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a finished Lightning checkpoint that can be resumed from.

    A file must not be a temp file, and must load (``torch.load(mmap=True)``: the zip directory at the end of the file
    and the pickle are read, tensors are not) into a dict with ``global_step``. A distributed-checkpoint directory must
    hold DCP's ``.metadata`` and a loadable ``meta.pt`` that is at least as new as every other file in it.
    """
    path = Path(path)
    if _TMP_RE.search(path.name):
        return False
    if path.is_file():
        return path.stat().st_size > 0 and _loads(path)
    if path.is_dir():
        meta = path / _DCP_META
        if not (meta.is_file() and (path / ".metadata").is_file()):
            return False
        newest_other = max(f.stat().st_mtime_ns for f in path.iterdir() if f.name != _DCP_META)
        return meta.stat().st_mtime_ns >= newest_other and _loads(meta)
    return False


def checkpoint_candidates(run_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = ()) -> list[Path]:
    """``<run_dir>/checkpoints/*.ckpt``, ``<run_dir>/hpc_ckpt_*.ckpt`` and ``<d>/*.ckpt`` for each extra dir, newest
    first (by modification time; ties broken by name). Temp files and ``last_good.ckpt`` are excluded; completeness is
    not checked here."""
    run_dir = Path(run_dir)
    found: set[Path] = set()
    for d in (run_dir / "checkpoints", *map(Path, extra_dirs)):
        if d.is_dir():
            found.update(d.glob("*.ckpt"))
    if run_dir.is_dir():
        found.update(run_dir.glob("hpc_ckpt_*.ckpt"))
    # last_good.ckpt (NonFiniteLossGuard) is a mid-step snapshot taken before a NaN/inf loss: resuming it as-is would
    # usually hit the same loss again, so `--resume auto` never picks it; resume it explicitly with `--resume PATH`.
    found = {p for p in found if not _TMP_RE.search(p.name) and p.name != "last_good.ckpt"}
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)


def latest_checkpoint(run_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = ()) -> Path | None:
    """The newest complete checkpoint of a run directory (see :func:`checkpoint_candidates`), or ``None``."""
    for candidate in checkpoint_candidates(run_dir, extra_dirs):
        if is_complete_checkpoint(candidate):
            return candidate
    return None


class RNGStateCheckpoint(Callback):
    """Saves the global RNG states (torch CPU, CUDA when present, numpy, python ``random``) into every checkpoint and
    restores them when a checkpoint is loaded for resuming.

    Runs in ``state_dict`` (checkpoint save) and ``load_state_dict`` (restore, before the fit loop starts). Rank 0's
    state is saved and every rank restores it (with Lightning's ``seed_everything`` all ranks start from the same seed
    anyway). DataLoader worker and sampler generators are not covered: samplers own their seeds.
    """

    def state_dict(self) -> dict[str, Any]:
        # plain tensors / ints / floats only, so the checkpoint stays loadable with torch.load(weights_only=True)
        _, keys, pos, has_gauss, gauss = np.random.get_state()
        version, py_state, py_gauss = random.getstate()
        state = {
            "torch": torch.get_rng_state(),
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                      "gauss": float(gauss)},
            "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        npy = state_dict["numpy"]
        np.random.set_state(("MT19937", npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                             npy["gauss"]))
        py = state_dict["python"]
        random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
        cuda = state_dict.get("cuda")
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` always holds the newest state: rewritten after every validation at
    the end of an epoch (or at the end of every training epoch when validation is off) and at every
    ``every_n_train_steps`` step, whether or not a top-k checkpoint was written then.

    Why: Lightning 2.6 writes ``last.ckpt`` only when a top-k checkpoint was saved at the same step, so an epoch whose
    monitored metric did not improve leaves ``last.ckpt`` behind (a resume would silently redo that epoch); and a
    step-interval save is deferred until the monitored ``val/*`` metric exists (so no mid-epoch checkpoint before the
    first validation). Top-k selection itself is unchanged. Sanity checks, ``fast_dev_run`` (also at the end of
    training, where Lightning 2.6 would) and non-fit stages never save. Every checkpoint the trainer saves carries the
    run's limits (:func:`run_limits`), so ``--resume auto`` skips those of smoke runs.
    """

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[RUN_KEY] = run_limits(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.fast_dev_run:  # Lightning 2.6 saves last.ckpt here even under fast_dev_run
            return
        super().on_train_end(trainer, pl_module)

    def _save_last_if_stale(self, trainer: Trainer) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer) and \
                self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        n = self._every_n_train_steps
        if n >= 1 and trainer.global_step % n == 0:
            self._save_last_if_stale(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_stale(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_stale(trainer)
