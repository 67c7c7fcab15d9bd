"""Process memory settings for training: keep large freed blocks instead of page-faulting them in again every step.

glibc's ``malloc`` serves every block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and returns it
with ``munmap`` on free. A training step on CPU allocates such blocks every time — a normalised 64×3×224×224 float
batch is 38.5 MiB — so each step first-touches ~10k new pages, which costs more than the arithmetic that fills them
(``benchmarks/loader_speed.py`` runs with and, given ``--default-malloc``, without this setting). PyTorch's CPU tuning
guides suggest jemalloc / tcmalloc for the same reason; this is the no-install equivalent.

Only glibc on Linux; a no-op elsewhere, and when the user already chose (``MALLOC_MMAP_THRESHOLD_`` /
``MALLOC_TRIM_THRESHOLD_`` set, or jemalloc / tcmalloc / mimalloc preloaded). The cost is resident memory: up to
``keep_bytes`` of freed heap stays with the process (worker processes forked afterwards inherit the setting).
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["reuse_large_allocations"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_PRELOADED_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def reuse_large_allocations(keep_bytes: int = 1 << 30) -> bool:
    """Serve blocks below ``keep_bytes`` from the heap and keep up to ``keep_bytes`` of freed heap (glibc ``mallopt``
    ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``). Returns True when the setting was applied, False when it was left
    alone (not glibc, the user configured malloc, another allocator is preloaded, or ``mallopt`` refused)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    if any(name in os.environ.get("LD_PRELOAD", "") for name in _PRELOADED_ALLOCATORS):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    keep = int(min(keep_bytes, 2**31 - 1))  # mallopt takes an int
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, keep)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, keep))
