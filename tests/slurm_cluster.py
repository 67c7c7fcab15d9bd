"""A real single-node SLURM cluster on loopback, for tests: munged + slurmctld + slurmd under a temporary directory.

``SlurmCluster(root).start()`` writes a munge key, a ``slurm.conf`` (private ports, accounting off,
``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``, one node ``localhost`` at 127.0.0.1 in partition
``debug``) and starts the three daemons in the foreground as children of this process, so ``stop()`` ends them by PID.
``env`` is the environment to run ``sbatch``/``srun``/``squeue``/``scontrol``/``scancel`` with (it sets ``SLURM_CONF``).
``stop()`` first cancels every job, then ends job processes that carry this cluster's ``SLURM_CONF`` (found by PID in
``/proc``), then the daemons: nothing is left running.

The requeue hold is shortened with ``AuthInfo=...,cred_expire=5``: slurmctld gives a requeued job a BeginTime
``cred_expire`` seconds ahead (default 120 s), and ``SchedulerParameters=sched_interval=1`` makes the main scheduler
notice the passed BeginTime within a second (default 60 s). Measured: requeue → running again in ~6 s.

Not supported: more than one node, accounting (``sacct``), cgroups, running without root (the daemons run as root here;
the fixture skips when not root or when the Debian packages ``slurmctld slurmd slurm-client munge`` are missing, and
fails instead of skipping when ``CI`` or ``IMPULSEVIT_REQUIRE_SLURM`` is set).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as L
import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a daemon's child before exec: SIGTERM it if the test process dies (a killed pytest leaks no daemons)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def missing_requirements() -> str | None:
    """Why a loopback cluster cannot start here (None when it can)."""
    missing = [b for b in DAEMONS + CLIENTS if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return (f"SLURM/munge binaries not found: {', '.join(missing)} "
                "(apt-get install slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        return "the loopback SLURM test cluster runs its daemons as root; not root here"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    """One-node SLURM on 127.0.0.1 under ``root``; see the module docstring."""

    def __init__(self, root: Path, cpus: int = 2, cred_expire: int = 5, kill_wait: int = 5) -> None:
        self.root = Path(root)
        self.cpus = cpus
        self.cred_expire = cred_expire
        self.kill_wait = kill_wait
        self.conf = self.root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env: dict[str, str] = {}

    # ----------------------------------------------------------------------------------------------- configuration
    def _write_config(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o755)  # munged refuses a socket dir it considers insecure; 0755 is accepted
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = r / "munge" / "munge.socket"
        ctld_port, slurmd_port = _free_port(), _free_port()
        lines = [
            "ClusterName=impulsevittest",
            "SlurmctldHost=localhost(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",  # a requeued job's BeginTime passing triggers no scheduling
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "JobRequeue=1",
            f"KillWait={self.kill_wait}",
            "MinJobAge=600",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for var in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if var != "SLURM_CONF":
                del self.env[var]

    # ---------------------------------------------------------------------------------------------- start / stop
    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / "log" / f"{name}.out", "wb") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True, preexec_fn=_die_with_parent)

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        """Write the config, start munged, slurmctld, slurmd and wait until node ``localhost`` is idle."""
        self._write_config()
        r = self.root
        try:
            self._spawn("munged", [_exe("munged"), "--foreground", "--force", f"--key-file={r / 'munge/munge.key'}",
                                   f"--socket={self.munge_socket}", f"--pid-file={r / 'munge/munged.pid'}",
                                   f"--seed-file={r / 'munge/munged.seed'}", f"--log-file={r / 'log/munged.log'}"])
            self._wait(lambda: self.munge_socket.exists(), timeout, "munged socket")
            self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._wait(lambda: self.run(["scontrol", "ping"], check=False).stdout.count("UP") > 0, timeout,
                       "slurmctld to answer 'scontrol ping'")
            self._spawn("slurmd", [_exe("slurmd"), "-D", "-N", "localhost", "-f", str(self.conf)])
            self._wait(self._node_idle, timeout, "node localhost to become idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _node_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.strip()
        return out.startswith("idle")

    def _wait(self, cond, timeout: float, what: str) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}; "
                                       f"logs:\n{self.logs()}")
            if cond():
                return
            time.sleep(0.2)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; logs:\n{self.logs()}")

    def logs(self, tail: int = 40) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            lines = f.read_text(errors="replace").splitlines()[-tail:]
            out.append(f"==> {f.name} <==\n" + "\n".join(lines))
        return "\n".join(out)

    def _job_pids(self) -> list[int]:
        """PIDs of processes (other than the daemons) whose environment names this cluster's slurm.conf."""
        marker = f"SLURM_CONF={self.conf}".encode()
        mine = {p.pid for p in self.procs.values()} | {os.getpid()}
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) in mine:
                continue
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in env:
                pids.append(int(d.name))
        return pids

    def stop(self) -> None:
        """Cancel all jobs, end leftover job processes by PID, then the daemons (TERM, then KILL after 10 s)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--signal=KILL", "--partition=debug"], check=False)  # running jobs, now
            self.run(["scancel", "--partition=debug"], check=False)  # and pending (e.g. requeued) ones
            t0 = time.monotonic()
            while time.monotonic() - t0 < 15 and self.run(["squeue", "-h"], check=False).stdout.strip():
                time.sleep(0.3)
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        for pid in self._job_pids():  # slurmstepd and task processes are not our children; end them by PID
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs.clear()

    # -------------------------------------------------------------------------------------------------- clients
    def run(self, argv: list[str], check: bool = True, timeout: float = 30.0, **kw) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster; returns the CompletedProcess (text)."""
        return subprocess.run(argv, env={**self.env, **kw.pop("env", {})}, capture_output=True, text=True,
                              check=check, timeout=timeout, **kw)

    def sbatch(self, argv: list[str], **kw) -> str:
        """Submit with ``sbatch --parsable ARGV``; returns the job id."""
        out = self.run(["sbatch", "--parsable", *argv], **kw).stdout.strip()
        return out.split(";")[0]

    def job_state(self, job_id: str) -> str:
        """The job's state from ``scontrol show job`` (e.g. PENDING, RUNNING, COMPLETED); '' when unknown."""
        out = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        for tok in out.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        return ""

    def job_field(self, job_id: str, field: str) -> str:
        out = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        for tok in out.split():
            if tok.startswith(field + "="):
                return tok.split("=", 1)[1]
        return ""

    def wait_state(self, job_id: str, states: set[str], timeout: float) -> str:
        """Poll until the job reaches one of ``states``; returns it. Raises TimeoutError with the logs otherwise."""
        t0 = time.monotonic()
        state = ""
        while time.monotonic() - t0 < timeout:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.3)
        raise TimeoutError(f"job {job_id} stuck in {state!r} after {timeout:.0f} s (wanted {sorted(states)});\n"
                           f"{self.logs()}")


def start_or_skip(root: Path, **kw) -> SlurmCluster:
    """Start a cluster, or skip the test with the reason (fail instead when CI/IMPULSEVIT_REQUIRE_SLURM is set)."""
    why = missing_requirements()
    if why is not None:
        if os.environ.get("CI") or os.environ.get("IMPULSEVIT_REQUIRE_SLURM"):
            pytest.fail(f"SLURM tests are required here but cannot run: {why}")
        pytest.skip(why)
    return SlurmCluster(root, **kw).start()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    """A running loopback SLURM cluster for the module's tests; stopped (by PID) afterwards."""
    cluster = start_or_skip(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


class StepPacer(L.Callback):
    """Test instrument for jobs: sleeps ``sleep_s`` after every training step and (rank 0) records the global step in
    ``<default_root_dir>/progress`` (atomically), so a test can signal the job at a known point of a real run."""

    def __init__(self, sleep_s: float = 0.3) -> None:
        self.sleep_s = sleep_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.sleep_s)
        if trainer.is_global_zero:
            path = Path(trainer.default_root_dir) / "progress"
            tmp = path.with_name(f"progress.tmp-{os.getpid()}")
            tmp.write_text(str(trainer.global_step))
            os.replace(tmp, path)
