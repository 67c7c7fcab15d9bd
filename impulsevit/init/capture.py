"""What a model's own forward computes inside it: the attention probabilities, whatever attention code it runs
(:func:`captured_attention`), and the inputs and outputs of chosen modules (:func:`module_calls`). Both run the
forward in eval mode without gradients and restore the model's mode, whatever happens.

A ``TorchFunctionMode`` watches the forward: every ``softmax`` over the last axis of a square 4-D tensor (the
explicit path: ``attn.softmax(dim=-1)``, ``nn.Softmax``) is recorded as it is, and every
``F.scaled_dot_product_attention`` call is recorded as ``softmax(q kᵀ · scale + attn_mask)`` computed from the very
``q``, ``k``, mask and scale the model passed (rotary embeddings, biases and cosine normalisation already applied by the
model's code). The model's outputs are unchanged. Not supported: ``is_causal`` / dropout inside SDPA (init diagnostics
run in eval mode), attention implemented without either call (e.g. custom kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["ModuleCall", "captured_attention", "eval_forward", "module_calls"]

_SOFTMAX = {torch.softmax, torch.Tensor.softmax, F.softmax}


def _sdpa_probs(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    q, k, mask = bound["query"].float(), bound["key"].float(), bound.get("attn_mask")
    scale = bound.get("scale") or 1.0 / math.sqrt(q.shape[-1])
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: repeat the key heads
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    logits = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        logits = logits.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else logits + mask.float()
    return torch.softmax(logits, dim=-1)


class _Capture(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.maps: list[torch.Tensor] = []
        self.active = True

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.active:
            return out
        if func is F.scaled_dot_product_attention:
            self.maps.append(_sdpa_probs(args, kwargs).detach())
        elif func in _SOFTMAX and isinstance(out, torch.Tensor) and out.dim() == 4 and out.shape[-1] == out.shape[-2]:
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if dim in (-1, 3):
                self.maps.append(out.detach().float())
        return out


@contextmanager
def eval_forward(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode without gradients for the block's duration; its mode restored on exit (an error
    included)."""
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


@dataclass(frozen=True)
class ModuleCall:
    """One module's call in a forward: its positional ``args``, keyword ``kwargs`` and ``output``, tensors detached
    (not copied)."""

    args: tuple
    kwargs: dict[str, Any]
    output: Any


def _detached(x: Any) -> Any:
    return x.detach() if isinstance(x, torch.Tensor) else x


def module_calls(model: nn.Module, modules: Sequence[nn.Module], *inputs: Any, method: str = "forward",
                 during: Callable[[nn.Module, ModuleCall], Any] | None = None) -> list[Any]:
    """The first call of each of ``modules`` (in the order given) while ``getattr(model, method)(*inputs)`` runs
    under :func:`eval_forward`, as a :class:`ModuleCall`, or ``during(module, call)`` computed inside that call — where
    a computation needs the module's parameters as its forward sees them (FSDP2 unshards them only while the module
    runs; after the forward they are sharded ``DTensor`` again). ``method="forward"`` calls ``model(*inputs)``, so the
    model's own hooks run (FSDP2's root hook unshards and casts the inputs to its parameter dtype); another method is
    called as it is. The hooks are removed whatever happens.

    Raises:
        ValueError: a module of ``modules`` did not run in that forward (naming its position in ``modules``)."""
    calls: list[Any] = [None] * len(modules)

    def recorder(i: int) -> Any:
        def hook(_m: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if calls[i] is None:
                call = ModuleCall(tuple(_detached(a) for a in args), {k: _detached(v) for k, v in kwargs.items()},
                                  _detached(output))
                calls[i] = call if during is None else during(_m, call)
        return hook

    hooks = [m.register_forward_hook(recorder(i), with_kwargs=True) for i, m in enumerate(modules)]
    try:
        with eval_forward(model):
            (model if method == "forward" else getattr(model, method))(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    missing = [i for i, c in enumerate(calls) if c is None]
    if missing:
        raise ValueError(f"modules {missing} (of {len(modules)}, {type(modules[missing[0]]).__name__} first) did not "
                         f"run in {type(model).__name__}.{method}")
    return calls  # type: ignore[return-value]


def captured_attention(model: nn.Module, images: torch.Tensor,
                       within: Sequence[nn.Module] | None = None) -> list[torch.Tensor]:
    """Every attention softmax of ``model(images)`` in forward order, each ``(B', heads, T, T)`` float32 (``B'`` =
    batch, or batch × windows for windowed attention). Runs in eval mode without gradients; the mode is restored.

    Args:
        within: record only while one of these modules runs (e.g. the transformer blocks, leaving out an attention
            pooling head).
    """
    mode = _Capture()
    hooks = []
    if within is not None:
        mode.active = False

        def enter(*_: Any) -> None:
            mode.active = True

        def leave(*_: Any) -> None:
            mode.active = False

        for module in within:
            hooks += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        with eval_forward(model), mode:
            model(images)
    finally:
        for hook in hooks:
            hook.remove()
    return mode.maps
