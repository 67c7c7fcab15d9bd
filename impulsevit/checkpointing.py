"""Crash-safe checkpoints: atomic writes, discovery of the newest *complete* checkpoint, RNG state in checkpoints.

- :class:`AtomicCheckpointIO` writes through :func:`impulsevit.io.atomic_write` (temp file, fsync,
  ``os.replace``): a reader (or a resumed job after SIGKILL / preemption / node failure) sees either the old file or
  the new one, never a truncated one. A killed write leaves only a ``*.tmp-<host>-<pid>`` file, which discovery ignores.
- :func:`latest_checkpoint` is what ``impulsevit fit --resume auto`` uses: among ``<run_dir>/checkpoints/*.ckpt`` and
  Lightning's SLURM ``<run_dir>/hpc_ckpt_*.ckpt`` it returns the complete one with the highest stored step (the
  newest modification time among equal steps).
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
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
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
    "can_stop_now",
    "checkpoint_candidates",
    "checkpoint_dir",
    "checkpoint_step",
    "dangling_links",
    "get_rng_state",
    "rank_seed",
    "set_rng_state",
    "step_seed",
    "is_complete_checkpoint",
    "is_distributed_checkpoint",
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

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
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
    """``--resume auto``: the furthest complete checkpoint (highest stored step) of a run directory whose run limits
    match ``limits`` (see :func:`smoke_reason`), and one line per candidate before it that was skipped
    (``path: why``)."""
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


def is_distributed_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written as a distributed checkpoint (it holds DCP's ``.metadata``): the only
    directory a checkpoint writer may replace (:func:`impulsevit.io.commit` ``replace_dir``)."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and (path / ".metadata").is_file()


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


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The ``global_step`` stored in a checkpoint (a file: its pickle, loaded with tensors memory-mapped, not read; a
    distributed checkpoint folder: its ``meta.pt``), or None when it does not load."""
    path = Path(path)
    if path.is_dir():
        path = path / _DCP_META
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


def latest_checkpoint(run_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = ()) -> Path | None:
    """The furthest complete checkpoint of a run directory (see :func:`checkpoint_candidates`), or ``None``."""
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


def checkpoint_dir(trainer: Trainer) -> Path:
    """Where a run's checkpoints live: the trainer's ``ModelCheckpoint`` ``dirpath``, else
    ``<default_root_dir>/checkpoints`` (the one rule every writer of the run's checkpoints uses)."""
    cb = trainer.checkpoint_callback
    dirpath = getattr(cb, "dirpath", None) if cb is not None else None
    return Path(dirpath) if dirpath else Path(trainer.default_root_dir) / "checkpoints"


def can_stop_now(trainer: Trainer) -> bool:
    """Whether the fit loop honours ``trainer.should_stop`` at this step: ``min_epochs`` and ``min_steps`` are met."""
    loop = trainer.fit_loop
    return (not loop.min_epochs or trainer.current_epoch >= loop.min_epochs) and \
        (not loop.min_steps or trainer.global_step >= loop.min_steps)


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` for the top-k checkpoints, whose ``last.ckpt`` always holds the newest state.

    ``last.ckpt`` (``save_last``) is written by this class, not by Lightning's ``ModelCheckpoint``: at the end of
    every training epoch (after that epoch's validation and top-k save, so it carries the updated top-k state), every
    ``every_n_train_steps`` optimizer steps, and at the step where a callback sets ``trainer.should_stop``
    (``max_time``, early stopping mid-epoch, ...) — each at most once per global step. A step whose ``last.ckpt`` is
    written gets no later top-k save (as in Lightning, one checkpoint state per step): after a mid-epoch stop the
    epoch-end hooks would otherwise save a top-k file whose loop state reads "epoch finished", newer than
    ``last.ckpt``, and ``--resume auto`` would skip the rest of the interrupted epoch.

    What the stock part lacks: Lightning 2.6 writes ``last.ckpt`` only when a top-k checkpoint was saved at the same
    step, so an epoch whose monitored metric did not improve leaves ``last.ckpt`` behind (a resume would silently redo
    that epoch); a step-interval save is deferred until the monitored ``val/*`` metric exists; a mid-epoch stop ends
    without a checkpoint; and ``fast_dev_run`` still writes ``last.ckpt`` at the end of training. Only public members
    of ``ModelCheckpoint`` and ``Trainer.save_checkpoint`` are used. Top-k selection is Lightning's, unchanged.
    Sanity checks, ``fast_dev_run`` and non-fit stages never save ``last.ckpt``. Every checkpoint the trainer saves
    carries the run's limits (:func:`run_limits`), so ``--resume auto`` skips those of smoke runs.

    Not supported: ``save_last="link"`` (a symlink to the newest top-k file; ``last.ckpt`` is always a full copy here).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        """Lightning's ``ModelCheckpoint`` arguments; ``save_last`` (a bool) turns on this class's ``last.ckpt``."""
        if save_last == "link":
            raise ValueError("checkpoint.save_last='link' is not supported: last.ckpt is always a full checkpoint")
        super().__init__(
            dirpath=dirpath, filename=filename, monitor=monitor, verbose=verbose, save_last=False,
            save_top_k=save_top_k, save_on_exception=save_on_exception, save_weights_only=save_weights_only,
            mode=mode, auto_insert_metric_name=auto_insert_metric_name, every_n_train_steps=every_n_train_steps,
            train_time_interval=train_time_interval, every_n_epochs=every_n_epochs,
            save_on_train_epoch_end=save_on_train_epoch_end, enable_version_counter=enable_version_counter,
        )
        self.keep_last = bool(save_last)
        self.last_every_n_train_steps = int(every_n_train_steps or 0)
        self._last_step: int | None = None  # global step of the last.ckpt this process wrote

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[RUN_KEY] = run_limits(trainer)

    def write_last(self, trainer: Trainer) -> None:
        """Write ``<dirpath>/last.ckpt`` through ``trainer.save_checkpoint`` (every rank: a collective) unless it
        already holds this global step, or saving is off (sanity check, ``fast_dev_run``, not fitting)."""
        if not self.keep_last or trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != "fit":
            return
        if self._last_step == trainer.global_step:
            return
        path = str(Path(self.dirpath or checkpoint_dir(trainer)) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)  # given: no "was not set" line each time
        self.last_model_path, self._last_step = path, trainer.global_step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        n = self.last_every_n_train_steps
        if (n >= 1 and trainer.global_step % n == 0) or (trainer.should_stop and can_stop_now(trainer)):
            # a stop asked by a callback (Timer for max_time, a user's rule): the loops leave after this step without
            # reaching the end-of-epoch save, so save here, at a step boundary. Lightning runs checkpoint callbacks
            # after all others, so a flag set in this hook is seen.
            self.write_last(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._last_step != trainer.global_step:
            super().on_train_epoch_end(trainer, pl_module)
        self.write_last(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._last_step != trainer.global_step:
            super().on_validation_end(trainer, pl_module)
