"""``impulsevit.procs``: a stop signal that lands inside a constructor leaves a half-built object; its failing
``__del__`` must not print a traceback after the one-line stop (a real process,
``impulsevit.procs.stop_on_signals``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from impulsevit.procs import Stopped, stop_on_signals

    class Bar:  # like tqdm: __del__ reads an attribute __init__ sets after a point a signal can interrupt
        def __init__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises Stopped here
            self.pos = 0

        def __del__(self):
            abs(self.pos)

    try:
        with stop_on_signals():
            keep = [Bar()]
    except Stopped as stop:
        print(f"stopped by {stop.name}", file=sys.stderr)
        sys.exit(stop.code)
""")


def test_a_half_built_object_after_a_stop_prints_no_traceback():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip() == "stopped by SIGTERM", done.stderr
