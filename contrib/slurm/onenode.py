#!/usr/bin/env python3
"""A one-node Slurm on this machine: munged, slurmctld and slurmd on loopback, two fake GPUs.

To try gpusched's hand-off to a cluster (docs/slurm.md) without one, as root:

    apt-get install slurmctld slurmd slurm-client munge
    python3 contrib/slurm/onenode.py start /tmp/slurm1   # prints SLURM_CONF and a config
    python3 contrib/slurm/onenode.py stop /tmp/slurm1

Everything lives under the directory given (config, state, logs, munge key), on free ports;
nothing of the system's Slurm or munge is touched. gpusched's tests start their nodes with
this same code (tests/slurmnode.py), one per test worker.

The fake GPUs are symlinks to /dev/null: Slurm accepts character devices only, and the
trailing digit of each name is the GPU index it reports in SLURM_JOB_GPUS.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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
    missing = [
        tool
        for tool in ("slurmctld", "slurmd", "sbatch", "munged")
        if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
    ]
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

    def run(
        self, *argv: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess:
        """A Slurm command against this node."""
        return subprocess.run(
            argv,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def start(self) -> None:
        for sub in ("etc", "state", "spool", "log", "jobs", "fakegpu", "run"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "munge").mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.base, 0o755)
        for index in (0, 1):
            (self.base / "fakegpu" / f"nvidia{index}").symlink_to("/dev/null")
        self.conf.write_text(
            _CONF.format(base=self.base, ctld_port=_free_port(), slurmd_port=_free_port())
        )
        (self.base / "etc" / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName=localhost Name=gpu File={self.base}/fakegpu/nvidia[0-1]\n"
        )
        deadline = time.monotonic() + START_DEADLINE_S
        key, run = self.base / "munge" / "munge.key", self.base / "run"
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={key}", "--force"], check=True, capture_output=True
        )
        subprocess.run(
            [
                "munged",
                f"--socket={run}/munge.sock",
                f"--key-file={key}",
                f"--pid-file={run}/munged.pid",
                f"--log-file={self.base}/log/munged.log",
                f"--seed-file={self.base}/munge/munged.seed",
            ],
            check=True,
        )
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
        return "\n".join(
            "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            for log in sorted((self.base / "log").glob("*.log"))
        )

    def cancel_all(self) -> None:
        """Stopping slurmd does not stop its jobs' slurmstepd: cancel every job first."""
        ids = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if ids:
            self.run("scancel", *ids, check=False)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
            time.sleep(0.1)

    def stop(self) -> None:
        """Cancel every job, then stop the daemons (those this object started, else those
        whose pid files are under its directory)."""
        if not self.pids:
            self.pids = [
                int(p.read_text())
                for name in ("munged", "slurmctld", "slurmd")
                if (p := self.base / "run" / f"{name}.pid").exists() and p.read_text().strip()
            ]
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


USAGE = "usage: onenode.py start|stop DIR"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(USAGE, file=sys.stderr)
        return 2
    node = SlurmNode(Path(argv[1]).resolve())
    if argv[0] == "stop":
        node.stop()
        print(f"stopped the Slurm node in {node.base}")
        return 0
    reason = unavailable_reason()
    if reason:
        print(f"Error: {reason}", file=sys.stderr)
        return 1
    if node.base.exists() and any(node.base.iterdir()):
        print(f"Error: {node.base} is not empty; give a new directory", file=sys.stderr)
        return 1
    try:
        node.start()
        (node.base / "shared").mkdir(mode=0o1777)  # every user's job records, as /tmp
        os.chmod(node.base / "shared", 0o1777)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        node.stop()
        print(f"Error: the Slurm node did not start: {exc}", file=sys.stderr)
        return 1
    print(f"""A one-node Slurm runs in {node.base} (partition debug, 8 CPUs, 2 GPUs).
Use it from this shell:

    export SLURM_CONF={node.conf}

and hand gpusched jobs to it from a user daemon's config (~/.config/gpusched/gpusched.toml):

    [clusters.local1]
    slurm_conf = "{node.conf}"
    shared_dir = "{node.base}/shared"

then `gpusched submit --cluster local1 -- hostname`. Stop it with:

    python3 {Path(__file__).resolve()} stop {node.base}""")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
