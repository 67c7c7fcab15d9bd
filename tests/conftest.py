"""Shared pytest configuration: CPU-only, few threads (the CI machine has 2 cores), GPU tests skipped without CUDA."""

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    """In-process Lightning runs (e.g. a 1-device FSDP2 fit) may leave a default process group behind; tear it down so
    later tests that create their own group (tests/test_init_fsdp.py) run instead of finding one."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
