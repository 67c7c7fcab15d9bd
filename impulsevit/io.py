"""Atomic, durable file writes with one-line errors — the only way impulsevit writes a file a reader may see half-made.

- :func:`atomic_write` / :func:`atomic_write_text` / :func:`atomic_write_json`: write ``<path>.tmp-<host>-<pid>`` in
  the same directory, fsync it, ``os.replace`` it over ``path``, fsync the directory. A reader (or a job resumed after
  SIGKILL) sees the old file or the new one, never a truncated one; on any error the temp file is removed.
- :func:`atomic_path`: the same for writers that need a *path* (FFCV's writer, matplotlib): a context manager that
  yields the temp path and commits it when the block ends without an error.
- :func:`temp_path` + :func:`commit` + :func:`remove`: the pieces, for collective writes (every rank of a job writes
  into one temp path, rank 0 commits it). :func:`commit` never deletes an output of another kind (a directory where
  a file goes is an error, not a removal) and replaces a directory only when its caller owns it (distributed
  checkpoints).
- :func:`disk_errors`: turns ENOSPC / EDQUOT / EROFS / EACCES / EPERM into :class:`WriteError`, one line naming the path
  (and the bytes needed and free, where known). :func:`require_free_space` fails before a write that cannot fit.

Names and outputs, the two checks every command runs before its work (one place each):

- :func:`child_path`: ``<parent>/<name>`` for a name the user gives (a run, a study, a method in a folder name): one
  path component that stays inside ``parent`` — no absolute name, ``..``, path separator, NUL or control character,
  empty name, or a link that leads out of ``parent``; else :class:`~impulsevit.errors.ConfigError` naming the option.
- :func:`claim_output`: an output path the user names (an export, a predictions CSV, a preview, a ``.beton``, a
  download folder) is free, or is replaced only with ``--overwrite``; a file where a folder goes (or the reverse) is
  refused, with or without it. Nothing else is ever replaced.

Temp names all match :data:`TEMP_RE`, so discovery code (checkpoints, ``.beton`` caches) can skip them.
Not supported: remote (fsspec URL) paths.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Literal

from impulsevit.errors import ConfigError

__all__ = [
    "TEMP_RE",
    "OutputKind",
    "WriteError",
    "atomic_path",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_child_name",
    "child_path",
    "claim_output",
    "commit",
    "disk_errors",
    "disk_oserror",
    "fsync_dir",
    "read_json",
    "remove",
    "require_free_space",
    "temp_path",
    "umask",
    "write_error",
]

TEMP_RE = re.compile(r"\.tmp-[^/]+$")
_DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted"}


class WriteError(OSError):
    """A write failed for a reason the user fixes (full disk, quota, read-only or forbidden location). ``str()`` is one
    line naming the path; ``errno`` is the original error number."""

    def __init__(self, message: str, code: int | None = None, path: str | os.PathLike | None = None) -> None:
        super().__init__(message)
        self.message, self.errno, self.filename = message, code, None if path is None else str(path)

    def __str__(self) -> str:
        return self.message


def _fmt_bytes(n: int) -> str:
    return f"{n} bytes ({n / 2**20:.1f} MiB)" if n >= 2**20 else f"{n} bytes"


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_size(value: str | int, what: str) -> int:
    """A size in bytes from ``value``: an integer (bytes) or a number with a decimal unit ``B``, ``KB``, ``MB``,
    ``GB`` or ``TB`` (case-insensitive; ``1.5MB`` is 1,500,000 — LitData's meaning of the same suffixes). Binary units
    (``MiB``) are not accepted: they would silently mean something else to LitData.

    Raises:
        ConfigError: one line naming ``what`` (the setting or flag) and the value, when it is not such a size or is
            not positive."""
    text = str(value).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?B)?", text, flags=re.I)
    size = int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").upper()]) if match else 0
    if size <= 0:
        raise ConfigError(f"{what} must be a positive size in bytes, or one like '64MB' (units B, KB, MB, GB, TB; "
                          f"decimal), got {value!r}")
    return size


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def write_error(exc: OSError, path: str | os.PathLike, needed: int | None = None) -> WriteError:
    """The :class:`WriteError` for a disk-level ``exc`` while writing ``path`` (``needed``: bytes the write needs)."""
    reason = _DISK_ERRNOS.get(exc.errno or 0, exc.strerror or str(exc))
    msg = f"cannot write {path}: {reason}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = _free_bytes(Path(path).parent)
        parts = ([f"needs ~{_fmt_bytes(needed)}"] if needed else []) + ([f"{_fmt_bytes(free)} free"]
                                                                       if free is not None else [])
        if parts:
            msg += f" ({', '.join(parts)})"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        msg += "; choose a writable location"
    return WriteError(msg, exc.errno, path)


@contextlib.contextmanager
def disk_errors(path: str | os.PathLike, needed: int | None = None) -> Iterator[None]:
    """Re-raise full-disk / read-only / permission ``OSError``s inside the block as :class:`WriteError` for ``path``
    — also when a writer wrapped one in its own error (``torch.save`` on a full disk raises a ``RuntimeError``
    "unexpected pos" with the ``OSError`` as its context)."""
    try:
        yield
    except WriteError:
        raise
    except Exception as exc:  # noqa: BLE001 - only disk errors are translated; everything else is re-raised as is
        cause = disk_oserror(exc)
        if cause is not None:
            raise write_error(cause, path, needed) from exc
        raise


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # Rust's io::Error text, e.g. safetensors' SafetensorError


def disk_oserror(exc: BaseException) -> OSError | None:
    """The full-disk / read-only / permission ``OSError`` that ``exc`` is or was raised from (cause or context); also
    one a Rust extension reported in its own exception's text (``safetensors``: ``Error while serializing: I/O error:
    No space left on device (os error 28)``), returned as that ``OSError``."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
            return e
        found = None if isinstance(e, OSError) else _RUST_OS_ERROR.search(str(e))
        if found is not None and int(found.group(1)) in _DISK_ERRNOS:
            code = int(found.group(1))
            return OSError(code, os.strerror(code))
        e = e.__cause__ or e.__context__
    return None


