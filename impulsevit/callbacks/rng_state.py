"""Per-rank global RNG streams carried in checkpoints (:class:`RNGStateCheckpoint`), and the pure seeding functions
behind them.

:class:`RNGStateCheckpoint` gives every rank its own global RNG streams (``seed + global_rank``, re-seeded per training
batch from (seed, rank, epoch, batch)), stores every rank's torch / numpy / python RNG states in each checkpoint and
restores each rank's own on resume, so stochastic parts of training (mixup, drop path, dropout) continue exactly after a
resume. Its checkpoint entry is keyed ``RNGStateCheckpoint`` (Lightning's ``Callback.state_key``: the class's
qualified name, not its module), the same key as when it lived in :mod:`impulsevit.training.checkpointing`.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

__all__ = ["RNGStateCheckpoint", "get_rng_state", "rank_seed", "seed_global_rngs", "set_rng_state", "step_seed"]


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
