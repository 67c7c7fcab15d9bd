"""The study's file writes, in one place: every ``study.json``, ``status.json``, ``report.md`` and ``report.png`` goes
through :func:`write_atomic` (a reader never sees a half-written file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from impulsevit.io import atomic_write

__all__ = ["write_atomic", "write_json", "read_json"]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8) atomically and durably (:func:`impulsevit.io.atomic_write`)."""
    blob = data.encode("utf-8") if isinstance(data, str) else data
    atomic_write(path, lambda fh: fh.write(blob), needed=len(blob))


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON at ``path``, atomically."""
    write_atomic(path, json.dumps(obj, indent=2))


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
