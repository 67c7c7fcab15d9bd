"""``impulsevit.init.capture.module_calls``, the one way the init diagnostics read a module's inputs and outputs
inside a model's forward: first calls in the order asked, keyword arguments included, eval mode without gradients,
the model's mode and hooks restored even when the forward fails, and a module that never ran named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from impulsevit.init.capture import module_calls


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.unused = nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 2)
        self.drop = nn.Dropout(0.5)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("boom")
        h = self.drop(self.a(x))
        return self.b(h) + self.b(h * 0)  # b runs twice: the first call is the one recorded

    def scaled(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.a(x) * scale


def test_first_calls_in_the_order_asked_in_eval_mode_without_grad_and_the_mode_restored():
    net = _Net().train()
    x = torch.randn(5, 3)
    b, a = module_calls(net, [net.b, net.a], x)
    assert torch.equal(a.args[0], x) and torch.allclose(a.output, net.a(x))
    assert torch.allclose(b.args[0], net.a(x))  # dropout off: eval mode; the first call of b, not the zero one
    assert not b.output.requires_grad and net.training
    assert not net.a._forward_hooks and not net.b._forward_hooks


def test_a_failing_forward_restores_the_mode_and_removes_the_hooks_and_a_module_that_did_not_run_is_named():
    net = _Net().train()
    net.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        module_calls(net, [net.a], torch.randn(2, 3))
    assert net.training and not net.a._forward_hooks
    net.fail = False
    with pytest.raises(ValueError, match=r"modules \[1\] .*Linear first.*did not run in _Net.scaled"):
        module_calls(net, [net.a, net.unused], torch.randn(2, 3), method="scaled")
    assert not net.unused._forward_hooks


def test_the_models_own_hooks_run_as_in_a_real_call():
    """FSDP2 unshards the root's parameters and casts the inputs in the root's forward pre-hook: ``module_calls``
    must call the model, not its ``forward`` (the stand-in hook here doubles the input), and ``during`` runs inside
    the module's call (where FSDP2's parameters are unsharded)."""
    net = _Net()
    net.register_forward_pre_hook(lambda _m, args: (args[0] * 2,))
    x = torch.randn(4, 3)
    (a,) = module_calls(net, [net.a], x)
    assert torch.equal(a.args[0], x * 2)
    inside = []
    (seen,) = module_calls(net, [net.a], x, during=lambda m, call: inside.append(m) or call.output.sum())
    assert inside == [net.a] and torch.allclose(seen, net.a(x * 2).sum())
