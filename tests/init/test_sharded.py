"""Initializers on an FSDP2-sharded model (DTensor parameters, 1-rank gloo group on CPU) equal the unsharded result."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _vit_helpers import vit

import impulsevit.init as ii

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


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


def _threaded_rank(rank: int, store: str, methods: list[str], out: str) -> None:
    """One of 2 gloo ranks with 4 intra-op threads (what SLURM's OMP_NUM_THREADS gives a job): initialize a sharded
    and an unsharded ViT with each method and save whether every full parameter matches, plus this rank's shards."""
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(4)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        result = {}
        for method in methods:
            plain, sharded = vit(dim=64, heads=2), vit(dim=64, heads=2)
            for blk in sharded.blocks:
                fully_shard(blk)
            fully_shard(sharded)
            ii.initialize(plain, method, generator=3)
            ii.initialize(sharded, method, generator=3)
            local = {n: p.to_local().detach().clone() for n, p in sharded.named_parameters()}
            full = {n: p.full_tensor().detach() for n, p in sharded.named_parameters()}
            result[method] = {"mismatch": [n for n, p in plain.named_parameters()
                                           if not torch.equal(p.detach(), full[n])],
                              "local": local, "full": full}
        torch.save(result, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned interpreters: ~10 s alone, 30-40 s on a loaded 2-core machine
def test_sharded_two_ranks_four_threads(tmp_path):
    """2 gloo ranks × 4 threads: the initializer's writes take no collective (each rank keeps its own chunk of the
    full value), so thread pools inside the initializer cannot interleave scatters differently on each rank."""
    import torch.multiprocessing as mp

    methods = ["impulse", "mimetic", "torch", "timm"]
    mp.start_processes(_threaded_rank, args=(str(tmp_path / "store"), methods, str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for method in methods:
        assert r0[method]["mismatch"] == [] and r1[method]["mismatch"] == [], method
        for name, full in r0[method]["full"].items():
            # the two shards are the two torch.chunk halves of dim 0 of the full value
            halves = torch.chunk(full, 2, dim=0)
            assert torch.equal(r0[method]["local"][name], halves[0]), (method, name)
            if len(halves) > 1:
                assert torch.equal(r1[method]["local"][name], halves[1]), (method, name)
