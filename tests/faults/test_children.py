"""No child outlives its command (:mod:`impulsevit.procs`): FFCV's writer processes under ``convert``, the
``DataLoader`` workers and the DDP ranks of ``fit``, and ``study``'s fit runs — after ``kill -9``, SIGTERM and SIGINT
of the command. Also what each command leaves: ``convert`` no temp file and no lock (the next conversion succeeds),
``study`` the running fit checkpointed and marked ``interrupted`` with nothing new started, a second Ctrl-C on ``fit``
exit 130 and one line.

Every command runs as a real ``python -m impulsevit.cli`` child in its own session (:mod:`tests.faults.harness`), so
whatever it started is found in that session after it died."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from tests.faults.harness import REPO, TINY, assert_no_survivors, finish, run, session_members, start, wait_for

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux-only"),
              pytest.mark.slow]

# the convert test's slow writer: a plugin module (imported by the command before the subcommand, so the forked
# writer processes inherit it) that makes each written image take 50 ms; each writer marks itself (MARKER.<pid>)
SLOW_WRITER = """\
import os, time
from pathlib import Path
from impulsevit.data.storage import convert

_get = convert._WriterDataset.__getitem__

def _slow(self, i):
    Path(os.environ["SLOW_WRITER_MARKER"] + f".{os.getpid()}").touch()
    time.sleep(0.05)
    return _get(self, i)

