"""``impulsevit/io.py``'s commit gives every file it commits the umask's mode: a run, its checkpoints and an export
written through the real CLI are ``0o644`` under umask ``022`` and ``0o600`` under ``077`` (safetensors writes its
file ``0o600``, ``tempfile.mkdtemp`` a ``0o700`` folder)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from _cli_helpers import run_cli, tiny

from impulsevit.cli import main
from impulsevit.io import atomic_write_bytes, commit, umask

pytestmark = pytest.mark.slow  # trains (tests/README.md, Lanes)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]
            if not p.is_symlink()}


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_run_checkpoint_and_export_files_get_the_umask_mode(tmp_path, mask):
    old = os.umask(mask)
    try:
        assert umask() == mask
        run_cli(*tiny(tmp_path / "runs", "r", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                      "--trainer.limit_val_batches=1"))
        assert main(["export", str(tmp_path / "runs" / "r" / "checkpoints" / "last.ckpt"),
                     str(tmp_path / "export")]) == 0
        staged = Path(tempfile.mkdtemp(dir=tmp_path))  # 0o700, with a mkstemp file (0o600) in it
        fd, name = tempfile.mkstemp(dir=staged)
        os.close(fd)
        commit(staged, tmp_path / "committed")
        atomic_write_bytes(tmp_path / "plain.bin", b"x")
    finally:
        os.umask(old)
    files, folders = 0o666 & ~mask, 0o777 & ~mask
    for root in (tmp_path / "runs" / "r", tmp_path / "export", tmp_path / "committed"):
        modes = _modes(root)
        wrong = {k: oct(m) for k, m in modes.items()
                 if m != (folders if (root / k).is_dir() else files)}
        assert not wrong, f"{root}: not {oct(files)} / {oct(folders)}: {wrong}"
    assert {"model.safetensors", "config.json", "checkpoints/last.ckpt", "config.yaml", "run.json"} <= \
        set(_modes(tmp_path / "export")) | set(_modes(tmp_path / "runs" / "r"))
    assert stat.S_IMODE((tmp_path / "plain.bin").stat().st_mode) == files


def test_a_durable_write_fsyncs_the_file_and_its_folder_and_a_cache_write_does_not(tmp_path, monkeypatch):
    """``atomic_write_bytes`` flushes the file and the rename to disk before it returns (a checkpoint survives a power
    loss); ``durable=False`` (the remote shard set's chunk cache, whose reader checks each file's size) skips both
    fsyncs and is still atomic: the file appears whole under its name, no temp file is left."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    atomic_write_bytes(tmp_path / "ckpt.bin", b"x" * 4096)
    assert len(synced) == 2  # the file, then the folder holding the rename
    atomic_write_bytes(tmp_path / "chunk.bin", b"y" * 4096, durable=False)
    assert len(synced) == 2
    assert (tmp_path / "chunk.bin").read_bytes() == b"y" * 4096
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk.bin", "ckpt.bin"]