def require_free_space(path: str | os.PathLike, needed: int) -> None:
    """Raise :class:`WriteError` (ENOSPC) when the filesystem that will hold ``path`` has less than ``needed`` bytes
    free. Unknown free space (the call fails) passes."""
    free = _free_bytes(Path(path).parent)
    if free is not None and free < needed:
        raise WriteError(f"cannot write {path}: no space left on device (needs ~{_fmt_bytes(needed)}, "
                         f"{_fmt_bytes(free)} free)", errno.ENOSPC, path)


def temp_path(path: str | os.PathLike, tag: str | None = None) -> Path:
    """``<path>.tmp-<tag>`` next to ``path`` (``tag`` default ``<host>-<pid>``; give a rank-independent tag when
    several processes write one temp path together)."""
    path = Path(path)
    return path.with_name(f"{path.name}.tmp-{tag or f'{socket.gethostname()}-{os.getpid()}'}")


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory (makes a rename in it durable); filesystems that cannot open directories are skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove(path: str | os.PathLike) -> None:
    """Remove a file, a link or a directory tree; a missing path is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _discard(path: Path) -> None:
    """Best-effort removal of a temp file (the filesystem may refuse, e.g. when it turned read-only)."""
    with contextlib.suppress(OSError):
        remove(path)


def _fsync_tree(path: Path) -> None:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if path.is_dir():
        fsync_dir(path)


def umask() -> int:
    """The process's file-mode creation mask (``0o022`` typically), read from ``/proc/self/status`` where it is there
    (no change of the process state), else by setting and restoring it."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def _umask_modes(path: Path) -> None:
    """Give ``path`` (a file, or a folder and everything under it; links are left alone) the mode a plain ``open`` /
    ``mkdir`` would have given it: ``0o666`` (``0o777`` for a folder or a file with an execute bit) less the umask.
    Temp files that libraries create are ``0o600`` (``tempfile.mkstemp``, safetensors' ``save_file``) and folders
    ``0o700`` (``mkdtemp``): committed as they are, a shared folder's colleague could not read them."""
    mask = umask()
    for p in (path, *(path.rglob("*") if path.is_dir() and not path.is_symlink() else ())):
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        full = 0o777 if p.is_dir() or mode & 0o111 else 0o666
        if (mode & 0o7777) != (full & ~mask):
            os.chmod(p, full & ~mask)


