"""Per-job memory limits in a writable cgroup v2 subtree, where the machine offers one."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("gpusched.daemon.jobs.cgroups")

CGROUP_ROOT = Path("/sys/fs/cgroup")
_DAEMON_LEAF = "daemon"


def own_cgroup(proc_cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's cgroup v2 path ('0::/a/b' -> '/a/b'), or None on a v1-only machine."""
    try:
        for line in proc_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    except OSError:
        pass
    return None


def daemon_cgroups(enforce_mem: bool) -> CgroupJobs | None:
    """Kernel-enforced memory limits when enforce_mem is on and a cgroup v2 tree is ours."""
    if not enforce_mem:
        return None
    tree = CgroupJobs.detect()
    if tree is not None and tree.prepare(os.getpid()):
        return tree
    return None


class CgroupJobs:
    """Job cgroups under the daemon's own (delegated) cgroup.

    cgroup v2 lets a cgroup with processes in it enable no controllers for its children,
    so the daemon first moves itself into a `daemon` leaf, then enables the memory
    controller and creates a `job-N` sibling per job with memory.max set.
    """

    def __init__(self, base: Path):
        self.base = base

    @classmethod
    def detect(
        cls, root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
    ) -> CgroupJobs | None:
        own = own_cgroup(proc_cgroup)
        if own is None or not (root / "cgroup.controllers").exists():
            return None
        base = root / own.lstrip("/")
        try:
            controllers = (base / "cgroup.controllers").read_text().split()
        except OSError:
            return None
        if "memory" not in controllers or not os.access(base, os.W_OK):
            return None
        return cls(base)

    def prepare(self, pid: int) -> bool:
        """Move the daemon into its leaf and enable memory for job cgroups; False if refused."""
        try:
            leaf = self.base / _DAEMON_LEAF
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(pid))
            (self.base / "cgroup.subtree_control").write_text("+memory")
        except OSError as exc:
            log.warning("cgroup v2 at %s is not usable for job limits: %s", self.base, exc)
            return False
        return True

    def job_dir(self, job_id: int) -> Path:
        return self.base / f"job-{job_id}"

    def create(self, job_id: int, limit_bytes: int) -> Path:
        """A cgroup for the job with its memory limit; the shim's child joins it before exec."""
        path = self.job_dir(job_id)
        path.mkdir(exist_ok=True)
        (path / "memory.max").write_text(str(limit_bytes))
        swap = path / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")  # swapping past the limit would only hide the overuse
        return path

    def oom_killed(self, job_id: int) -> bool:
        """Whether the kernel killed a process of the job for going over memory.max."""
        try:
            events = (self.job_dir(job_id) / "memory.events").read_text()
        except OSError:
            return False
        counts = dict(line.split() for line in events.splitlines() if line.strip())
        return int(counts.get("oom_kill", "0")) > 0

    def remove(self, job_id: int) -> None:
        try:
            self.job_dir(job_id).rmdir()
        except OSError:
            pass  # not empty yet, or gone: the next start of this id replaces it

    def describe(self) -> str:
        return f"cgroup v2 memory limits under {self.base}"
