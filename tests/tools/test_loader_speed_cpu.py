"""``benchmarks/loader_speed.py``'s CPU accounting: a busy child process counts as the loader's CPU unless it is the
store's (then it is the store's), so the ``CPU ms/img`` and ``store ms/img`` columns split the machine's work as
they say."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _scripts import load_script

pytestmark = pytest.mark.slow  # starts processes (tests/README.md, Lanes)

REPO = Path(__file__).resolve().parents[2]
BUSY = ("import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\n"
        "print('done', flush=True)\ntime.sleep(30)")


@pytest.fixture(scope="module")
def loader_speed():
    return load_script("benchmarks/loader_speed.py")


def burn_in_child(then) -> float:  # noqa: ANN001 - a callable of the child's pid
    """Start a child that burns 1 CPU-second, wait for it, return ``then(pid)`` read before and after, and stop it."""
    child = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        before = then(child.pid)
        assert child.stdout.readline().strip() == "done"
        return then(child.pid) - before
    finally:
        child.kill()
        child.wait()


def test_a_busy_child_is_the_loaders_cpu_unless_it_is_the_store(loader_speed):
    assert burn_in_child(lambda pid: loader_speed.cpu_seconds()) > 0.8
    assert burn_in_child(lambda pid: loader_speed.cpu_seconds(frozenset({pid}))) < 0.3
    assert burn_in_child(lambda pid: loader_speed.store_cpu_seconds(frozenset({pid}))) > 0.8


def test_a_thread_of_this_process_counts(loader_speed):
    def spin() -> None:
        end = time.thread_time() + 0.5
        while time.thread_time() < end:
            pass

    start = loader_speed.cpu_seconds()
    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    assert loader_speed.cpu_seconds() - start > 0.4


def test_the_cache_peak_is_the_largest_the_folder_got_while_watched(loader_speed, tmp_path):
    """A file that appears and goes inside the block counts; what the folder holds before and after is the floor."""
    folder = tmp_path / "cache"
    watch = loader_speed.FolderPeak(folder, every_s=0.005)
    with watch:  # the folder does not exist yet: 0
        folder.mkdir()
        (folder / "a").write_bytes(b"x" * 1000)
        (folder / "b").write_bytes(b"x" * 3000)
        time.sleep(0.1)
        (folder / "b").unlink()
        time.sleep(0.05)
    assert watch.peak == 4000
    (folder / "a").unlink()
    with watch:  # a second block keeps the larger peak
        pass
    assert watch.peak == 4000
    assert loader_speed.FolderPeak(folder).size() == 0