def commit(tmp: str | os.PathLike, path: str | os.PathLike, replace_dir: bool = False, durable: bool = True) -> None:
    """Make the finished temp file or directory ``tmp`` durable and move it over ``path``. Disk errors become
    :class:`WriteError`; ``tmp`` is removed when the commit fails. ``durable=False`` skips the fsyncs (the file and
    the rename are then atomic for other processes, but a machine that loses power may leave an empty or short file):
    for caches whose reader checks what it finds (the chunk cache of a remote shard set checks each chunk's size).

    Outputs are never deleted: a ``path`` that is a directory while ``tmp`` is a file (or a file while ``tmp`` is a
    directory) raises :class:`WriteError` naming ``path``. A directory ``tmp`` replaces an existing directory ``path``
    only with ``replace_dir=True`` (for callers that created that directory themselves, e.g. a distributed checkpoint
    folder of the run): it is moved aside, the new one moved in, then the old one removed (``os.replace`` cannot
    replace a non-empty directory), so that replace is not atomic. A symlink ``path`` is replaced as a link (its target
    is kept). Every file and folder committed gets the umask's mode (``0o644`` / ``0o755`` under umask ``022``),
    whatever mode the writer gave the temp file (:func:`_umask_modes`).
    """
    tmp, path = Path(tmp), Path(path)
    try:
        existing = _kind(path)
        new = "directory" if tmp.is_dir() else "file"
        if existing is not None and existing != new:
            raise WriteError(f"cannot write {path}: it is an existing {existing}, the output is a {new}; give another "
                             f"path or move it away (it is left as it is)", errno.EEXIST, path)
        if existing == "directory" and not replace_dir:
            raise WriteError(f"cannot write {path}: it is an existing directory; give another path or move it away "
                             f"(it is left as it is)", errno.EISDIR, path)
        with disk_errors(path):
            _umask_modes(tmp)
            if durable:
                _fsync_tree(tmp)
            if existing == "directory":
                old = temp_path(path, "old")
                remove(old)
                os.replace(path, old)
                os.replace(tmp, path)
                remove(old)
            else:
                os.replace(tmp, path)
            if durable:
                fsync_dir(path.parent)
    except BaseException:
        _discard(tmp)
        raise


def _kind(path: Path) -> str | None:
    """``"directory"`` (a real one, not a link to one), ``"file"`` (anything else that exists, links included) or
    None (nothing there)."""
    if path.is_symlink():
        return "file"
    if path.is_dir():
        return "directory"
    return "file" if path.exists() else None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, needed: int | None = None, durable: bool = True) -> Iterator[Path]:
    """Yield a temp path next to ``path``; when the block ends without an error, :func:`commit` it over ``path``
    (``durable``: :func:`commit`'s).

    The parent directory is created. On any error (also KeyboardInterrupt) the temp file is removed; disk errors
    inside the block or the commit become :class:`WriteError` naming ``path`` (with ``needed`` bytes, when given).

    Raises:
        ValueError: ``path`` is a URL.
    """
    if "://" in str(path):
        raise ValueError(f"atomic writes support local paths only, got {str(path)!r}")
    path = Path(path)
    with disk_errors(path, needed):
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with disk_errors(path, needed):
            yield tmp
        commit(tmp, path, durable=durable)
    finally:
        _discard(tmp)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any], needed: int | None = None,
                 durable: bool = True) -> None:
    """Call ``write(fh)`` on a binary temp file next to ``path``, then commit it (see :func:`atomic_path`)."""
    with atomic_path(path, needed, durable) as tmp, open(tmp, "wb") as fh:
        write(fh)
        fh.flush()


