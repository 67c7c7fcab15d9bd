"""The study's file writes, in one place: every ``study.json``, ``status.json``, ``report.md`` and ``report.png`` goes
through :func:`write_atomic` (a reader never sees a half-written file)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_atomic", "write_json", "read_json"]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8) through a temporary file in the same directory and
    ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON at ``path``, atomically."""
    write_atomic(path, json.dumps(obj, indent=2))


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
