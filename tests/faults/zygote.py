"""A warm interpreter that forks the ``impulsevit`` command for the fault suite's :func:`harness.run`.

Most fault cases fail before any work, in well under a second, but a fresh interpreter spends 5–6 s of CPU importing
torch, Lightning and timm first: across the suite's ~90 such commands that start-up was most of its time. The zygote
is one interpreter per test worker that imports what ``python -m impulsevit.cli`` imports (the console script's
module: torch, Lightning, timm, the fit / validate / test / predict command line) once, then for each request forks a
child that becomes the command exactly as a fresh ``python -m impulsevit.cli ARGS`` would run it: its own session
(``setsid``), the working directory, the environment (``PYTHONPATH`` entries put first on ``sys.path``), stdin from
``/dev/null``, stdout / stderr to files, ``sys.argv``, then the console script's ``main`` with the interpreter's exit
rules (``SystemExit`` codes, an uncaught exception printed by ``sys.excepthook`` with status 1, ``atexit`` handlers
run) — except the exit hooks the zygote registered while importing (``weakref.finalize`` and ``atexit`` alike): the
child did not create what they clean up. W&B, imported with ``timm.data``, makes its media temp folder at import and
registers its removal with ``atexit``; a child running it deleted the folder under every later command.

The subcommand providers (``impulsevit.cli.entry.PROVIDERS``) are not imported ahead (the zygote holds only what the
console script's module imports).
Not covered this way, so kept on real ``exec``'d processes (:func:`harness.start`): anything that signals the command
while it works (the child tests), and a failure while importing impulsevit itself (the zygote would fail first, and
the harness then falls back to a fresh process for every command). ``IMPULSEVIT_TEST_FORK=0`` turns the zygote off.

Protocol (one JSON object per line): request ``{"argv", "cwd", "env", "out", "err"}``; replies ``{"pid": P}`` at the
fork and ``{"rc": R}`` when the child ended.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

SERVER = r'''
import atexit, json, os, sys, traceback
from impulsevit.cli import main as cli_main
reply = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
reply.write(json.dumps({"ready": True}) + "\n")


def child(req):
    # the zygote's own finalizers (e.g. a library's temp folder made at import, W&B's media folder) belong to the
    # zygote: a child that ran them at its exit would delete them under the next child
    # (weakref finalizers and plain atexit hooks alike: W&B registers MEDIA_TMP.cleanup with atexit at import)
    import weakref
    for info in list(getattr(weakref.finalize, "_registry", {}).values()):
        info.atexit = False
    atexit._clear()
    os.setsid()
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in extra if p not in sys.path]
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
    os.dup2(os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
    sys.argv = [sys.argv[0], *req["argv"]]
    code = 0
    try:
        code = cli_main()
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            child(req)
        finally:
            os._exit(1)
    reply.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    reply.write(json.dumps({"rc": rc}) + "\n")
'''


class Zygote:
    """One warm interpreter (see the module docstring); :meth:`run` is safe to call from one thread at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd="/")
        self.lock = threading.Lock()
        first = self._read(timeout=600)
        if first is None or not first.get("ready"):
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.close()
            raise RuntimeError(f"the zygote did not start: {err[-2000:]}")

    def _read(self, timeout: float) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def run(self, argv: list[str], cwd: str, env: dict[str, str], out: Path, err: Path,
            timeout: float) -> tuple[int | None, int]:
        """Run one command; ``(exit status or None on timeout, pid = session id)``."""
        with self.lock:
            req = {"argv": argv, "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            started = self._read(timeout=60)
            if started is None:
                raise RuntimeError("the zygote did not fork")
            done = self._read(timeout)
            if done is None:
                return None, started["pid"]
            return done["rc"], started["pid"]

    def wait_after_kill(self, timeout: float = 60) -> int | None:
        """After the caller killed a timed-out command: the zygote's report of its end."""
        done = self._read(timeout)
        return None if done is None else done["rc"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_ZYGOTE: Zygote | None = None
_FAILED = False


def get(env: dict[str, str]) -> Zygote | None:
    """This worker's zygote (started on first use), or None when turned off or when it could not start."""
    global _ZYGOTE, _FAILED
    if os.environ.get("IMPULSEVIT_TEST_FORK", "1") == "0" or _FAILED:
        return None
    if _ZYGOTE is None or _ZYGOTE.proc.poll() is not None:
        try:
            _ZYGOTE = Zygote(env)
        except RuntimeError:
            _FAILED = True
            return None
        import atexit

        atexit.register(_ZYGOTE.close)
    return _ZYGOTE
