"""Strategy names a recipe may use: ``auto`` (single device), ``ddp``, ``ddp_bf16`` and ``fsdp2``.

- ``ddp_bf16`` is Lightning's ``DDPStrategy`` with PyTorch's ``bf16_compress_hook``: gradients are cast to bfloat16
  for the all-reduce (half the bytes on the wire) and the averaged result is written back in the parameters' dtype.
  The optimizer still steps fp32 master weights; the sum over ranks loses bf16's 8 mantissa bits of precision, the
  usual trade-off (timm/DeiT train with fp32 or fp16 reductions; this is the common large-cluster setting). On by
  default in the GPU recipes; ``--trainer.strategy=ddp`` turns it off. Works with gloo (CPU) as well as NCCL:
  :class:`BF16DDPStrategy` registers the hook on any device (Lightning's ``DDPStrategy`` registers comm hooks on CUDA
  only, so on CPU its ``ddp_comm_hook`` argument would be ignored silently).
- ``fsdp2`` is Lightning's ``ModelParallelStrategy`` with all devices in one data-parallel dimension (no tensor
  parallelism); ``ImageClassifier.configure_model`` applies ``torch.distributed.fsdp.fully_shard`` (FSDP2) per block,
  with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` under bf16 precision. It runs on CPU with gloo as
  well as on GPUs with NCCL, and resumes from its distributed checkpoint (a folder). The bf16 design is one for both
  device types: Lightning's bf16 autocast around the step on top of FSDP2's bf16 parameters (autocast keeps its fp32
  ops — norms, softmax, losses — in fp32 on CPU and CUDA alike); code that calls a submodule outside the training
  forward (the pseudo-input attention maps of the ``Initializer``) computes in float32 from the unsharded bf16
  parameters. ``tests/training/test_fsdp.py`` runs this on 2 gloo ranks and checks its losses against ``ddp_bf16``.

Lightning's own ``fsdp`` (FSDP1, ``FSDPStrategy``) is not supported — it flattens parameters, so the initializer could
not see whole tensors at ``on_fit_start`` — and the name is left as Lightning defines it: :func:`check_strategy`
(called by the CLI before anything is built) rejects it with a one-line error pointing to ``fsdp2``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

from impulsevit._compat.lightning import CommHookOnAnyDeviceDDPStrategy, default_data_parallel_to_world
from impulsevit.safe_load import check_distributed_checkpoint, trust_requested

__all__ = ["BF16DDPStrategy", "FSDP2Strategy", "check_strategy", "default_precision", "STRATEGY_NAMES"]

STRATEGY_NAMES = ("auto", "ddp", "ddp_bf16", "fsdp2")


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` whose data-parallel size defaults to the world size (tensor-parallel size 1).

    A distributed checkpoint folder is checked by :func:`impulsevit.safe_load.check_distributed_checkpoint` before
    Lightning and torch.distributed.checkpoint read it (DCP unpickles its ``.metadata`` and non-tensor entries without
    ``weights_only``): a folder that would run code is refused unless trusted (``weights_only=False`` given to the
    trainer, ``--trust-checkpoint`` or ``IMPULSEVIT_TRUST_CHECKPOINT=1``, which also load ``meta.pt`` and a full
    checkpoint file with ``weights_only=False``).

    Not supported: tensor parallelism (use Lightning's ``ModelParallelStrategy`` directly for that), EMA weights.
    """

    def __init__(self, save_distributed_checkpoint: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("tensor_parallel_size", 1)
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        default_data_parallel_to_world(self)
        super().setup_environment()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        trust = trust_requested(True if weights_only is False else None)
        if Path(checkpoint_path).is_dir():
            check_distributed_checkpoint(checkpoint_path, trust=trust)
        return super().load_checkpoint(checkpoint_path, weights_only=False if trust else weights_only)


class BF16DDPStrategy(CommHookOnAnyDeviceDDPStrategy):
    """Lightning's ``DDPStrategy`` with PyTorch's ``bf16_compress_hook`` registered on every device type."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("ddp_comm_hook", bf16_compress_hook)
        super().__init__(**kwargs)


def check_strategy(strategy: Any) -> None:
    """Raise ``ValueError`` for ``trainer.strategy: fsdp`` (Lightning's FSDP1), naming the replacement ``fsdp2``."""
    if isinstance(strategy, str) and strategy.startswith("fsdp") and strategy != "fsdp2":
        raise ValueError(f"trainer.strategy: {strategy!r} is Lightning's FSDP1, which impulsevit does not support "
                         "(flat parameters cannot be initialized per tensor); use trainer.strategy: fsdp2")


def default_precision(accelerator: str | None = None) -> str:
    """``bf16-mixed`` on CUDA, ``32-true`` elsewhere (bf16 autocast is ~17x slower on CPUs without AVX512-BF16)."""
    if accelerator in (None, "auto"):
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    return "bf16-mixed" if accelerator in ("gpu", "cuda") else "32-true"


StrategyRegistry.register(
    "fsdp2", FSDP2Strategy, description="FSDP2 (fully_shard) via ModelParallelStrategy; CPU (gloo) or GPU",
    override=True,
)
StrategyRegistry.register(
    "ddp_bf16", BF16DDPStrategy, description="DDP with bf16 gradient compression (bf16_compress_hook)", override=True
)
