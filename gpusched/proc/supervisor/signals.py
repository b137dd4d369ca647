"""The job supervisor's signals: a job's group, what it left outside it, the grace's SIGKILL.

A SIGTERM from the daemon goes to the job's process group and to any process it left
outside (the supervisor is the child subreaper of every job: orphans become its own), and
arms a SIGKILL of all of them after the job's grace period, as a shim's Forwarder does.
At a job's end, what it left is killed (leftovers in its group hold GPU memory).
Standard library only (proc/supervisor/main.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

from gpusched.proc import jobenv, leftovers

TYPE_CHECKING = False  # not typing: the supervisor's import chain, which forks the shim
if TYPE_CHECKING:
    from gpusched.proc.supervisor.starts import Supervised


def signal_job(by_pid: dict[int, Supervised], shims: set[int], pid: int, signum: int) -> None:
    """A signal for a job's process group (the daemon has checked the pid is the job's);
    for one of ours (by_pid: pid -> Supervised) also to what it left outside the group,
    and a SIGTERM arms the SIGKILL after its grace period."""
    job = by_pid.get(pid)
    killpg(pid, signum)
    if job is None:
        return
    signal_orphans([job], signum, by_pid, shims)
    if signum == signal.SIGTERM and job.kill_at is None:
        job.kill_at = time.monotonic() + max(job.grace_s, 0.001)


def kill_overdue(by_pid: dict[int, Supervised], shims: set[int]) -> None:
    """SIGKILL the jobs whose SIGTERM's grace has run out, and what they left."""
    now = time.monotonic()
    due = [job for job in by_pid.values() if job.kill_at is not None and job.kill_at <= now]
    for job in due:
        job.kill_at = None
        killpg(job.pid, signal.SIGKILL)
    if due:
        signal_orphans(due, signal.SIGKILL, by_pid, shims)


def next_kill_at(by_pid: dict[int, Supervised]) -> float | None:
    """When the next grace runs out (monotonic), if any runs."""
    return min((job.kill_at for job in by_pid.values() if job.kill_at is not None), default=None)


def signal_orphans(
    jobs: Iterable[Supervised], signum: int, by_pid: dict[int, Supervised], shims: set[int]
) -> None:
    """Signal the processes these jobs left outside their group that became ours (a
    launcher that starts its workers in sessions of their own), known by run token.
    Only our children count: one read of /proc, skipped when none is an orphan."""
    orphans = _children() - by_pid.keys() - shims
    if not orphans:
        return
    for job in jobs:
        entry = f"{jobenv.RUN_TOKEN}={job.token}".encode()
        for pid in orphans:
            if job.token and leftovers.carries(pid, entry, os.getuid()):
                killpg(pid, signum) if _leads_group(pid) else _kill(pid, signum)


def _children() -> set[int]:
    try:
        with open(f"/proc/self/task/{os.getpid()}/children", "rb") as listing:
            return {int(pid) for pid in listing.read().split()}
    except OSError:
        return set()


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except OSError:
        pass  # gone: nothing left to signal


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass
