"""One owner for child processes: every worker, writer and sub-run an ``impulsevit`` command starts dies with it — on
SIGTERM, SIGINT and ``kill -9`` of the command alike.

The mechanism is the kernel's parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG, sig)``): a child asks to receive
``sig`` when its parent exits, however it exits (a ``SIGKILL`` runs no handler in the parent, so nothing in the
parent could clean up). Each kind of child is armed at one place:

- forked workers (FFCV's writer processes and ``convert``'s scan pool, the ``DataLoader`` workers of the torchvision
  and synthetic backends): :func:`die_with_parent` first thing in the child (the writer job, the pool initializer, the
  ``worker_init_fn``), with the parent's pid taken before the fork;
- subprocesses started here (``study``'s ``impulsevit fit`` runs): :func:`popen` arms the child between fork and exec
  (``preexec_fn``), so the signal survives into the new program;
- ``impulsevit`` processes started by library code this project does not call directly (Lightning's DDP launcher
  re-runs ``python -m impulsevit.cli`` for ranks > 0 with a copy of ``os.environ``): :func:`adopt`, at the start of
  the command, arms itself when the environment names its direct parent as the ``impulsevit`` process that started
  it (:data:`OWNER_ENV`, set by :func:`adopt` for the process's own children).

The race: the parent may die between the fork and the ``prctl`` call, and then the signal never comes. So right after
arming, the child checks that its parent is still the expected pid; if not, it sends itself the signal at once.

``forward_signals`` is the other half: while a command waits for a child that owns a stop protocol of its own (a fit
checkpoints on SIGTERM / SIGINT), the command passes those signals on to it and records which arrived, so it can wait
for the child, record the outcome and stop itself.

Which signal: ``SIGKILL`` for workers, writers and DDP ranks (they hold no state worth saving, and a rank left alone
would wait in a collective for its dead peer until the process group's timeout); ``SIGTERM`` for a study's fit
(it checkpoints at its next step boundary and exits 143).

Not supported: anything but Linux — there :func:`die_with_parent` is a no-op returning False (macOS and Windows have
no parent-death signal; children then end when their own parent-watch notices, e.g. PyTorch's ``DataLoader`` workers,
or not at all). The parent-death signal fires when the parent *thread* that forked the child exits: children are
started from the main thread here. ``adopt`` does nothing when the child was started through an intermediary (a shell,
``srun``): its direct parent is then not the owner named in the environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["OWNER_ENV", "Stopped", "adopt", "alive", "die_with_parent", "forward_signals", "parent_death_signal",
           "popen", "raise_if_stopped", "stop_on_signals"]

OWNER_ENV = "IMPULSEVIT_OWNER"
"""``<pid>@<host>`` of the ``impulsevit`` process whose children should die with it (see :func:`adopt`)."""

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2


@functools.lru_cache(maxsize=1)
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def parent_death_signal() -> int:
    """The parent-death signal this process is armed with (0: none, or not Linux)."""
    prctl = _prctl()
    if prctl is None:
        return 0
    value = ctypes.c_int(0)
    if prctl(_PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0) != 0:
        return 0
    return value.value


def die_with_parent(parent: int | None, sig: int = signal.SIGKILL) -> bool:
    """In a child: have the kernel send ``sig`` to this process when its parent exits. ``parent``: the pid the parent
    had before the fork (``os.getpid()`` there); if this process's parent is no longer that pid (it died before the
    call: the race), ``sig`` is sent to this process now. Async-signal-safe enough for a ``preexec_fn`` (no imports,
    no allocation beyond ctypes' call). Returns False where there is no parent-death signal (not Linux)."""
    prctl = _prctl()
    if prctl is None:
        return False
    if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), int(sig))
    return True


def _armed(parent: int, sig: int, new_group: bool) -> None:  # a preexec_fn: between fork and exec in the child
    if new_group:
        os.setpgid(0, 0)
    die_with_parent(parent, sig)


def popen(cmd: Sequence[str], *, death_signal: int = signal.SIGTERM, new_group: bool = False,
          **kwargs: Any) -> subprocess.Popen:
    """:class:`subprocess.Popen` whose child gets ``death_signal`` when this process exits (armed before the exec, so
    the new program inherits it); ``new_group``: the child leads a process group of its own (same session), so a
    terminal's Ctrl-C does not reach it directly. Other arguments as for ``Popen`` (not ``preexec_fn``)."""
    kwargs.setdefault("close_fds", True)
    armed = functools.partial(_armed, os.getpid(), int(death_signal), new_group)
    return subprocess.Popen(list(cmd), preexec_fn=armed, **kwargs)