def atomic_write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (``durable``: :func:`commit`'s)."""
    atomic_write(path, lambda fh: fh.write(data), needed=len(data), durable=durable)


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value in ``path`` (the reading side of :func:`atomic_write_json`)."""
    return json.loads(Path(path).read_text())


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    data = text.encode("utf-8")
    atomic_write(path, lambda fh: fh.write(data), needed=len(data))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> None:
    """Write ``obj`` as JSON (plus a final newline) to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


# ---------------------------------------------------------------------------------------------- names and outputs
def check_child_name(name: Any, what: str, rule: str | None = None) -> str:
    """``name`` when it is one usable path component, else :class:`ConfigError` (one line: ``what``, the value, why,
    and ``rule`` — what is allowed). Refused: not a string, empty or blank, NUL or other control characters, an
    absolute path, a path separator (``/``, ``\\``), ``.`` / ``..`` (or a name starting with ``..``), a leading ``-``
    (it would read as an option). The string check only; :func:`child_path` also follows links."""
    bad = None
    if not isinstance(name, str) or not name.strip():
        bad = "is empty"
    elif "\0" in name:
        bad = "contains a NUL character"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        bad = "contains control characters"
    elif os.path.isabs(name) or name.startswith(("/", "\\")):
        bad = "is an absolute path"
    elif ".." in re.split(r"[/\\]", name):
        bad = "climbs out of its folder with '..'"
    elif any(sep in name for sep in {"/", "\\", os.sep, os.altsep or "/"}):
        bad = "contains a path separator ('/' nests folders); use e.g. 'exp-a'"
    elif name in (".", "..") or name.startswith(".."):
        bad = "refers to a parent folder or the folder itself"
    elif name.startswith("-"):
        bad = "starts with '-'"
    if bad:
        raise ConfigError(f"{what} {name!r} {bad}: {rule or 'it must be a single folder name'}")
    return name


def child_path(parent: str | os.PathLike, name: Any, what: str, rule: str | None = None) -> Path:
    """``Path(parent) / name`` for a user-supplied ``name`` (the option it came from: ``what``, e.g. ``--name``):
    :func:`check_child_name`, and the path must stay inside ``parent`` after links are followed (a link named
    ``name`` that leads elsewhere is refused). The path is returned unresolved; nothing is created.

    Raises:
        ConfigError: one line naming ``what``, the value and ``rule`` (default: one folder name inside ``parent``).
    """
    rule = rule or f"it must be a single folder name inside {parent}"
    check_child_name(name, what, rule)
    path = Path(parent) / name
    try:
        inside = path.resolve().parent == Path(parent).resolve()
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if not inside:
        raise ConfigError(f"{what} {name!r} leads outside {parent} (a link to {os.path.realpath(path)}): {rule}")
    return path


OutputKind = Literal["file", "folder", "into"]


def claim_output(path: str | os.PathLike, overwrite: bool, kind: OutputKind, what: str = "output",
                 replaceable: Callable[[Path], bool] | None = None, ours: str = "output") -> bool:
    """The one policy for an output path a command is about to write, checked before any work. Returns whether
    ``path`` exists (and may be replaced, or written into).

    ``kind``: ``"file"`` (one file, replaced atomically), ``"folder"`` (a whole folder, replaced atomically) or
    ``"into"`` (a folder the command writes its own files into; each of them is claimed as a ``"file"``).

    - Every existing folder above ``path`` must be a folder, not a file.
    - Nothing there: free. A file where a folder goes, or a folder where a file goes: refused, even with
      ``overwrite`` (nothing is deleted for an output of another kind).
    - ``"into"``: an existing folder is used as it is.
    - ``"file"``: an existing file (or link) is replaced only with ``overwrite``.
    - ``"folder"``: an empty folder is free; a non-empty one is replaced only with ``overwrite`` and only when
      ``replaceable(path)`` says this program wrote it (an earlier impulsevit ``ours``, e.g. ``"export"``); any other
      non-empty folder is refused, with or without ``overwrite``.

    Not supported: URLs (fsspec paths), checked by the writers themselves.

    Raises:
        ConfigError: one line naming ``what``, the path and the ``--overwrite`` flag where it would help.
    """
    path = Path(path)
    for p in reversed(path.parents):
        if (p.exists() or p.is_symlink()) and not p.is_dir():
            raise ConfigError(f"{what} {path}: {p} is {'a broken link' if not p.exists() else 'a file'}, not a "
                              f"folder; give another path (it is left as it is)")
    existing = _kind(path)
    if existing is None:
        return False
    if kind != "file" and path.is_symlink() and path.is_dir():
        existing = "directory"  # a link to a folder is written into as that folder
    if existing != ("file" if kind == "file" else "directory"):
        shown = "a folder (an existing directory)" if existing == "directory" else (
            "a broken link" if not path.exists() else "an existing file")
        raise ConfigError(f"{what} {path} is {shown}, where a {'file' if kind == 'file' else 'folder'} goes; give "
                          f"another path (it is left as it is)")
    if kind == "into":
        return True
    if kind == "file":
        if not overwrite:
            raise ConfigError(f"{what} {path} already exists; pass --overwrite to replace it (nothing was written)")
        return True
    if not any(path.iterdir()):
        return True
    if replaceable is not None and replaceable(path):
        if not overwrite:
            raise ConfigError(f"{what} {path} holds an earlier impulsevit {ours}; pass --overwrite to replace it, or "
                              f"give a new folder (nothing was written)")
        return True
    raise ConfigError(f"{what} {path} exists and is not empty, and impulsevit did not write it; give a new or empty "
                      f"folder (nothing was written; it is never replaced, not even with --overwrite)")
