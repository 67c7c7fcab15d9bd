"""`torch` / `timm` baselines, uninitialized memory after every initializer, weight selection edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from _vit_helpers import nan_empty_construction, state_digest, vit
from torch import nn

import impulsevit.init as ii


def test_torch_baseline_pytorch_defaults():
    m = vit(dim=96, heads=3)
    ii.initialize(m, "torch", generator=0)
    w = m.blocks[0].mlp.fc1.weight
    bound = 1 / math.sqrt(96)
    assert w.abs().max() <= bound and abs(w.std().item() - bound / math.sqrt(3)) < 0.05 * bound
    b = m.blocks[0].attn.qkv.bias
    assert b.abs().max() <= bound and b.abs().max() > 0.5 * bound  # non-zero biases (PyTorch default)
    conv = m.patch_embed.proj.weight
    assert conv.abs().max() <= 1 / math.sqrt(3 * 4 * 4)
    assert torch.equal(m.blocks[0].norm1.weight, torch.ones(96)) and torch.equal(m.norm.bias, torch.zeros(96))
    assert abs(m.pos_embed.std().item() - 0.02) < 0.002 and torch.equal(m.cls_token, torch.zeros(1, 1, 96))


def test_torch_baseline_generic_module_and_batchnorm():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Embedding(5, 4, padding_idx=0))
    m[1].running_mean.fill_(3.0)
    a = ii.initialize(m, "torch", generator=1)
    assert a.family == "any"
    assert torch.equal(m[1].running_mean, torch.zeros(8)) and torch.equal(m[1].running_var, torch.ones(8))
    assert torch.equal(m[2].weight[0], torch.zeros(4)) and abs(m[2].weight[1:].std().item() - 1) < 0.6
    d1 = state_digest(m)
    ii.initialize(m, "torch", generator=1)
    assert state_digest(m) == d1


def test_torch_baseline_unknown_module_uses_reset_parameters_deterministically():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.full((4,), float("nan")))

        def reset_parameters(self):
            nn.init.normal_(self.scale)

    a, b = nn.Sequential(Scaled()), nn.Sequential(Scaled())
    ii.initialize(a, "torch", generator=3)
    ii.initialize(b, "torch", generator=3)
    assert torch.isfinite(a[0].scale).all() and torch.equal(a[0].scale, b[0].scale)


def test_timm_baseline_is_timm_init_and_seeded():
    a, b = vit(dim=96, heads=3), vit(dim=96, heads=3)
    ii.initialize(a, "timm", generator=4)
    ii.initialize(b, "timm", generator=4)
    assert state_digest(a) == state_digest(b)
    w = a.blocks[0].mlp.fc1.weight
    assert abs(w.std().item() - 0.02) < 0.002 and w.abs().max() <= 2.0
    assert torch.equal(a.blocks[0].attn.qkv.bias, torch.zeros(288))
    assert abs(a.pos_embed.std().item() - 0.02) < 0.003
    c = vit(dim=96, heads=3)
    ii.initialize(c, "timm", generator=5)
    assert not torch.equal(a.blocks[0].mlp.fc1.weight, c.blocks[0].mlp.fc1.weight)


def test_timm_baseline_error_without_init_weights():
    m = nn.Sequential(nn.Linear(3, 3))
    before = m[0].weight.clone()
    with pytest.raises(ValueError, match="'timm' cannot be applied to Sequential: it has no timm `init_weights`"):
        ii.initialize(m, "timm", generator=0)
    assert torch.equal(m[0].weight, before)


@pytest.mark.parametrize("method", ["impulse", "mimetic", "torch", "timm", "weight_selection"])
def test_no_uninitialized_parameter_after_any_initializer(method, monkeypatch):
    """weight_init='skip' leaves pos_embed / cls / reg tokens as torch.empty memory (docs/method.md §2.7): make that
    memory NaN at construction and check every initializer leaves only finite values."""
    nan_empty_construction(monkeypatch)
    m = vit(dim=128, heads=2, reg_tokens=1)
    teacher = vit(dim=256, heads=4, reg_tokens=1)
    monkeypatch.undo()
    assert m.pos_embed.isnan().all() and m.cls_token.isnan().all() and m.reg_token.isnan().all()
    opts = {"teacher": teacher} if method == "weight_selection" else {}
    if method == "weight_selection":
        ii.initialize(teacher, "timm", generator=0)
    ii.initialize(m, method, generator=0, **opts)
    bad = [k for k, v in m.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
    assert not bad
    assert m(torch.randn(2, 3, 32, 32)).isfinite().all()


def test_impulse_with_base_keep_refuses_uninitialized_pos_embed(monkeypatch):
    nan_empty_construction(monkeypatch)
    m = vit(dim=128, heads=2)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="pos_embed is not finite"):
        ii.initialize(m, "impulse", generator=0, base="keep")


def test_weight_selection_depth_mismatch_first_n_and_non_divisible():
    teacher = vit(dim=120, heads=3, depth=4, mlp_ratio=4.0)
    student = vit(dim=96, heads=3, depth=2, mlp_ratio=4.0)
    ii.initialize(teacher, "timm", generator=0)
    r = ii.initialize(student, "weight_selection", teacher=teacher.state_dict())
    assert any("first 2 of the teacher's 4 blocks" in n for n in r.notes)
    idx = torch.round(torch.linspace(0, 119, 96, dtype=torch.float64)).long()
    rows = torch.round(torch.linspace(0, 359, 288, dtype=torch.float64)).long()
    torch.testing.assert_close(student.blocks[1].attn.qkv.weight, teacher.blocks[1].attn.qkv.weight[rows][:, idx])
    torch.testing.assert_close(student.pos_embed, teacher.pos_embed[:, :, idx])
    hidden = torch.round(torch.linspace(0, 479, 384, dtype=torch.float64)).long()
    torch.testing.assert_close(student.blocks[0].mlp.fc1.weight, teacher.blocks[0].mlp.fc1.weight[hidden][:, idx])


def test_weight_selection_from_checkpoint_file(tmp_path):
    teacher, student = vit(dim=128, heads=2), vit(dim=64, heads=1)
    ii.initialize(teacher, "torch", generator=0)
    path = tmp_path / "teacher.pth"
    torch.save({"model": teacher.state_dict()}, path)
    ii.initialize(student, "weight_selection", teacher=str(path))
    torch.testing.assert_close(student.blocks[0].attn.proj.weight, teacher.blocks[0].attn.proj.weight[::2, ::2])


def test_weight_selection_errors_leave_student_untouched():
    student = vit(dim=128, heads=2, depth=3)
    ii.initialize(student, "torch", generator=0)
    digest = state_digest(student)
    small = vit(dim=64, heads=1, depth=3)
    with pytest.raises(ValueError, match=r"VisionTransformer\.\S+: teacher dim 64 < student dim 128 on axis"):
        ii.initialize(student, "weight_selection", teacher=small)
    shallow = vit(dim=256, heads=4, depth=2)
    with pytest.raises(ValueError, match="teacher has no tensor for .*blocks.2"):
        ii.initialize(student, "weight_selection", teacher=shallow)
    with pytest.raises(ValueError, match="needs the option teacher"):
        ii.initialize(student, "weight_selection")
    with pytest.raises(ValueError, match="does not exist"):
        ii.initialize(student, "weight_selection", teacher="/nonexistent/t.pth")
    assert state_digest(student) == digest
    r = ii.initialize(student, "weight_selection", teacher=shallow, strict=False)
    assert any("blocks.2" in n for n in r.notes)
