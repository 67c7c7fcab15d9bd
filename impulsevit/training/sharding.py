"""How ``ImageClassifier.configure_model`` places the backbone: FSDP2 ``fully_shard`` under the ``fsdp2`` strategy
(:mod:`impulsevit.training.strategies`), then ``torch.compile``.

- sharding: each block (the children of ``blocks`` / ``layers`` / ``stages``) is its own FSDP2 unit, then the
  backbone; under ``bf16-mixed`` precision with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (bf16
  all-gathers and compute, fp32 gradient reduce-scatter and fp32 master weights). Idempotent.
- compile: ``nn.Module.compile`` of the backbone in place (parameter names and checkpoints unchanged), after sharding;
  ``options`` are ``torch.compile``'s keyword arguments. Idempotent.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from impulsevit._compat.torch import is_compiled

__all__ = ["compile_backbone", "shard_backbone", "shard_units"]


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The submodules that get their own FSDP2 unit: the children of ``blocks`` / ``layers`` / ``stages``."""
    for name in ("blocks", "layers", "stages"):
        seq = getattr(model, name, None)
        if isinstance(seq, nn.Sequential | nn.ModuleList):
            return list(seq)
    return []


def shard_backbone(backbone: nn.Module, mesh: Any, precision: str) -> None:
    """FSDP2 ``fully_shard`` per unit (:func:`shard_units`), then ``backbone``, over the data-parallel ``mesh``
    (None: the default process group); bf16 parameters when ``precision`` starts with ``bf16``. A backbone already
    sharded is left alone."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(backbone, FSDPModule):
        return
    policy = MixedPrecisionPolicy()
    if str(precision).startswith("bf16"):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in shard_units(backbone):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(backbone, mesh=mesh, mp_policy=policy)


def compile_backbone(backbone: nn.Module, options: bool | dict[str, Any]) -> None:
    """``backbone.compile(**options)`` in place when ``options`` is true or a mapping and it is not compiled yet."""
    if options and not is_compiled(backbone):
        backbone.compile(**(options if isinstance(options, dict) else {}))
