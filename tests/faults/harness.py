"""The fault suite's harness: run the real ``impulsevit`` command as a child process in its own session, and check
what a careful user of a shared cluster expects after a fault — the exit status, one error line (no traceback), what
is left on disk, and that no process the command started outlives it.

Each function here is a check that can fail; the fault tests (``tests/faults/test_*.py``) combine them per subcommand
and fault class.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import zygote as _zygote

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "tiny_synthetic.yaml"


@dataclass
class Result:
    """A finished command: exit status, standard output and error, and its session id (= its pid)."""

    rc: int
    out: str
    err: str
    sid: int

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]


def env(**extra: str) -> dict[str, str]:
    """The environment a child command runs in: this one, one intra-op thread, no colour, no debug."""
    e = {k: v for k, v in os.environ.items() if k not in ("IMPULSEVIT_DEBUG",)}
    e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", NO_COLOR="1")
    e.update(extra)
    return e


def start(*args: str, cwd: str | os.PathLike, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``python -m impulsevit.cli ARGS`` in ``cwd``, in a new session (so its descendants can be found even
    after it dies); stdout and stderr are pipes (text)."""
    cmd = [sys.executable, "-m", "impulsevit.cli", *map(str, args)]
    return subprocess.Popen(cmd, cwd=cwd, env=env(**(extra_env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, stdin=subprocess.DEVNULL)


def run(*args: str, cwd: str | os.PathLike, timeout: float = 300, extra_env: dict[str, str] | None = None) -> Result:
    """Run the command to its end (killing its whole session on timeout) and return its :class:`Result`.

    The command is forked from this worker's warm interpreter (:mod:`tests.faults.zygote`: the same ``impulsevit``
    main in a new process and session, without the seconds of importing torch each time); without one (it could not
    start, or ``IMPULSEVIT_TEST_FORK=0``), a fresh ``python -m impulsevit.cli`` as :func:`start` runs it."""
    zygote = _zygote.get(env())
    if zygote is not None:
        with tempfile.TemporaryDirectory(prefix="impulsevit-fault-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            rc, pid = zygote.run([str(a) for a in args], str(cwd), env(**(extra_env or {})), out, err, timeout)
            if rc is None:
                kill_session(pid)
                zygote.wait_after_kill()
                pytest.fail(f"impulsevit {' '.join(map(str, args))} did not finish in {timeout} s\n"
                            f"{err.read_text(errors='replace')[-3000:]}")
            return Result(rc, out.read_text(errors="replace"), err.read_text(errors="replace"), pid)
    proc = start(*args, cwd=cwd, extra_env=extra_env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"impulsevit {' '.join(map(str, args))} did not finish in {timeout} s\n{err[-3000:]}")
    return Result(proc.returncode, out, err, proc.pid)


def finish(proc: subprocess.Popen, timeout: float = 120) -> Result:
    """Wait for a started command and return its :class:`Result`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"command did not finish in {timeout} s after its signal\n{err[-3000:]}")
    return Result(proc.returncode, out, err, proc.pid)


def session_members(sid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of every live (not zombie) process whose session id is ``sid``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            state, session = fields[0], int(fields[3])
            if session == sid and state != "Z":
                cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append((int(d.name), cmdline))
        except (OSError, ValueError, IndexError):
            continue
    return found


def assert_no_survivors(sid: int, grace: float = 10.0) -> None:
    """Fails when a process of session ``sid`` (the command and everything it started) is still alive ``grace``
    seconds later; the survivors are killed either way so they do not disturb later tests."""
    deadline = time.monotonic() + grace
    while (alive := session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    kill_session(sid)
    assert not alive, f"processes outlived their command: {alive}"


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``."""
    for pid, _ in session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def assert_one_line_error(res: Result, rc: int, *needles: str) -> str:
    """The command failed with exit status ``rc``, printed no traceback, and its last stderr line is the error, which
    contains every one of ``needles``. Returns that line."""
    assert "Traceback (most recent call last)" not in res.err, res.err[-4000:]
    assert res.rc == rc, f"exit {res.rc}, expected {rc}\n{res.err[-3000:]}"
    assert res.err_lines, "no error line on stderr"
    line = res.err_lines[-1]
    assert "error" in line.lower(), line
    for n in needles:
        assert n in line, f"{n!r} not in the error line {line!r}"
    return line


def snapshot(root: str | os.PathLike) -> dict[str, str]:
    """Every file and folder under ``root`` (relative path -> content hash, or ``dir``), to check that a failed
    command changed nothing there."""
    root = Path(root)
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"link:{os.readlink(p)}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha1(p.read_bytes()).hexdigest()
    return out


def wait_for(pred: Callable[[], bool], timeout: float = 120, what: str = "condition") -> None:
    """Poll ``pred`` every 0.1 s until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``path`` (skips the test when mounting is not permitted)."""
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}); needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def evil_pickle(marker: Path) -> bytes:
    """A pickle that, when unpickled, creates the file ``marker`` (code execution); as a ``torch.save`` zip it is
    what a hostile checkpoint looks like. Tests assert ``marker`` does not exist afterwards."""
    import pickle

    class _Evil:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {marker}",))

    return pickle.dumps({"state_dict": {}, "payload": _Evil()}, protocol=2)


def write_evil_checkpoint(path: Path, marker: Path, base: dict | None = None) -> Path:
    """Write a ``torch.save`` zip at ``path`` whose pickle runs ``touch marker`` when loaded without
    ``weights_only`` (``base``: real checkpoint entries to carry along, so it otherwise looks valid)."""
    import torch

    class _Evil:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {marker}",))

    obj = dict(base or {})
    obj["payload"] = _Evil()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path
