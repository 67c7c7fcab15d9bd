"""A lock file that serialises work on one output across processes and nodes (``fcntl`` POSIX record locks, which
NFS carries between clients through its lock manager).

``with file_lock(path):`` blocks until no other process holds ``path``; the holder writes ``host pid`` into the file
so a waiter can say whom it waits for. The lock is released when the block ends or the process dies (the kernel /
lock manager drops it), so a killed converter never leaves a stale lock; a normal exit also deletes the file (a killed
process leaves an unlocked one, which the next caller simply takes).
Not supported: file systems without POSIX locks (some FUSE mounts): there the lock call fails with the path named.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["file_lock"]


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, what: str = "", log: Callable[[str], None] = print) -> Iterator[float]:
    """Hold the exclusive lock on ``path`` inside the block; yields the seconds spent waiting. ``what`` names the
    protected work in the message printed when another process holds the lock.

    The holder deletes ``path`` before releasing it, so no lock files are left behind; a waiter that then acquires
    the deleted file notices (its inode is no longer the one at ``path``) and locks the current file instead."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    announced = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except (BlockingIOError, PermissionError):
                if not announced:
                    holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
                    log(f"[impulsevit] waiting for {what or path}: locked by {holder} ({path})")
                    announced = True
                fcntl.lockf(fd, fcntl.LOCK_EX)
        except OSError as exc:
            os.close(fd)
            if isinstance(exc, (BlockingIOError, PermissionError)):
                raise
            raise OSError(exc.errno, f"cannot lock {path} ({exc.strerror}); the file system may not support "
                                     f"POSIX locks") from exc
        mine = os.fstat(fd)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
            break
        os.close(fd)  # the previous holder deleted this file while we waited: lock the current one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()} {os.getpid()}\n".encode(), 0)
        yield time.monotonic() - t0
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            fcntl.lockf(fd, fcntl.LOCK_UN)
        os.close(fd)