convert._WriterDataset.__getitem__ = _slow
"""


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(tmp), str(REPO), str(REPO / "tests")]), **extra}


def _slow_steps(marker: Path, seconds: float = 0.5, after: int = 1) -> str:
    return ('--trainer.callbacks=[{"class_path": "_cli_helpers.SlowSteps", "init_args": {"seconds": '
            f'{seconds}, "marker": "{marker}", "after": {after}}}}}]')


def _image_tree(root: Path, n: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / "train" / c).mkdir(parents=True)
        for j in range(n // 2):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "train" / c / f"{j}.png")


def _children(sid: int) -> list[int]:
    return [pid for pid, _ in session_members(sid) if pid != sid]


def _lock_is_free(lock: Path) -> bool:
    fl = FileLock(lock, timeout=0)
    try:
        fl.acquire()
    except Exception:  # noqa: BLE001 - filelock.Timeout: still held
        return False
    fl.release()
    return True


@pytest.fixture
def slow_convert(tmp_path: Path):  # noqa: ANN201
    """``start`` of an ``impulsevit convert`` of 200 images with 2 writer processes, slowed by :data:`SLOW_WRITER`,
    and a function waiting until the writers are writing; yields ``(start_it, out)``."""
    (tmp_path / "slow_writer.py").write_text(SLOW_WRITER)
    _image_tree(tmp_path / "src", 200)
    out = tmp_path / "cache" / "train.beton"
    marker = tmp_path / "writing"

    def start_it():  # noqa: ANN202
        proc = start("convert", tmp_path / "src", out, "--split", "train", "--workers", "2", "--no-progress",
                     cwd=tmp_path, extra_env=_env(tmp_path, IMPULSEVIT_PLUGINS="slow_writer",
                                                  SLOW_WRITER_MARKER=str(marker)))
        wait_for(lambda: any(tmp_path.glob("writing.*")) or proc.poll() is not None, what="FFCV's writers to start")
        assert proc.poll() is None, proc.communicate()
        assert len(_children(proc.pid)) >= 2, "no writer processes found"
        return proc

    return start_it, out


def _convert_again_succeeds(tmp_path: Path, out: Path) -> None:
    res = run("convert", tmp_path / "src", out, "--split", "train", "--workers", "2", "--no-progress", cwd=tmp_path,
              extra_env=_env(tmp_path))
    assert res.rc == 0, res.err[-3000:]
    assert out.exists() and not list(out.parent.glob("*.tmp-*")) and not list(out.parent.glob("*.lock"))


def test_convert_kill9_mid_write_leaves_no_writer_and_no_lock(slow_convert, tmp_path: Path) -> None:
    start_it, out = slow_convert
    proc = start_it()
    # the writers that are writing are stopped first: they cannot finish their chunk and leave by themselves (with a
    # real dataset they would write for minutes), only the parent-death signal ends them
    for mark in tmp_path.glob("writing.*"):
        os.kill(int(mark.suffix[1:]), signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_no_survivors(proc.pid)  # FFCV's writers died with it: nothing holds the temp file or the lock
    assert _lock_is_free(out.with_name(out.name + ".lock"))
    _convert_again_succeeds(tmp_path, out)  # the temp file the killed one left does not block it (and is removed)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_convert_signal_mid_write_stops_writers_and_cleans_up(slow_convert, tmp_path: Path, sig: int) -> None:
    start_it, out = slow_convert
    proc = start_it()
    os.kill(proc.pid, sig)
    res = finish(proc)
    assert res.rc == 128 + sig, res.err[-3000:]
    assert "Traceback" not in res.err, res.err[-3000:]
    assert res.err_lines[-1].startswith(f"impulsevit convert: stopped by {signal.Signals(sig).name}"), res.err_lines
    assert_no_survivors(res.sid)
    assert not out.exists()
    assert not list(out.parent.glob("*.tmp-*")), "the temp file was left behind"
    assert not list(out.parent.glob("*.lock")), "the lock file was left behind"
    _convert_again_succeeds(tmp_path, out)


def test_fit_kill9_takes_its_dataloader_workers_along(tmp_path: Path) -> None:
    """The workers are stopped (SIGSTOP) before the main process is killed, so PyTorch's own parent watch (a poll in
    the worker loop) cannot be what ends them: only the parent-death signal does."""
    marker = tmp_path / "stepped"
    proc = start("fit", "--recipe", TINY, f"--runs_dir={tmp_path / 'runs'}", "--name=w", "--trainer.max_epochs=50",
                 "--data.init_args.num_workers=2", _slow_steps(marker), cwd=tmp_path, extra_env=_env(tmp_path))
    wait_for(lambda: marker.exists() or proc.poll() is not None, what="the first training steps")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    workers = _children(proc.pid)
    assert len(workers) >= 2, session_members(proc.pid)
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_no_survivors(proc.pid)


@pytest.mark.slow
def test_fit_ddp_kill9_of_rank0_takes_rank1_along(tmp_path: Path) -> None:
    """Two gloo CPU ranks (Lightning re-runs ``python -m impulsevit.cli`` for rank 1): rank 1 is stopped, then rank 0
    killed; rank 1 must not be left waiting in a collective for its dead peer."""
    marker = tmp_path / "stepped"
    proc = start("fit", "--recipe", TINY, f"--runs_dir={tmp_path / 'runs'}", "--name=d", "--trainer.max_epochs=50",
                 "--trainer.devices=2", "--trainer.strategy=ddp", _slow_steps(marker), cwd=tmp_path,
                 extra_env=_env(tmp_path))
    wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=240, what="the first DDP training steps")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    ranks = [pid for pid, cmd in session_members(proc.pid) if pid != proc.pid and "impulsevit.cli" in cmd]
    assert len(ranks) == 1, session_members(proc.pid)
    os.kill(ranks[0], signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_no_survivors(proc.pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_study_signal_stops_after_the_running_fit(tmp_path: Path, sig: int) -> None:
    """The running fit checkpoints and is marked ``interrupted``; the next run never starts; exit 143 / 130 and one
    line; rerunning the study's entry resumes the interrupted run from its checkpoint (``--resume auto``)."""
    marker = tmp_path / "stepped"
    runs = tmp_path / "runs"
    proc = start("study", "--recipe", TINY, "--methods", "impulse,torch", "--seeds", "1", "--runs-dir", runs,
                 "--name", "s", _slow_steps(marker, seconds=0.3), cwd=tmp_path, extra_env=_env(tmp_path))
    wait_for(lambda: marker.exists() or proc.poll() is not None, what="the first run's training steps")
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, sig)
    res = finish(proc)
    name = signal.Signals(sig).name
    assert res.rc == 128 + sig, res.err[-3000:]
    assert "Traceback" not in res.err, res.err[-3000:]
    assert res.err_lines == [f"impulsevit study: stopped by {name}: run impulse-s0 checkpointed and marked "
                             f"interrupted; no further run started; rerun the same command to continue "
                             f"(exit {128 + sig})"], res.err
    assert "interrupted" not in res.out, res.out  # said once, in that line
    assert_no_survivors(res.sid)
    study_dir = runs / "s"
    status = json.loads((study_dir / "impulse-s0" / "status.json").read_text())
    assert (status["state"], status["signal"], status["returncode"]) == ("interrupted", name, 128 + sig)
    assert (study_dir / "impulse-s0" / "checkpoints" / "preempted.ckpt").exists()
    assert not (study_dir / "torch-s0").exists(), "the next run was started"
    if sig == signal.SIGTERM:  # the interrupted run continues from its checkpoint
        marker.unlink()
        again = run("study", "--recipe", TINY, "--seeds", "1", "--runs-dir", runs, "--name", "s", "--run-index", "0",
                    cwd=tmp_path, extra_env=_env(tmp_path))
        assert again.rc == 0, again.err[-3000:]
        assert json.loads((study_dir / "impulse-s0" / "status.json").read_text())["state"] == "done"
        assert "resumed from" in (study_dir / "impulse-s0" / "study_fit.log").read_text()


