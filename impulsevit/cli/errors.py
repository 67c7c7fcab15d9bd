"""Which exceptions are a user's to fix (printed as one line with an exit status) and which are bugs (tracebacks).

The one error boundary of the ``impulsevit`` process (:func:`impulsevit.cli.entry.main`) asks :func:`user_error` about
every exception a subcommand or a plugin module raises. Exit status policy:

- **2: the command cannot work as given** — found before any work starts, and the same command fails the same way
  until the command line, recipe or named inputs change: :class:`~impulsevit.errors.ConfigError` (bad or out-of-range
  values, unknown names, a plugin module that fails to import, an optional dependency the command needs that is not
  installed: one line naming the extra to install, :func:`~impulsevit.errors.missing_extra`),
  :class:`~impulsevit.errors.RunDirError`, Lightning's
  ``MisconfigurationException`` (e.g. ``--trainer.accelerator=gpu`` where no GPU is visible), weights that do not fit
  the model (``load_state_dict``'s report, reduced to the first tensors that differ), argument errors.
- **1: the work failed for a reason outside the command line** — the environment or the data: a full / read-only /
  forbidden disk, a file missing or unreadable at run time, damaged data (:class:`~impulsevit.errors.DataError`,
  a damaged ``.beton``, a conversion without usable images), a diverged run, a hub failure.
- 130 / 143 after SIGINT / SIGTERM (:func:`impulsevit.cli.entry.run_trainer_command`, and 130 for a Ctrl-C anywhere).
- Anything else is a bug: the traceback is kept (Python's exit status 1).
"""

from __future__ import annotations

import re

from impulsevit.errors import UserError, missing_extra, state_dict_mismatch

__all__ = ["one_line", "user_error"]

_WORKER_TRACEBACK = "Original Traceback (most recent call last):"


def one_line(e: BaseException) -> str:
    """An exception's message on one line: its non-empty lines, stripped and joined with ``; `` (jsonargparse nests
    the cause's lines under its own). An error re-raised from a DataLoader worker (torch puts the worker's traceback
    into the message) is its original last line, without the traceback."""
    text = str(e).strip() or type(e).__name__
    if _WORKER_TRACEBACK in text:
        last = [ln for ln in text.split(_WORKER_TRACEBACK, 1)[1].splitlines() if ln.strip()][-1].strip()
        text = last.split(": ", 1)[1] if re.match(r"^[\w.]+: ", last) else last
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if len(lines) == 1 else "; ".join(lines)


def _os_error(e: OSError) -> str:
    """``PATH: reason`` of a missing / unreadable / wrong-kind path (``strerror`` in lower case)."""
    reason = (e.strerror or type(e).__name__).lower()
    target = f" -> {e.filename2}" if e.filename2 else ""
    return f"{e.filename}{target}: {reason}"


def user_error(exc: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit status)`` when ``exc`` (or an exception it was raised from) is one a user fixes (the
    policy in the module docstring): an :class:`~impulsevit.errors.UserError`, a full / read-only / forbidden disk
    (:class:`~impulsevit.io.WriteError`, or an ``OSError`` with such an errno from elsewhere), a damaged ``.beton``, a
    conversion that found no usable images (:class:`~impulsevit.data.storage.convert.ConversionError`, after the bad
    inputs were listed), a missing or unreadable file or a path of the wrong kind (``FileNotFoundError``,
    ``IsADirectoryError``, ``NotADirectoryError``, ``PermissionError`` that name their file; only the exception itself
    and the ones it was explicitly raised ``from``, not any it happened to be raised while handling), Lightning's
    ``MisconfigurationException``, a ``load_state_dict`` mismatch, a ``ModuleNotFoundError`` of an optional
    dependency (:data:`~impulsevit.errors.OPTIONAL_EXTRAS`: the extra to install). Else None: a bug, shown with its
    traceback."""
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from impulsevit.data.storage.convert import ConversionError
    from impulsevit.data.storage.integrity import BetonError
    from impulsevit.io import _DISK_ERRNOS, WriteError, write_error

    seen: set[int] = set()
    e: BaseException | None = exc
    explicit = True  # e is exc or was raised `from` (its __cause__) the one before
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, UserError):
            return one_line(e), e.exit_status
        if isinstance(e, ModuleNotFoundError) and (extra := missing_extra(e.name)) is not None:
            return extra, 2  # wherever the import happened (a subcommand, a plugin, a loader thread): the cause
        if isinstance(e, WriteError | BetonError | ConversionError):
            return one_line(e), 1
        if isinstance(e, OSError) and e.errno in _DISK_ERRNOS and e.filename:
            if isinstance(e, PermissionError) and explicit and not _is_write(e):
                return f"cannot read {_os_error(e)}", 1
            return str(write_error(e, e.filename)), 1
        if explicit:
            if isinstance(e, FileNotFoundError | IsADirectoryError | NotADirectoryError) and e.filename:
                return _os_error(e), 1
            if isinstance(e, MisconfigurationException):
                return one_line(e), 2
            mismatch = state_dict_mismatch(e)
            if mismatch is not None:
                return mismatch, 2
        explicit = e.__cause__ is not None
        e = e.__cause__ or e.__context__
    return None


def _is_write(e: OSError) -> bool:
    """Whether a permission error came from writing: not when the path exists and cannot be read (a read failed)."""
    import os

    path = str(e.filename)
    return not (os.path.exists(path) and not os.access(path, os.R_OK))
