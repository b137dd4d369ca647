"""A job's processes found without its shim: by the shim's session, the job's cgroup, its run token.

A shim that dies without an exit record (SIGKILL, a bug, the OOM killer) leaves its job
running on GPUs that the daemon would otherwise give to the next job. The job's processes
still carry three marks that need no shim: the shim's session (the shim leads it, and the
job and whatever it starts stay in it unless they call setsid()), the job's cgroup (where
the daemon made one: nothing the job starts can leave it), and GPUSCHED_RUN_TOKEN, which
names the attempt (the run's token, proc/runfile.py), in the environment that every process
of the job inherits (setsid() keeps it; only a process that clears its environment loses
it). The token is what tells
this attempt from a job of another gpusched home, or a process with a copied environment.

Standard library only: the seam (proc/seam.py) calls it for the daemon.
"""

from __future__ import annotations

import os
import signal
from collections import namedtuple

from gpusched.proc import jobenv, runfile

TYPE_CHECKING = False  # not typing: the supervisor's import chain, which forks the shim
if TYPE_CHECKING:
    from typing import Any

    from gpusched.proc.runfile import ShimRecord

JobMarks = namedtuple(
    "JobMarks", "runner_pid runner_start_ticks uid token cgroup supervised", defaults=(False,)
)
JobMarks.__doc__ = """How a job's processes are recognised: its runner's pid and start ticks
(from the run file's "shim" record: the shim's, or the job's own when supervised), the job's uid, its run token and its cgroup directory
("" or None: none); supervised: the "shim" is the job's own process, leader of its
session (started by the supervisor, proc/supervisor/main.py), one of those found."""


def marks_of(run_spec: dict[str, Any], shim: ShimRecord, uid: int) -> JobMarks:
    """The marks of the run whose run file holds this spec and "shim" record."""
    return JobMarks(
        shim[0],
        shim[1],
        uid,
        run_spec.get("env", {}).get(jobenv.RUN_TOKEN, ""),
        run_spec.get("cgroup") or "",
        shim.supervised,
    )


def find(marks: JobMarks) -> dict[int, int]:
    """pid -> start ticks of every live process of the job: one pass over /proc. Zombies
    hold no GPU and no memory: left out (an orphan's reaper may never reap it)."""
    in_session = _session_is_the_shims(marks)
    in_cgroup = _cgroup_pids(marks.cgroup)
    entry = f"{jobenv.RUN_TOKEN}={marks.token}".encode() if marks.token else None
    skip = {os.getpid()} if marks.supervised else {os.getpid(), marks.runner_pid}
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        pid = int(name)
        try:
            stat = runfile.read_proc_stat(pid)
        except (OSError, ValueError, IndexError):
            continue  # gone since the listing
        # Every process of the job started after its shim: an older one never belongs.
        if stat.state == "Z" or stat.start_ticks < marks.runner_start_ticks:
            continue
        if (
            (in_session and stat.session == marks.runner_pid)
            or pid in in_cgroup
            or (entry is not None and carries(pid, entry, marks.uid))
        ):
            found[pid] = stat.start_ticks
    return found


def _session_is_the_shims(marks: JobMarks) -> bool:
    """Whether session id runner_pid still means the shim's session. Linux gives out no pid
    that a live session is named by; so if another process has the shim's pid now, the
    shim's session has no member left, and that session id is someone else's."""
    try:
        started: int = runfile.read_proc_stat(marks.runner_pid).start_ticks
        recorded: int = marks.runner_start_ticks
        return started == recorded
    except (OSError, ValueError, IndexError):
        return True  # nobody has the pid: the session, if it has members, is the shim's


def _cgroup_pids(cgroup: str) -> set[int]:
    if not cgroup:
        return set()
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as procs:
            return {int(line) for line in procs if line.strip()}
    except (OSError, ValueError):
        return set()  # removed, or never made


def carries(pid: int, entry: bytes, uid: int) -> bool:
    """Whether the process, the job's user's, has the job's run token in its environment
    (another user's process is never taken for the job, whatever it carries)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        with open(f"/proc/{pid}/environ", "rb") as environ:
            data = environ.read()
    except OSError:
        return False  # gone, or not ours to read
    return b"\0" + entry + b"\0" in b"\0" + data + b"\0"


def signal_all(found: dict[int, int], signum: int) -> None:
    """Send `signum` to each process of find()'s result that is still that process."""
    for pid, start_ticks in found.items():
        _signal_if_same(pid, start_ticks, signum)


def _signal_if_same(pid: int, start_ticks: int, signum: int) -> None:
    # Through a pidfd where the system has them: the pid cannot go to another process
    # between the check of its start ticks and the signal.
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None  # no pidfds here (or the process is gone: the check below says so)
    try:
        if runfile.read_proc_stat(pid).start_ticks != start_ticks:
            return
        if pidfd is None:
            os.kill(pid, signum)
        else:
            signal.pidfd_send_signal(pidfd, signum)
    except (OSError, ValueError, IndexError):
        pass  # ended meanwhile
    finally:
        if pidfd is not None:
            os.close(pidfd)
