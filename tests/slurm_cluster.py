"""A single-node Slurm cluster on this machine, for tests: Debian's `munged`, `slurmctld` and
`slurmd`, configured in a private temporary directory and started as root; `stop` kills every
job, step and daemon it started and removes the directory.

The cluster is private: its own munge key and socket, its own ports, state and spool under the
directory, traffic on loopback only. Clients reach it through `SLURM_CONF` (`cluster.env`).
No cgroups: processes are tracked by walking /proc (proctrack/linuxproc), tasks are not bound
(task/none), memory is a scheduling count only; gVisor and most containers refuse cgroup plugins.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
PACKAGES = "slurmctld, slurmd and munge (scripts/install.sh installs them as root)"
# Log lines that mean the kernel or container refused what a daemon needs: the test is skipped
# with the line. Any other start failure fails the test.
REFUSALS = ("Operation not permitted", "Permission denied", "Function not implemented", "cgroup")


class SlurmRefused(RuntimeError):
    """The kernel or container refused a Slurm daemon; the message is the daemon's own line."""


def unavailable() -> str | None:
    """Why a cluster cannot be started here (missing programs, not root), or None."""
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): needs the Debian packages {PACKAGES}"
    if os.geteuid() != 0:
        return "the Slurm daemons are started as root (SlurmUser=root) and this test runs as uid %d" % os.geteuid()
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _memory_mb() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


# Job states of a job that has not ended yet (squeue's long names).
_LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}


@dataclass
class SlurmCluster:
    """One node (this host, on 127.0.0.1) in one partition; `env` points clients at it."""

    root: Path
    node: str
    partition: str
    cpus: int
    memory_mb: int
    env: dict[str, str] = field(default_factory=dict)
    munge_socket: Path = field(init=False)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def command(self, *args: str, timeout: float = 30) -> str:
        """A Slurm client command against this cluster; its stdout (raises with stderr on failure)."""
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-1000:]}")
        return proc.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Partition, NodeList, ...); finished jobs stay
        visible for MinJobAge."""
        fields: dict[str, str] = {}
        for word in self.command("scontrol", "-o", "show", "job", job_id).split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def ended(self, job_id: str, timeout_s: float = 90.0) -> dict[str, str]:
        """`job(job_id)` once the job has ended (its state past RUNNING and COMPLETING). A launcher
        sees a job's result before slurmctld records its end, so a state read at once may still
        say RUNNING; a job that does not end within `timeout_s` is returned as it is."""
        deadline = time.monotonic() + timeout_s
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") not in _LIVE_STATES or time.monotonic() > deadline:
                return fields
            time.sleep(0.5)

    def log(self, daemon: str) -> str:
        path = self.root / "log" / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        (self.root / "log").mkdir()
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait("slurmctld", lambda: self._quiet("scontrol", "ping") and "UP" in self.command("scontrol", "ping"), 60)
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait("slurmd", lambda: self._quiet("sinfo") and self.command("sinfo", "-h", "-n", self.node, "-o", "%T").strip() == "idle", 90)
        logger.info("Slurm up in %s: node %s (%d CPUs, %d MB), partition %s", self.root, self.node, self.cpus, self.memory_mb, self.partition)

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o755)  # munged refuses a key in a directory others may write
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = munge / "socket"
        self._spawn("munged", [
            "munged", "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}", f"--log-file={self.root / 'log' / 'munged.log'}",
        ])
        self._wait("munged", self.munge_socket.exists, 30)

    def _write_conf(self) -> None:
        state, spool = self.root / "state", self.root / "spool"
        state.mkdir()
        spool.mkdir()
        ctld_port, slurmd_port = _free_ports(2)
        log = self.root / "log"
        self.conf.write_text("\n".join([
            "# Written by tests/slurm_cluster.py for one test session; removed with it.",
            "ClusterName=opdtest",
            # Controller and node both on loopback, on ports of their own.
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={log / 'slurmctld.log'}",
            f"SlurmdLogFile={log / 'slurmd.log'}",
            # No cgroups: /proc walking and unbound tasks work in containers that refuse them.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            # CPUs and memory are consumable: jobs ask for them as on a real cluster.
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "SchedulerType=sched/backfill",
            # Finished jobs stay visible to scontrol for the test's checks; SIGTERM to SIGKILL as by default.
            "MinJobAge=900",
            "KillWait=30",
            "ReturnToService=2",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
            # Not the default partition: jobs reach it only by naming it (hydra.launcher.partition).
            f"PartitionName={self.partition} Nodes={self.node} Default=NO MaxTime=60 State=UP",
            "",
        ]))
        self.env["SLURM_CONF"] = str(self.conf)

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = (self.root / "log" / f"{name}.out").open("w")
        # Its own session: a Ctrl-C of the test does not reach it; stop() ends it by pid.
        self.daemons[name] = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _quiet(self, *args: str) -> bool:
        return subprocess.run(list(args), env=self.env, capture_output=True, timeout=30).returncode == 0

    def _wait(self, name: str, ready, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            proc = self.daemons[name]
            if proc.poll() is not None or time.monotonic() > deadline:
                text = self.log(name) + (self.root / "log" / f"{name}.out").read_text(errors="replace")
                for line in text.splitlines():
                    if any(marker in line for marker in REFUSALS):
                        raise SlurmRefused(f"{name}: {line.strip()}")
                state = "exited with %s" % proc.returncode if proc.poll() is not None else f"not ready in {timeout_s:.0f} s"
                raise RuntimeError(f"{name} {state}; its log ends:\n{text[-3000:]}")
            time.sleep(0.5)

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Cancel every job, end the job steps, the daemons, then remove the directory."""
        try:
            if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
                subprocess.run(["scancel", "--full", "--partition", self.partition], env=self.env, capture_output=True, timeout=30)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and self._quiet("squeue") and self.command("squeue", "-h").strip():
                    time.sleep(0.5)
        finally:
            for name in reversed(list(self.daemons)):
                _end(self.daemons[name])
            for pid in self._stray_steps():
                logger.warning("ending a stray slurmstepd (pid %d) of this cluster", pid)
                _kill(pid)
            shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this cluster is still running (daemons, job steps) as `name (pid N)`; empty after `stop`."""
        alive = [f"{name} (pid {proc.pid})" for name, proc in self.daemons.items() if proc.poll() is None]
        return alive + [f"slurmstepd (pid {pid})" for pid in self._stray_steps()]

    def _stray_steps(self) -> list[int]:
        """slurmstepd processes of this cluster still alive (they detach from slurmd): those with
        our SLURM_CONF in their environment."""
        mine = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "cmdline").read_bytes().startswith(b"slurmstepd") and mine in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_cluster(partition: str = "opd", cpus: int = 2, memory_mb: int = 4096) -> SlurmCluster:
    """A running cluster of this host; the caller calls `stop()`. `SlurmRefused` where the kernel
    or container refuses a daemon."""
    # Short path: unix sockets (munge's, slurmstepd's) have a 108-byte limit.
    root = Path(tempfile.mkdtemp(prefix="opd-slurm-"))
    root.chmod(0o755)
    node = socket.gethostname().split(".")[0]
    cluster = SlurmCluster(root, node, partition, min(cpus, os.cpu_count() or 1), min(memory_mb, _memory_mb() // 2),
                           env={**os.environ})
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster
