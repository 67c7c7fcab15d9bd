"""Strategy names a recipe may use: ``auto`` (single device), ``ddp``, ``fsdp2`` and ``fsdp`` (an alias of ``fsdp2``).

``fsdp2`` is Lightning's ``ModelParallelStrategy`` with all devices in one data-parallel dimension (no tensor
parallelism); ``ImageClassifier.configure_model`` applies ``torch.distributed.fsdp.fully_shard`` (FSDP2) per block.
It runs on CPU with gloo as well as on GPUs with NCCL, and resumes from its distributed checkpoint (a folder).

``fsdp`` means the same in impulsevit: Lightning's own ``fsdp`` (FSDP1, ``FSDPStrategy``) refuses CPU and flattens
parameters, so the initializer could not see whole tensors at ``on_fit_start``. Importing this module (done by
``impulsevit.module``) re-registers the name, which is enough on GPU; on CPU Lightning rejects the *string* ``"fsdp"``
before consulting the registry, so callers pass the name through :func:`resolve_strategy` (the CLI does), which
returns ``"fsdp2"`` for it.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry

__all__ = ["FSDP2Strategy", "default_precision", "resolve_strategy", "STRATEGY_NAMES"]

STRATEGY_NAMES = ("auto", "ddp", "fsdp2", "fsdp")


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` whose data-parallel size defaults to the world size (tensor-parallel size 1).

    Not supported: tensor parallelism (use Lightning's ``ModelParallelStrategy`` directly for that), EMA weights.
    """

    def __init__(self, save_distributed_checkpoint: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("tensor_parallel_size", 1)
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def resolve_strategy(strategy: Any) -> Any:
    """``"fsdp"`` -> ``"fsdp2"`` (see the module docstring); anything else unchanged."""
    return "fsdp2" if isinstance(strategy, str) and strategy == "fsdp" else strategy


def default_precision(accelerator: str | None = None) -> str:
    """``bf16-mixed`` on CUDA, ``32-true`` elsewhere (bf16 autocast is ~17x slower on CPUs without AVX512-BF16)."""
    if accelerator in (None, "auto"):
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    return "bf16-mixed" if accelerator in ("gpu", "cuda") else "32-true"


for _name in ("fsdp2", "fsdp"):
    StrategyRegistry.register(
        _name, FSDP2Strategy, description="FSDP2 (fully_shard) via ModelParallelStrategy; CPU (gloo) or GPU",
        override=True,
    )
