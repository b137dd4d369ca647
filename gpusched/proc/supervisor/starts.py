"""The job supervisor's starts: which jobs it starts itself, the spawn, the run file.

A plain job (needs_shim: none of system mode, cgroups, containers, capped logs or --pty) is
posix_spawned directly, leading a session of its own, its logs, environment, working
directory and CPU pinning as a shim would give them (proc/spawn.py, the shim's spawn too).
Its pid and start ticks go into its run file's "shim" record, marked supervised: the
daemon watches and measures the job's own process, and signals it through the supervisor. Standard library only (proc/supervisor/main.py).
"""

from __future__ import annotations

import os
import resource
import signal

from gpusched.proc import jobenv, jobexec, runfile, runreport, spawn

TYPE_CHECKING = False  # not typing: the supervisor's import chain, which forks the shim
if TYPE_CHECKING:
    from typing import Any

# pidfds: Linux 5.3 and Python 3.9; waitid on one, Linux 5.4. Without them, a shim per job.
CAN_SUPERVISE = hasattr(os, "pidfd_open") and hasattr(os, "P_PIDFD")
_FDS_MAX = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # jobs keep the soft limit: not raised
if _FDS_MAX == resource.RLIM_INFINITY or _FDS_MAX <= 0:
    _FDS_MAX = 1 << 30
_FDS_SPARE = 64  # descriptors kept for links, a spawn's logs, run files


def needs_shim(spec: dict[str, Any]) -> bool:
    """Whether the job needs a shim of its own: a privilege drop (system mode), a cgroup to
    join, a container to remove, logs to cap (threads that copy its output), or a
    terminal to serve (--pty, proc/ptyhost.py)."""
    return (
        spec.get("run_as") is not None
        or bool(spec.get("cgroup"))
        or bool(spec.get("max_log_bytes"))
        or "container_remove" in spec
        or "pty_socket" in spec
        or not CAN_SUPERVISE
    )


def has_fds_for_one_more(fds_held: int) -> bool:
    """Whether another job's pidfd fits under our descriptor limit (past it, a shim
    watches the job)."""
    return fds_held + _FDS_SPARE < _FDS_MAX


class Supervised:
    """A job we started and watch: its pid (its session and group), pidfd and run."""

    __slots__ = ("pid", "pidfd", "run_file", "run", "wake", "grace_s", "token", "kill_at")

    def __init__(self, spec: dict[str, Any], pid: int, pidfd: int):
        self.pid, self.pidfd = pid, pidfd
        self.run_file, self.run, self.wake = spec["run_file"], spec.get("run"), spec["wake"]
        self.grace_s = float(spec.get("grace_s", 10.0))
        self.token = spec["env"].get(jobenv.RUN_TOKEN, "")
        self.kill_at: float | None = None  # when a SIGTERM's grace runs out (monotonic)


def start(spec: dict[str, Any], line: bytes, dirs: set[str]) -> Supervised | None:
    """Spawn the job and write its run file; None if it could not start (the daemon is
    told why: runreport.start_failed). dirs: the id-range directories known to exist (added to)."""
    directory = os.path.dirname(spec["run_file"])
    if directory not in dirs:  # the job's logs go beside its run file
        os.makedirs(directory, 0o700, exist_ok=True)
        dirs.add(directory)
    try:
        pid = spawn.spawn(spec, own_session=True)
    except (OSError, ValueError) as exc:  # noted in the job's log by the spawn
        # ValueError: a NUL in a path, say. One job's start fails; our loop serves on.
        path = runreport.begin_run(spec, line)
        if path is not None:
            runreport.start_failed(spec, f"cannot start: {jobexec.in_words(exc)}", path)
        return None
    pidfd = os.pidfd_open(pid)
    if runreport.begin_run(spec, line, (pid, runfile.read_proc_stat(pid).start_ticks)) is None:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(pidfd)
        return None
    return Supervised(spec, pid, pidfd)
