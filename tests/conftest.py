"""Shared pytest configuration: CPU-only, few threads (the CI machine has 2 cores), GPU tests skipped without CUDA,
and the worker groups ``scripts/test.sh`` runs the suite in (``pytest -n 2 --dist loadgroup``)."""

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

TESTS = os.path.dirname(os.path.abspath(__file__))

# Files (relative to tests/) whose tests start the loopback SLURM cluster (tests/slurm_cluster.py: one slurmctld /
# slurmd / munged per machine), so they must not run at the same time on two workers.
SLURM_FILES = {"cluster/test_slurm.py", "cli/test_submit_convert.py", "study/test_study.py"}


def xdist_group(path) -> str:  # noqa: ANN001 - a pathlib.Path
    """The worker group of a test file: the file itself, by its name (its module-scoped fixtures — reference runs,
    converted ``.beton`` files — are then built once), except the SLURM files, which share one group. Names are unique
    across tests/ but for tests/faults/test_trackers.py and tests/training/test_trackers.py, which share a group."""
    return "slurm" if os.path.relpath(path, TESTS) in SLURM_FILES else path.name


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item.path)))


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    """In-process Lightning runs (e.g. a 1-device FSDP2 fit) may leave a default process group behind; tear it down so
    later tests that create their own group (tests/init/test_sharded.py) run instead of finding one."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def pytest_collection_finish(session):
    """On an xdist worker under ``--dist loadgroup``: every item must carry its group suffix (``nodeid@group``), else
    pytest-xdist ignored the groups (pytest 9.2 + xdist 3.8 does) and the SLURM files would start two loopback
    clusters at once (their jobs then collide on the same ports). Fails the run instead of letting it flake."""
    config = session.config
    if not hasattr(config, "workerinput") or config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
    if ungrouped:
        raise pytest.UsageError(f"pytest-xdist's loadgroup ignored the xdist_group marks (pytest {pytest.__version__}; "
                                f"e.g. {ungrouped[0]}): install the versions setup.cfg pins (bash scripts/setup.sh)")
