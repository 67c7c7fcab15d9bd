"""A lock file that serialises work on one output across processes and nodes: :class:`filelock.FileLock`
(``flock``, which Linux NFS clients carry between nodes as POSIX locks through the lock manager), plus the messages.

``with file_lock(path):`` blocks until no other process holds ``path``; the holder writes ``host pid`` into the file
(filelock's ``on_acquired`` hook) so a waiter can say whom it waits for, in one line. The lock is released when the
block ends or the process dies (the kernel / lock manager drops it), so a killed converter never leaves a stale lock:
the unlocked file it leaves is simply taken by the next caller. A normal exit deletes the file (filelock keeps it;
it re-opens the path when the inode it locked was unlinked meanwhile), so no lock files are left behind.
Not supported: file systems without ``flock`` (some FUSE mounts): there the lock call fails naming the path
(filelock's soft-lock fallback is off: a lock without stale detection could block forever after a crash).

:func:`claim_folder` is the other use of ``flock``: every process that reads a shared folder (a chunk cache) holds a
shared lock on it for its lifetime, and the first finds out that no live process holds one, so what earlier processes
left there (reference counts, download markers) is stale.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["claim_folder", "file_lock"]

_CLAIMED: dict[str, int] = {}  # folder -> the descriptor holding this process's shared lock on it


def _write_holder(fd: int) -> None:
    """filelock's ``on_acquired`` hook: ``host pid`` into the locked file, for the waiters' message."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{socket.gethostname()} {os.getpid()}\n".encode(), 0)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, what: str = "", log: Callable[[str], None] = print) -> Iterator[float]:
    """Hold the exclusive lock on ``path`` inside the block; yields the seconds spent waiting. ``what`` names the
    protected work in the one line printed (through ``log``) when another process holds the lock."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, fallback_to_soft=False, on_acquired=_write_holder)
    t0 = time.monotonic()
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            try:
                holder = path.read_text(errors="replace").strip()
            except OSError:
                holder = ""
            log(f"[impulsevit] waiting for {what or path}: locked by {holder or 'another process'} ({path})")
            lock.acquire(timeout=-1)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot lock {path} ({exc.strerror}); the file system may not support "
                                 f"flock") from exc
    try:
        yield time.monotonic() - t0
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still held: a waiter that then locks the unlinked inode retries on the new path
        lock.release()


def claim_folder(folder: str | os.PathLike, clear_stale: Callable[[Path], object]) -> bool:
    """Register this process as a user of ``folder`` until it exits (a shared ``flock`` on ``<folder>/.users``, held
    by a descriptor kept open; children forked later share it). When no other live process holds the folder and this
    process has not claimed it before, whatever processes that have exited left in it is stale: ``clear_stale(folder)``
    runs first, under the exclusive lock (no process can claim the folder meanwhile), and the call returns True. The
    exclusive lock then turns shared. A process killed by any signal releases its claim (the kernel closes its
    descriptors), so a claim never outlives its process.

    Raises:
        OSError: the folder cannot be created or locked (a file system without ``flock``), naming the path."""
    import fcntl

    key = os.path.abspath(folder)
    if key in _CLAIMED:
        return False
    path = Path(key) / ".users"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open {path} ({exc.strerror})") from exc
    first = True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            first = False
        if first:
            clear_stale(Path(key))
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError as exc:
        os.close(fd)
        raise OSError(exc.errno, f"cannot lock {path} ({exc.strerror}); the file system may not support "
                                 f"flock") from exc
    except BaseException:
        os.close(fd)
        raise
    _CLAIMED[key] = fd
    return first
