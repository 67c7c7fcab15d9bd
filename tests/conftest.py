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


# The groups that keep one worker longest (the CI run of 2026-12-06 on 2 cores: the exact-resume file ~10 min, the
# SLURM files ~6, then files with one or two 25-40 s tests), longest first. pytest-xdist's loadgroup hands whole
# groups to the workers in queue order, and by default orders that queue by test count, which put the one-test files
# of 35-40 s last: one worker then finished them while the other idled. These go first (longest-processing-time-first);
# the other groups follow by test count, so the short ones fill the end.
LONG_GROUPS = ("test_exact_resume.py", "slurm", "test_resume.py", "test_benchmarks.py", "test_pretrained_faults.py",
               "test_runs.py", "test_tutorial.py", "test_torchrun.py", "test_gpu_check.py", "test_compile.py")


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
    if loadgroup(config):
        items[:] = by_group_length(items)


def by_group_length(items: list) -> list:
    """``items`` with each xdist group's tests together, in collection order, and the groups in the order they should
    start: ``LONG_GROUPS`` first, in its order, then the rest by test count (most first), ties in collection order."""
    groups: dict[str, list] = {}
    for item in items:
        # the name pytest-xdist gives the group (its worker's pytest_collection_modifyitems, which runs after this)
        name = "_".join(sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                                for m in item.iter_markers("xdist_group")}))
        groups.setdefault(name, []).append(item)
    rank = {name: i for i, name in enumerate(LONG_GROUPS)}
    order = sorted(groups, key=lambda g: (rank.get(g, len(rank)), -len(groups[g])))
    return [item for g in order for item in groups[g]]


def loadgroup(config: pytest.Config) -> bool:
    """Whether this process schedules (``dist``) or runs (pytest-xdist sets a worker's ``dist`` to ``no`` and its
    ``loadgroup`` to True) a ``--dist loadgroup`` session."""
    return getattr(config.option, "dist", "no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def pytest_configure(config):
    """The controller keeps the group order of the collection (``by_group_length``): pytest-xdist would otherwise
    reorder the groups by test count (its ``--loadscope-reorder``, on by default)."""
    if loadgroup(config) and not hasattr(config, "workerinput"):
        config.option.loadscopereorder = False


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
    if not hasattr(config, "workerinput") or not loadgroup(config):
        return
    ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
    if ungrouped:
        raise pytest.UsageError(f"pytest-xdist's loadgroup ignored the xdist_group marks (pytest {pytest.__version__}; "
                                f"e.g. {ungrouped[0]}): install the versions setup.cfg pins (bash scripts/setup.sh)")
