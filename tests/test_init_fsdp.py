"""Initializers on an FSDP2-sharded model (DTensor parameters, 1-rank gloo group on CPU) equal the unsharded result."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _vit_helpers import vit

import impulsevit.init as ii


@pytest.fixture
def gloo_group(tmp_path):
    assert not dist.is_initialized(), "a process group leaked from an earlier test (see conftest.py)"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("method", ["impulse", "mimetic", "torch", "timm"])
def test_sharded_equals_unsharded(method, gloo_group):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    plain, sharded = vit(dim=128, heads=2), vit(dim=128, heads=2)
    for blk in sharded.blocks:
        fully_shard(blk)
    fully_shard(sharded)
    assert isinstance(sharded.blocks[0].attn.qkv.weight, DTensor)
    ii.initialize(plain, method, generator=3)
    ii.initialize(sharded, method, generator=3)
    for name, p in plain.named_parameters():
        q = sharded.get_parameter(name)
        assert torch.equal(p.detach(), q.full_tensor().detach()), name
