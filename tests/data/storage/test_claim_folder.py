"""``claim_folder``: the first live user of a shared folder clears what exited processes left there; a user beside a
live one does not, nor a second claim in one process. Real processes: each claim is a ``python -c`` child (a flock
belongs to a process, so the test process itself never claims)."""

from __future__ import annotations

import subprocess
import sys

from _cli_helpers import subprocess_env

from impulsevit._compat.litdata import clear_stale_cache_state

CLAIM = ("import sys; from pathlib import Path; from impulsevit.data.locking import claim_folder; "
         "f = Path(sys.argv[1]); clear = lambda d: (d / 'cleared').write_text('x'); "
         "print(claim_folder(f, clear), claim_folder(f, clear), flush=True); sys.stdin.read()")


def _claim(folder, *, hold: bool = False) -> tuple[subprocess.Popen, str]:
    """A child claiming ``folder`` twice; its printed results; the child is left running (holding) when ``hold``."""
    child = subprocess.Popen([sys.executable, "-c", CLAIM, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=subprocess_env())
    line = child.stdout.readline().strip()
    if not hold:
        child.communicate("", timeout=60)
    return child, line


def test_the_first_live_claim_clears_and_one_beside_a_live_claim_does_not(tmp_path):
    folder = tmp_path / "cache"
    holder, first = _claim(folder, hold=True)
    try:
        assert first == "True False"  # the first claim clears; the same process's second one does not
        assert (folder / "cleared").is_file()
        (folder / "cleared").unlink()
        _, beside = _claim(folder)
        assert beside == "False False" and not (folder / "cleared").exists()
    finally:
        holder.kill()  # as a killed run: its claim goes with it
        holder.wait()
    _, after = _claim(folder)
    assert after == "True False" and (folder / "cleared").is_file()


def test_litdata_bookkeeping_is_cleared_and_chunks_stay(tmp_path):
    """The names LitData leaves beside its chunks (checked against a real cache in
    tests/data/loading/test_litdata_backend.py): counts, locks, the slot budget, half-written downloads."""
    sub = tmp_path / "0123" / "4567"
    sub.mkdir(parents=True)
    keep = ["chunk-0-1.bin", "index.json", ".users", "chunk-0-2.bin"]
    stale = ["chunk-0-1.bin.cnt", "chunk-0-1.bin.lock", "chunk-0-1.bin.cnt.lock", "index.json.lock",
             ".litdata_cache_slots", ".litdata_cache_slots.lock", "chunk-0-3.bin.tmp.4242"]
    for name in keep + stale:
        (sub / name).write_text("1")
    assert clear_stale_cache_state(tmp_path) == len(stale)
    assert sorted(p.name for p in sub.iterdir()) == sorted(keep)
