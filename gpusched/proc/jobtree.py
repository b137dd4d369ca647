"""The job's process tree, as its shim sees it: orphans adopted (child subreaper), signals
passed on to the whole tree, leftovers killed when the job ends, the job's exit status.

Standard library only, like the shim (gpusched/proc/shim.py), which runs it for every job.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from gpusched.proc import runfile

TYPE_CHECKING = False  # not typing: in the shim's import chain (tests/test_boundaries.py)
if TYPE_CHECKING:
    from collections.abc import Callable

PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def _find_prctl() -> Callable[..., int] | None:
    """The C function, or None."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once, in the launcher, rather than in every shim it forks (most of a
# millisecond each: the lookup writes to pages the fork shares).
_prctl = _find_prctl()


def become_subreaper() -> None:
    """Make the job's orphans our children. Some launchers (torchrun among them) start
    their workers in sessions of their own, out of reach of the job's process group; as
    a child subreaper the shim still finds them to signal, and to kill when the job ends."""
    if _prctl is not None:  # not Linux: the process group alone is signalled
        _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children_by_parent() -> dict[int, list[int]]:
    """Each process's children, from one pass over /proc (only on signals and at the end)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = runfile.read_proc_stat(name).ppid
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(name))
    return children


def descendants(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below `root`."""
    children = _children_by_parent() if children is None else children
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def warning_targets(shim_pid: int, batch_only: bool) -> list[int]:
    """Who gets a job's warning signal (--signal; the one path for any signal that warns a
    job, checkpoint signals included), as Slurm's --signal: with B: the main process alone
    (Slurm's batch shell); without, every process below it (Slurm's steps), or the main
    process itself when it has none (a program run directly, or one that `sh -c` exec'd).
    So the default never kills a shell that runs the program, which a shell without a trap
    would do. The main process is the shim's first child; others are orphans it adopted."""
    children = _children_by_parent()
    started = []
    for pid in children.get(shim_pid, ()):
        try:
            started.append((runfile.read_proc_stat(str(pid)).start_ticks, pid))
        except OSError:
            continue  # gone since the scan
    if not started:
        return []
    main_pid = min(started)[1]
    if batch_only:
        return [main_pid]
    below = [pid for pid in descendants(shim_pid, children) if pid != main_pid]
    return below or [main_pid]


def targets_below(main_pid: int, batch_only: bool) -> list[int]:
    """warning_targets of a job with no shim above it (the supervisor's: proc/supervisor/main.py),
    its main process known: the processes below it (its orphans, adopted by the supervisor,
    are not looked for here), or with B: the main process alone."""
    if batch_only:
        return [main_pid]
    return descendants(main_pid) or [main_pid]


def deliver_warning(shim_pid: int, signum: int, batch_only: bool) -> bool:
    """Send a job's warning signal to warning_targets(); whether any process got it."""
    return _send_each(warning_targets(shim_pid, batch_only), signum)


def deliver_warning_below(main_pid: int, signum: int, batch_only: bool) -> bool:
    """deliver_warning for a job whose main process is known (targets_below)."""
    return _send_each(targets_below(main_pid, batch_only), signum)


def _send_each(pids: list[int], signum: int) -> bool:
    sent = False
    for pid in pids:
        try:
            os.kill(pid, signum)
            sent = True
        except ProcessLookupError:
            pass
    return sent


class Forwarder:
    """Passes signals on to the job's process group and to any of its processes that left
    it; SIGTERM arms a SIGKILL of all of them after the grace period.

    group_only (a container job): to the group only, the container runtime's client,
    which passes them on itself; signalled at once as well, the container's processes and
    its monitor end in a race that leaves the client waiting forever."""

    def __init__(self, pgid: int, grace_s: float, group_only: bool = False):
        self.pgid, self.grace_s, self.group_only = pgid, grace_s, group_only

    def send(self, signum: int, everyone: bool = False) -> None:
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass
        if self.group_only and not everyone:
            return
        for pid in descendants(os.getpid()):
            try:
                if os.getpgid(pid) != self.pgid:  # the group has it already
                    os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def __call__(self, signum: int, _frame: object) -> None:
        self.send(signum)
        # The grace counts from the first SIGTERM, as the supervisor's does: a cancel
        # repeated, or sent again after a time limit's, never puts the SIGKILL off.
        if signum == signal.SIGTERM and not signal.getitimer(signal.ITIMER_REAL)[0]:
            signal.setitimer(signal.ITIMER_REAL, max(self.grace_s, 0.001))

    def kill(self, _signum: int = 0, _frame: object = None) -> None:
        self.send(signal.SIGKILL)


def has_children() -> bool:
    """Whether processes are left under the shim (reaping any that have exited)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def end_leftovers(forward: Forwarder) -> None:
    """Leftovers of a finished job would hold GPU memory nobody accounts for: kill them."""
    try:
        os.killpg(forward.pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10.0  # a process stuck in the kernel must not hold us
    if has_children():  # orphans outside the group (the common case has none: no /proc scan)
        forward.send(signal.SIGKILL, everyone=True)
        while has_children() and time.monotonic() < deadline:
            time.sleep(0.01)


def wait_for(pid: int, reap_others: bool = False) -> tuple[int | None, int | None]:
    """(exit code, signal) of the job. reap_others (a container job): reap the orphans we
    adopt meanwhile too; podman takes its container monitor (conmon, our orphan) for alive
    while it is an unreaped zombie, and would wait for it forever."""
    while True:
        try:
            ended, status = os.waitpid(-1 if reap_others else pid, 0)
        except ChildProcessError:
            return None, None
        if ended != pid:
            continue
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status), None
        if os.WIFSIGNALED(status):
            return None, os.WTERMSIG(status)
