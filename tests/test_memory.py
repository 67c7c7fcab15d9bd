"""impulsevit.memory: the malloc setting `impulsevit fit` applies, checked with glibc's own statistics (mallinfo2)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from impulsevit.memory import reuse_large_allocations

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# glibc's allocator statistics in a fresh interpreter (``libc.mallinfo2().hblkhd``: bytes served by mmap)
_MALLINFO = textwrap.dedent(
    """
    import ctypes, sys
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    """
)

_PROBE = _MALLINFO + textwrap.dedent(
    """
    from impulsevit.memory import reuse_large_allocations
    applied = reuse_large_allocations() if sys.argv[1] == "on" else False
    import torch
    before = libc.mallinfo2().hblkhd
    x = torch.empty(64, 3, 224, 224)  # 38.5 MiB: above glibc's largest default mmap threshold (32 MiB)
    print(applied, libc.mallinfo2().hblkhd - before)
    """
)


def _mmapped_bytes(mode: str) -> tuple[bool, int]:
    """(applied, bytes glibc served by mmap for one 38.5 MiB tensor) in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    applied, grown = out.stdout.split()
    return applied == "True", int(grown)


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc-specific (a no-op elsewhere)")
def test_large_blocks_come_from_the_reusable_heap_not_from_mmap():
    """With glibc's defaults a 38.5 MiB block is mmap'ed (and munmap'ed on free, so every step page-faults it in
    again); with the setting it comes from the heap, where a freed block is kept for the next step."""
    size = 64 * 3 * 224 * 224 * 4
    applied, heap = _mmapped_bytes("on")
    _, default = _mmapped_bytes("off")
    assert applied
    assert default >= size  # the default: served by mmap
    assert heap < size // 8  # the setting: no mmap for it


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc-specific (a no-op elsewhere)")
def test_user_choices_are_respected(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert reuse_large_allocations() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert reuse_large_allocations() is False


_CLI_PROBE = _MALLINFO + textwrap.dedent(
    """
    import torch
    from impulsevit import cli

    def mmapped():
        before = libc.mallinfo2().hblkhd
        x = torch.empty(64, 3, 224, 224)
        return libc.mallinfo2().hblkhd - before

    cli.main(["recipes"])
    after_recipes = mmapped()
    try:
        cli.main(["fit", "--help"])
    except SystemExit:
        pass
    print(after_recipes, mmapped())
    """
)


@pytest.mark.slow  # a fresh interpreter importing Lightning and the CLI: 10-40 s on 2 busy cores
@pytest.mark.skipif(not GLIBC, reason="the setting is glibc-specific (a no-op elsewhere)")
def test_only_the_trainer_subcommands_apply_it():
    """Through the real ``impulsevit`` entry point: ``recipes`` leaves glibc's defaults (a 38.5 MiB block is still
    mmap'ed), ``fit`` applies the setting before it parses its arguments (the block then comes from the heap)."""
    size = 64 * 3 * 224 * 224 * 4
    out = subprocess.run([sys.executable, "-c", _CLI_PROBE], capture_output=True, text=True, check=True)
    after_recipes, after_fit = (int(v) for v in out.stdout.split()[-2:])
    assert after_recipes >= size
    assert after_fit < size // 8


def test_fits_in_memory_compares_file_size_with_available_memory(tmp_path):
    import psutil

    from impulsevit.data.loading.ffcv_loader import fits_in_memory

    f = tmp_path / "x.beton"
    f.write_bytes(b"\0" * 4096)
    assert fits_in_memory(f, fraction=0.5)
    assert not fits_in_memory(f, fraction=1000 / psutil.virtual_memory().available)  # ~1000 bytes < the file
