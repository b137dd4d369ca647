"""A real one-node Slurm for the tests: munged, slurmctld and slurmd on loopback, two fake GPUs.

Debian's Slurm 22.05 packages (`slurmctld slurmd slurm-client munge`, installed by .ci/run).
Each pytest worker starts its own node in a temporary directory on free ports, so that
parallel workers never share a controller; the `slurm` fixture skips, with the reason, where
the packages are missing or we are not root (slurmd must run jobs as their users).

The fake GPUs are symlinks to /dev/null: Slurm accepts character devices only, and the
trailing digit of each name is the GPU index it reports in SLURM_JOB_GPUS.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

START_DEADLINE_S = 60.0
PACKAGES = "slurmctld slurmd slurm-client munge"

_CONF = """\
ClusterName=gpuschedtest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={base}/run/munge.sock
CredType=cred/munge
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
GresTypes=gpu
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={base}/log/jobcomp.txt
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=8 RealMemory=4000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def unavailable_reason() -> str | None:
    """Why no Slurm node can be started here, or None when one can."""
    if os.geteuid() != 0:
        return "a one-node Slurm needs root (slurmd runs jobs as their users)"
    missing = [tool for tool in ("slurmctld", "slurmd", "sbatch", "munged")
               if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install {PACKAGES}"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_pid(path: Path, deadline: float) -> int:
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise RuntimeError(f"no pid file {path}")


class SlurmNode:
    """One controller, one node (`localhost`, 8 CPUs, 2 GPUs), partition `debug`."""

    def __init__(self, base: Path):
        self.base = base
        self.conf = base / "etc" / "slurm.conf"
        self.pids: list[int] = []

    @property
    def env(self) -> dict[str, str]:
        """Add to a process's environment to talk to this node."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """A Slurm command against this node."""
        return subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True,
                              text=True, check=check, timeout=timeout)

    def start(self) -> None:
        for sub in ("etc", "state", "spool", "log", "jobs", "fakegpu", "run"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "munge").mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.base, 0o755)
        for index in (0, 1):
            (self.base / "fakegpu" / f"nvidia{index}").symlink_to("/dev/null")
        self.conf.write_text(_CONF.format(base=self.base, ctld_port=_free_port(),
                                          slurmd_port=_free_port()))
        (self.base / "etc" / "gres.conf").write_text(
            "AutoDetect=off\n"
            f"NodeName=localhost Name=gpu File={self.base}/fakegpu/nvidia[0-1]\n")
        deadline = time.monotonic() + START_DEADLINE_S
        key, run = self.base / "munge" / "munge.key", self.base / "run"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}", "--force"], check=True,
                       capture_output=True)
        subprocess.run(["munged", f"--socket={run}/munge.sock", f"--key-file={key}",
                        f"--pid-file={run}/munged.pid", f"--log-file={self.base}/log/munged.log",
                        f"--seed-file={self.base}/munge/munged.seed"], check=True)
        self.pids.append(_read_pid(run / "munged.pid", deadline))
        self.run("slurmctld", "-f", str(self.conf))
        self.pids.append(_read_pid(run / "slurmctld.pid", deadline))
        self.run("slurmd", "-N", "localhost", "-f", str(self.conf))
        self.pids.append(_read_pid(run / "slurmd.pid", deadline))
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-n", "localhost", "-o", "%T", check=False)
            if state.stdout.strip() == "idle":
                return
            time.sleep(0.1)
        raise RuntimeError(f"the Slurm node did not become idle:\n{self.log_tail()}")

    def stop_controller(self) -> None:
        """Stop slurmctld alone (jobs on the node keep running), as an outage would."""
        pid = self.pids[1]
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        (self.base / "run" / "slurmctld.pid").unlink(missing_ok=True)

    def start_controller(self) -> None:
        """Start slurmctld again, from its saved state; wait until it answers."""
        self.run("slurmctld", "-f", str(self.conf))
        deadline = time.monotonic() + START_DEADLINE_S
        self.pids[1] = _read_pid(self.base / "run" / "slurmctld.pid", deadline)
        while time.monotonic() < deadline:
            if self.run("squeue", "-h", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"slurmctld did not come back:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join("\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                         for log in sorted((self.base / "log").glob("*.log")))

    def cancel_all(self) -> None:
        """Stopping slurmd does not stop its jobs' slurmstepd: cancel every job first."""
        ids = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if ids:
            self.run("scancel", *ids, check=False)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
            time.sleep(0.1)

    def stop(self) -> None:
        if self.pids:
            self.cancel_all()
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.pids.clear()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def slurm():
    """A running one-node Slurm for this worker, stopped at the end of the session."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="gpusched-slurm-"))
    node = SlurmNode(base)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