def test_study_kill9_takes_the_running_fit_along(tmp_path: Path) -> None:
    marker = tmp_path / "stepped"
    proc = start("study", "--recipe", TINY, "--methods", "impulse", "--seeds", "1", "--runs-dir", tmp_path / "runs",
                 "--name", "k", "--trainer.max_epochs=50", _slow_steps(marker, seconds=0.3), cwd=tmp_path,
                 extra_env=_env(tmp_path))
    wait_for(lambda: marker.exists() or proc.poll() is not None, what="the fit's training steps")
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_no_survivors(proc.pid)  # the fit got SIGTERM: it checkpoints at its next step and exits


def test_fit_second_ctrl_c_exits_130_with_one_line(tmp_path: Path) -> None:
    """The first SIGINT asks for a checkpoint at the step boundary, which comes after a 20 s sleep; the second, sent
    meanwhile, stops at once: exit 130, no traceback, one line saying so, and no checkpoint of that step."""
    marker = tmp_path / "sleeping"
    sleep = ('--trainer.callbacks=[{"class_path": "_cli_helpers.MarkThenSleep", "init_args": {"seconds": 20, '
             f'"marker": "{marker}"}}}}]')
    proc = start("fit", "--recipe", TINY, f"--runs_dir={tmp_path / 'runs'}", "--name=c", "--trainer.max_epochs=50",
                 sleep, cwd=tmp_path, extra_env=_env(tmp_path))
    wait_for(lambda: marker.exists() or proc.poll() is not None, what="the first training steps")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.5)  # two signals at once would be one (the kernel does not queue them)
    os.kill(proc.pid, signal.SIGINT)
    res = finish(proc)
    assert res.rc == 130, res.err[-3000:]
    assert "Traceback" not in res.err and "KeyboardInterrupt" not in res.err, res.err[-3000:]
    lines = [ln for ln in res.err_lines if "second Ctrl-C" in ln]
    assert len(lines) == 1 and "exit 130" in lines[0], res.err[-3000:]
    assert not (tmp_path / "runs" / "c" / "checkpoints" / "preempted.ckpt").exists()
    assert_no_survivors(res.sid)


# ------------------------------------------------------------------------------------- impulsevit.procs, directly
_OWNER = """\
import signal, sys, time
from impulsevit.procs import popen
child = popen([sys.executable, "-c", "import time; time.sleep(600)"], death_signal=signal.SIGKILL)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_popen_child_dies_with_its_killed_parent(tmp_path: Path) -> None:
    import subprocess

    from tests.faults.harness import env

    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True,
                             env=env(**_env(tmp_path)), start_new_session=True)
    child = int(owner.stdout.readline())
    assert child in _children(owner.pid)
    os.kill(child, signal.SIGSTOP)  # it cannot notice anything itself: only the kernel's signal ends it
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert_no_survivors(owner.pid)


def test_die_with_parent_when_the_parent_is_already_gone_dies_now(tmp_path: Path) -> None:
    """The race: the parent died between the fork and the ``prctl`` call (the expected pid is not the parent)."""
    import subprocess

    code = "import os; from impulsevit.procs import die_with_parent; die_with_parent(os.getppid() + 1); print('alive')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(tmp_path))
    assert res.returncode == -signal.SIGKILL and "alive" not in res.stdout, res


def test_adopt_arms_only_for_its_direct_impulsevit_parent(tmp_path: Path) -> None:
    import socket
    import subprocess

    from tests.faults.harness import env

    code = ("import os; from impulsevit.procs import OWNER_ENV, adopt, parent_death_signal; adopt(); "
            "print(parent_death_signal(), os.environ[OWNER_ENV] == f'{os.getpid()}@' + __import__('socket')"
            ".gethostname())")
    host = socket.gethostname()

    def adopted(owner: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env(**_env(tmp_path), IMPULSEVIT_OWNER=owner))

    assert adopted(f"{os.getpid()}@{host}").stdout.split() == [str(int(signal.SIGKILL)), "True"]  # its parent
    assert adopted(f"1@{host}").stdout.split() == ["0", "True"]  # alive but not its parent (an intermediary)
    assert adopted(f"{os.getpid()}@other-host").stdout.split() == ["0", "True"]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # a batch job that inherited a dead owner through sbatch's environment: its parent is not init, left alone
    assert adopted(f"{dead.pid}@{host}").stdout.split() == ["0", "True"]
