"""torch private members impulsevit uses (see :mod:`impulsevit._compat`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

__all__ = ["fan_in_and_fan_out", "foreach_norm", "is_compiled", "tensors_replaced"]


def fan_in_and_fan_out(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """``(fan_in, fan_out)`` PyTorch's initializers use for a weight of ``shape`` (at least 2-d; ``Linear``
    ``(out, in)``: ``(in, out)``; ``Conv`` ``(out, in/groups, *k)``: ``(in/groups·∏k, out·∏k)``). No memory is
    allocated (computed on a meta tensor). Raises ``ValueError`` for fewer than 2 dimensions (as PyTorch does).

    Reaches: ``torch.nn.init._calculate_fan_in_and_fan_out``
    Checked on: torch>=2.4,<2.16
    Waits for: a public fan computation (none in torch: ``nn.init`` keeps it private, timm re-implements it).
    """
    return nn.init._calculate_fan_in_and_fan_out(torch.empty(tuple(shape), device="meta"))


def foreach_norm(tensors: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """The 2-norm of each tensor of ``tensors`` (any shapes, one device per tensor), accumulated and returned in
    ``dtype``: one 0-d tensor per input, on its device, in one fused kernel per device/dtype group. Nothing is read
    back to the host.

    Reaches: ``torch._foreach_norm``
    Checked on: torch>=2.4,<2.16
    Waits for: a public per-tensor fused norm (``torch.nn.utils.get_total_norm`` fuses but returns one total; a
    ``torch.linalg.vector_norm`` per tensor launches one kernel each).
    """
    return list(torch._foreach_norm(tensors, 2, dtype=dtype))


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module.compile()`` (in-place ``torch.compile`` of the module's ``__call__``) was already applied.

    Reaches: ``torch.nn.Module._compiled_call_impl``
    Checked on: torch>=2.4,<2.16
    Waits for: a public flag for ``nn.Module.compile`` (torch has none; ``torch.compile(module)`` would return a
    wrapper ``OptimizedModule`` instead, which changes the state-dict keys).
    """
    return getattr(module, "_compiled_call_impl", None) is not None


@contextlib.contextmanager
def tensors_replaced(module: nn.Module, replace: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[nn.Module]:
    """Within the block, every parameter and buffer of ``module`` and its submodules is ``replace(tensor)``
    (parameters re-wrapped as ``nn.Parameter`` with the original ``requires_grad``); the originals are put back on
    exit, also on error. The modules' tables are written directly: no parameter/buffer registration hooks run and a
    module's own ``__setattr__`` (FSDP2's ``FSDPModule`` classes) is not involved, so sharded modules keep their
    state. Yields ``module``.

    Reaches: ``torch.nn.Module._parameters`` / ``_buffers`` (written)
    Checked on: torch>=2.4,<2.16
    Waits for: a public temporary swap that in-place code can run under (``torch.func.functional_call`` swaps for a
    forward call only; ``torch.nn.utils.swap_tensors`` changes the original tensor objects).
    """
    saved: list[tuple[dict, str, torch.Tensor]] = []
    try:
        for mod in module.modules():
            for n, p in list(mod._parameters.items()):
                if p is not None:
                    saved.append((mod._parameters, n, p))
                    mod._parameters[n] = nn.Parameter(replace(p), requires_grad=p.requires_grad)
            for n, b in list(mod._buffers.items()):
                if b is not None:
                    saved.append((mod._buffers, n, b))
                    mod._buffers[n] = replace(b)
        yield module
    finally:
        for store, n, t in reversed(saved):
            store[n] = t
