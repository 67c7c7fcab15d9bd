"""Concurrent converters of one ``.beton`` (two nodes sharing a cache) are serialised by the lock file: two real
``impulsevit convert`` processes start while the lock is held; when it is released one converts and the other waits,
then finds the file up to date and reuses it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from _cli_helpers import subprocess_env
from _image_files import make_tree

from impulsevit.data.locking import file_lock
from impulsevit.data.storage.convert import read_manifest

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


@pytest.mark.slow
def test_two_converter_processes_of_one_file_convert_once(tmp_path):
    make_tree(tmp_path / "src", per_class=2, size=(24, 32))
    out = tmp_path / "cache" / "train.beton"
    cmd = [sys.executable, "-m", "impulsevit.data.storage.convert_cli", str(tmp_path / "src"), str(out),
           "--split", "train",
           "--workers", "1", "--no-progress"]
    env = {**subprocess_env(), "PYTHONUNBUFFERED": "1"}
    logs = [tmp_path / f"conv{i}.log" for i in range(2)]
    with file_lock(out.with_name(out.name + ".lock")):  # both converters must find it held
        procs = [subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env) for log in logs]
        t0 = time.monotonic()
        while not all("waiting for the conversion of" in log.read_text() for log in logs):
            assert time.monotonic() - t0 < 120, [log.read_text() for log in logs]
            assert all(p.poll() is None for p in procs), [log.read_text() for log in logs]
            time.sleep(0.2)
        assert not out.exists()
    assert [p.wait(timeout=300) for p in procs] == [0, 0], [log.read_text() for log in logs]
    texts = [log.read_text() for log in logs]
    assert sum("writing 4 images" in t for t in texts) == 1, texts
    assert sum("up to date (4 images), skipped" in t for t in texts) == 1, texts
    assert read_manifest(out)["num_samples"] == 4
    assert not list(out.parent.glob("*.tmp-*"))


def test_a_killed_holder_leaves_no_stale_lock_and_waiters_name_the_holder(tmp_path):
    """A real process holds the lock: a waiter prints one line naming its host and pid; once the holder is SIGKILLed
    the lock is free at once (the kernel dropped it) and a normal release leaves no lock file."""
    import os
    import signal
    import socket
    import threading

    lock = tmp_path / "out.beton.lock"
    code = ("import sys, time; from impulsevit.data.locking import file_lock\n"
            f"with file_lock({str(lock)!r}):\n    print('held', flush=True); time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        lines: list[str] = []
        threading.Timer(1.0, os.kill, (holder.pid, signal.SIGKILL)).start()
        with file_lock(lock, what="the test", log=lines.append) as waited:
            assert lock.read_text().split() == [socket.gethostname(), str(os.getpid())]
        assert waited > 0 and len(lines) == 1
        assert lines[0] == f"[impulsevit] waiting for the test: locked by {socket.gethostname()} {holder.pid} ({lock})"
        assert not lock.exists()
    finally:
        holder.kill()
        holder.wait()
