"""Crash-safe checkpoints: atomic writes, discovery of the newest *complete* checkpoint, RNG state in checkpoints.

- :class:`AtomicCheckpointIO` writes through :func:`impulsevit.io.atomic_write` (temp file, fsync,
  ``os.replace``): a reader (or a resumed job after SIGKILL / preemption / node failure) sees either the old file or
  the new one, never a truncated one. A killed write leaves only a ``*.tmp-<host>-<pid>`` file, which discovery ignores.
- :func:`latest_checkpoint` is what ``impulsevit fit --resume auto`` uses: among ``<run_dir>/checkpoints/*.ckpt`` and
  Lightning's SLURM ``<run_dir>/hpc_ckpt_*.ckpt`` it returns the newest (modification time) that is complete.
- :class:`RunCheckpoint` is Lightning's ``ModelCheckpoint`` with a ``last.ckpt`` that is always the newest state.
- :class:`RNGStateCheckpoint` gives every rank its own global RNG streams (``seed + global_rank``, re-seeded per
  training batch from (seed, rank, epoch, batch)), stores every rank's torch / numpy / python RNG states in each
  checkpoint and restores each rank's own on resume, so stochastic parts of training (mixup, drop path, dropout)
  continue exactly after a resume.
- :class:`RunCheckpoint` also writes ``last.ckpt`` at the step where any callback sets ``trainer.should_stop``
  (``max_time``, early stopping mid-epoch, ...), so every graceful stop leaves a checkpoint to resume from.

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
    "get_rng_state",
    "rank_seed",
    "set_rng_state",
    "step_seed",
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


def rank_seed(seed: int, rank: int) -> int:
    """The global-RNG seed of rank ``rank``: ``seed + rank`` (timm's and DeiT's rule), so replicas draw different
    mixup / CutMix / drop-path randomness."""
    return int(seed) + int(rank)


def step_seed(seed: int, rank: int, epoch: int, batch: int) -> np.ndarray:
    """Four uint32 words seeding the global RNGs for training batch ``batch`` of ``epoch`` on ``rank``."""
    return np.random.SeedSequence([0x57E9, int(seed) & 0xFFFFFFFF, int(rank), int(epoch), int(batch)]).generate_state(4)


def get_rng_state() -> dict[str, Any]:
    """This process's global RNG states (torch CPU, CUDA when initialised, numpy, python) as plain tensors / ints /
    floats, so a checkpoint holding them stays loadable with ``torch.load(weights_only=True)``."""
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


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    npy = state["numpy"]
    np.random.set_state(("MT19937", npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["gauss"]))
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def seed_global_rngs(words: np.ndarray) -> None:
    """Seed Python's ``random``, numpy's global RNG and torch's CPU (and current CUDA device's) generator."""
    random.seed((int(words[0]) << 32) | int(words[1]))
    np.random.seed(words)
    torch_seed = (int(words[2]) << 32) | int(words[3])
    torch.default_generator.manual_seed(torch_seed)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.default_generators[torch.cuda.current_device()].manual_seed(torch_seed)


class RNGStateCheckpoint(Callback):
    """Per-rank global RNG streams: seeded with ``seed + global_rank``, re-seeded per training batch from (seed, rank,
    epoch, batch), saved per rank in every checkpoint and restored per rank on resume.

    - ``setup`` (fit): ``seed_everything(seed + global_rank)`` (:func:`rank_seed`; ``seed`` is Lightning's
      ``PL_GLOBAL_SEED``, i.e. ``seed_everything`` of the recipe), as timm and DeiT seed their ranks; nothing happens
      when no global seed was set.
    - ``on_train_batch_start``: the global RNGs (python, numpy, torch CPU, the current CUDA device) are re-seeded from
      :func:`step_seed` ``(seed, rank, epoch, batch)`` when ``per_batch`` (default). Every draw of a training step
      from them (timm's mixup / CutMix λ and box from numpy, drop-path and dropout masks from torch) is then a
      function of (seed, rank, epoch, batch), whatever ran before it (validation, checkpoint writes, a resume).
    - ``state_dict``: every rank's states, gathered (a collective: Lightning dumps checkpoints on every rank);
      ``load_state_dict`` restores the state saved by this rank (a checkpoint from another world size: ranks beyond
      the saved ones keep their fresh ``seed + rank`` streams). Checkpoints written before per-rank states existed
      (one state) are restored on every rank.

    Not supported: RNGs other than the global ones (samplers and augmenters own their seeds).
    """

    def __init__(self, per_batch: bool = True) -> None:
        self.per_batch = per_batch
        self._seed: int | None = None
        self._rank = 0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._rank = int(trainer.global_rank)
        seed = os.environ.get("PL_GLOBAL_SEED")
        self._seed = int(seed) if seed is not None else None
        if stage == "fit" and self._seed is not None:
            from lightning.fabric.utilities.seed import seed_everything

            workers = os.environ.get("PL_SEED_WORKERS", "0") == "1"
            seed_everything(rank_seed(self._seed, self._rank), workers=workers, verbose=False)
            os.environ["PL_GLOBAL_SEED"] = str(self._seed)  # keep the run's seed for later stages / processes

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.per_batch and self._seed is not None:
            seed_global_rngs(step_seed(self._seed, self._rank, trainer.current_epoch, batch_idx))

    def state_dict(self) -> dict[str, Any]:
        mine = get_rng_state()
        if torch.distributed.is_available() and torch.distributed.is_initialized() and \
                torch.distributed.get_world_size() > 1:
            states: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, mine)
        else:
            states = [mine]
        return {"ranks": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "ranks" not in state_dict:  # a checkpoint from before per-rank states: one state for all ranks
            set_rng_state(state_dict)
            return
        rank = torch.distributed.get_rank() if torch.distributed.is_available() and \
            torch.distributed.is_initialized() else 0
        states = state_dict["ranks"]
        if rank < len(states):
            set_rng_state(states[rank])


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` always holds the newest state: rewritten after every validation at
    the end of an epoch (or at the end of every training epoch when validation is off) and at every
    ``every_n_train_steps`` step, whether or not a top-k checkpoint was written then.

    Why: Lightning 2.6 writes ``last.ckpt`` only when a top-k checkpoint was saved at the same step, so an epoch whose
    monitored metric did not improve leaves ``last.ckpt`` behind (a resume would silently redo that epoch); and a
    step-interval save is deferred until the monitored ``val/*`` metric exists (so no mid-epoch checkpoint before the
    first validation). It is also written at the step where ``trainer.should_stop`` is set (Lightning would otherwise
    end a mid-epoch stop without a checkpoint). Top-k selection itself is unchanged. Sanity checks, ``fast_dev_run``
    (also at the end of training, where Lightning 2.6 would) and non-fit stages never save. Every checkpoint the
    trainer saves carries the run's limits (:func:`run_limits`), so ``--resume auto`` skips those of smoke runs.
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
        elif trainer.should_stop and trainer.fit_loop._can_stop_early:
            # A callback (Timer for max_time, a user's stop rule) asked to stop: the loops leave after this step
            # without reaching the end-of-epoch save, so save here — at a step boundary, mid-epoch state intact.
            # Lightning runs checkpoint callbacks after all others, so a flag set in this hook is seen.
            self._save_last_if_stale(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_stale(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_stale(trainer)
