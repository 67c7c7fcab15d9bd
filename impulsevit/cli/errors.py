"""Which exceptions are a user's to fix (printed as one line with an exit status) and which are bugs (tracebacks)."""

from __future__ import annotations

from impulsevit.errors import UserError


def one_line(e: BaseException) -> str:
    """An exception's message on one line: its non-empty lines, stripped and joined with ``; `` (jsonargparse nests
    the cause's lines under its own)."""
    text = str(e).strip() or type(e).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if len(lines) == 1 else "; ".join(lines)


def user_error(exc: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit status)`` when ``exc`` (or an exception it was raised from) is one a user fixes: an
    :class:`~impulsevit.errors.UserError`, a full / read-only / forbidden disk (:class:`~impulsevit.io.WriteError`, or
    an ``OSError`` with such an errno from elsewhere), a damaged ``.beton``, a conversion that found no usable images
    (:class:`~impulsevit.data.storage.convert.ConversionError`, after the bad inputs were listed). Else None: a bug,
    shown
    with its traceback."""
    from impulsevit.data.storage.convert import ConversionError
    from impulsevit.data.storage.integrity import BetonError
    from impulsevit.io import _DISK_ERRNOS, WriteError, write_error

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, UserError):
            return one_line(e), e.exit_status
        if isinstance(e, WriteError | BetonError | ConversionError):
            return one_line(e), 1
        if isinstance(e, OSError) and e.errno in _DISK_ERRNOS and e.filename:
            return str(write_error(e, e.filename)), 1
        e = e.__cause__ or e.__context__
    return None