def _owner_tag(pid: int) -> str:
    return f"{pid}@{socket.gethostname()}"


def adopt(sig: int = signal.SIGKILL) -> None:
    """At the start of an ``impulsevit`` command: when :data:`OWNER_ENV` names this process's direct parent (an
    ``impulsevit`` process on this host started it, e.g. Lightning's DDP launcher in rank 0), die with it (``sig``,
    unless already armed, e.g. by :func:`popen`); when it names a process of this host that is gone and this process
    was handed to init (parent pid 1), the owner died before this process could arm: exit now. Any other case (a
    shell or ``srun`` in between, a batch job that inherited the variable through ``sbatch``'s environment) is left
    alone. Then name this process as the owner of the ones it starts."""
    tag = os.environ.pop(OWNER_ENV, "")
    pid, _, host = tag.partition("@")
    if pid.isdigit() and host == socket.gethostname() and _prctl() is not None:
        owner = int(pid)
        if os.getppid() == owner:
            if parent_death_signal() == 0:
                die_with_parent(owner, sig)
        elif os.getppid() == 1 and not alive(owner):
            os._exit(128 + int(sig))  # our owner is already gone: nothing would stop us otherwise
    os.environ[OWNER_ENV] = _owner_tag(os.getpid())


def alive(pid: int) -> bool:
    """True while a process ``pid`` exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def forward_signals(target: Callable[[], subprocess.Popen | None],
                    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
                    received: list[int] | None = None) -> Iterator[list[int]]:
    """While inside (main thread only), each of ``signals`` sent to this process is appended to the yielded list
    (``received`` when given) and passed on to the child ``target()`` returns, if it is still running; no exception
    is raised here, so the caller waits for the child and then decides (``if received: stop``). The previous
    handlers come back on exit."""
    got = [] if received is None else received

    def forward(signum: int, frame: Any) -> None:
        got.append(signum)
        proc = target()
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in signals}
    try:
        yield got
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


class Stopped(SystemExit):
    """Raised in the main thread by :func:`stop_on_signals` when SIGTERM or SIGINT arrives; its exit code is 128 +
    the signal number (143, 130). A ``SystemExit``, so ``except Exception`` blocks on the way let it pass while
    ``finally`` blocks (and context managers) run: temp files are removed, child processes stopped, locks released."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


_STOPS_REQUESTED: list[int] = []  # signals stop_on_signals received (main thread), for raise_if_stopped


def _quiet_after_stop(unraisable: Any) -> None:
    """``sys.unraisablehook`` once a stop signal was raised: the :class:`Stopped` can land inside a constructor (a
    library's progress bar, say), leaving a half-built object whose ``__del__`` then fails when it is collected —
    Python would print that as ``Exception ignored in … Traceback`` after the run's one-line stop message. The process
    is on its way out, so such destructor failures are dropped (for the rest of the process)."""


@contextlib.contextmanager
def stop_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Inside (main thread only), the first of ``signals`` raises :class:`Stopped` where the main thread is; later
    ones are ignored while the unwinding cleans up. A handler's exception can be swallowed where Python cannot
    propagate it (it ran inside an ``os.register_at_fork`` hook during a ``fork``, or in a ``__del__``): so
    long-running loops call :func:`raise_if_stopped` at their polls, and leaving the block after a swallowed stop
    raises it then. The previous handlers come back on exit."""

    def stop(signum: int, frame: Any) -> None:
        if _STOPS_REQUESTED:
            return
        _STOPS_REQUESTED.append(signum)
        sys.unraisablehook = _quiet_after_stop
        raise Stopped(signum)

    _STOPS_REQUESTED.clear()
    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        yield
        raise_if_stopped()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        _STOPS_REQUESTED.clear()


def raise_if_stopped() -> None:
    """Raise :class:`Stopped` when :func:`stop_on_signals` received its signal (a poll for loops: see there)."""
    if _STOPS_REQUESTED:
        raise Stopped(_STOPS_REQUESTED[0])
