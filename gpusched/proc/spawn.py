"""One job's start, for both runners: the supervisor and the per-job shim.

The job supervisor (proc/supervisor/) starts a plain job with spawn(own_session=True) and
watches it itself; a shim (proc/shim.py) starts the others with spawn() and waits for
them. Both tell the daemon what became of it through proc/runreport.py. The spawn finds the program
on the job's own PATH (jobexec), opens its log files, gives it its session or process
group and its environment, and in system mode drops to the job's user first. Standard
library only: the shim and the supervisor import it for every job.
"""

from __future__ import annotations

import os
import signal

from gpusched.proc import jobexec

TYPE_CHECKING = False  # not typing: in the shim's import chain (tests/test_boundaries.py)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from gpusched.proc.logcap import Handoff
    from gpusched.proc.privileges import Identity

# Signals a user (or the daemon) may send to a runner that belong to the job instead.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
)


# -- the start ---------------------------------------------------------------------------------
def spawn(spec: dict[str, Any], own_session: bool = False) -> int:
    """Start the job in its own process group (own_session: leading a session of its own,
    as the supervisor starts a job it watches itself); its pid. A start that fails raises
    OSError (ValueError for a NUL in a path), having noted why in the job's stderr log.

    System mode forks: the child drops to the user before it touches any user path, and
    its errors come back through a pipe.
    """
    who = identity(spec)
    if who is None:
        return _spawn_as_ourselves(spec, own_session)
    cap = log_cap(spec)
    handoff = cap.Handoff(spec) if cap is not None else None
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child: the shim is single-threaded, so fork is safe
        os.close(read_end)
        _exec_job(spec, who, write_end, handoff)
    os.close(write_end)
    if handoff is not None:
        handoff.in_parent()
    failure = b""
    while chunk := os.read(read_end, 4096):
        failure += chunk
    os.close(read_end)
    if failure:
        os.waitpid(pid, 0)
        raise jobexec.StartError(failure.decode(errors="replace"))
    return pid


def _spawn_as_ourselves(spec: dict[str, Any], own_session: bool) -> int:
    """User mode: posix_spawn the job.

    Unlike fork, posix_spawn shares our memory until the exec instead of copying every
    page Python touches (a few milliseconds a job). The cwd, cgroup and CPU pinning are
    applied to the caller first and inherited: the job runs as the caller's own user here.
    The cwd and pinning are undone after (a working directory we stayed in would keep its
    filesystem from being unmounted); a cgroup is only ever joined by a shim, for its job.
    """
    pinned = spec.get("cpu_ids")
    before = os.sched_getaffinity(0) if pinned else None
    try:
        jobexec.enter_cwd(spec["cwd"])
        apply_host_limits(spec)
        out_fd, err_fd = _job_outputs(spec)

        def spawn_program(program: str) -> int:
            group = {"setsid": True} if own_session else {"setpgroup": 0}
            return os.posix_spawn(
                program,
                spec["command"],
                spec["env"],
                **group,
                setsigmask=(),
                setsigdef=(*FORWARDED, signal.SIGCHLD),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, out_fd, 1),
                    (os.POSIX_SPAWN_DUP2, err_fd, 2),
                ],
            )

        try:  # found on the job's own PATH, from its working directory (entered above)
            return jobexec.start_program(spec["command"], spec["env"], spawn_program)
        finally:
            os.close(out_fd)
            os.close(err_fd)
    except OSError as exc:
        message = jobexec.in_words(exc)
        _note_in_log(spec, None, f"gpusched: cannot start: {message}\n")
        raise jobexec.StartError(message) from None
    finally:
        os.chdir("/")
        if before is not None:
            os.sched_setaffinity(0, before)


def _exec_job(
    spec: dict[str, Any], who: Identity | None, write_end: int, handoff: Handoff | None = None
) -> None:
    """The child: become the user (system mode), enter the cwd, open the logs, exec.

    In that order: nothing user-named is touched as root, and the user's environment
    reaches only the exec.
    """
    dropped = who is None
    try:
        os.setpgid(0, 0)
        prepare_child(spec)
        if who is not None:
            from gpusched.proc import privileges  # noqa: PLC0415 - 0.3 ms of every start: system mode's

            privileges.drop(who)
            dropped = True
        jobexec.enter_cwd(spec["cwd"])
        out_fd, err_fd = open_outputs(spec, who)
        if handoff is not None:  # capped: the logs go to the shim, the job writes to pipes
            out_fd, err_fd = handoff.in_child(out_fd, err_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        exec_program(spec)
    except BaseException as exc:
        report_start_failure(exc, spec, who, dropped, write_end)
    os._exit(127)


def prepare_child(spec: dict[str, Any]) -> None:
    """In a job's child before the exec: its host limits, and signals as a new program's."""
    apply_host_limits(spec)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def exec_program(spec: dict[str, Any]) -> None:
    """The exec: the program found as the user, in the job's directory, on its own PATH."""
    jobexec.start_program(
        spec["command"],
        spec["env"],
        lambda program: os.execve(program, spec["command"], spec["env"]),
    )


def report_start_failure(
    exc: BaseException, spec: dict[str, Any], who: Identity | None, dropped: bool, write_end: int
) -> None:
    """Why a child could not start its job: to its parent, and in the job's log once the
    child is the user (dropped): root never writes into a user's directory."""
    message = jobexec.in_words(exc)
    if dropped:
        _note_in_log(spec, who, f"gpusched: cannot start: {message}\n")
    os.write(write_end, message.encode()[:4000])


def apply_host_limits(spec: dict[str, Any]) -> None:
    """In the job's process before exec: join its memory cgroup, pin it to its cores."""
    if spec.get("cgroup"):
        with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as procs:
            procs.write("0")  # "0" moves the writing process itself
    if spec.get("cpu_ids"):
        os.sched_setaffinity(0, spec["cpu_ids"])


def identity(spec: dict[str, Any]) -> Identity | None:
    """System mode (the spec names a uid): who the job runs as, and its log directory.

    Runs as root, so it only reads the password and group databases and makes the
    user's directory in a root-owned parent; it never opens a user-named path.
    """
    if spec.get("run_as") is None:
        return None
    from gpusched.proc import privileges  # noqa: PLC0415 - 0.3 ms of every start: system mode's

    who = privileges.identity_of(int(spec["run_as"]))
    users = spec.get("user_logs") or ()  # the user's --output files: not root's to touch
    for log in {os.path.dirname(p) for p in (spec["stdout"], spec["stderr"]) if p not in users}:
        privileges.prepare_log_dir(log, who)
    return who


# -- the job's logs ----------------------------------------------------------------------------
def _open_job_log(
    spec: dict[str, Any], path: str, who: Identity | None, truncate: bool = False
) -> int:
    """A log of the job: one of the user's --output/--error files (spec["user_logs"]),
    opened as the job's own programs would open it, or gpusched's own log."""
    if path in (spec.get("user_logs") or ()):
        flags = os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        return jobexec.open_output(path, flags, 0o666)
    if who is None:
        return jobexec.open_output(path, os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    from gpusched.proc import privileges  # noqa: PLC0415 - 0.3 ms of every start: system mode's

    return privileges.open_log(path)


def open_outputs(spec: dict[str, Any], who: Identity | None) -> tuple[int, int]:
    """The job's stdout and stderr logs, opened (as the user, in system mode); one file
    opened once when they are the same (`--output` without `--error`). --open-mode
    truncate empties the user's files at the job's first run only (spec["truncate"])."""
    truncate = bool(spec.get("truncate"))
    out_fd = _open_job_log(spec, spec["stdout"], who, truncate)
    if spec["stderr"] == spec["stdout"]:
        return out_fd, os.dup(out_fd)
    return out_fd, _open_job_log(spec, spec["stderr"], who, truncate)


def _job_outputs(spec: dict[str, Any]) -> tuple[int, int]:
    """The job's stdout and stderr: its log files, or pipes to them when they are capped."""
    cap = log_cap(spec)
    out_fd, err_fd = open_outputs(spec, None)
    if cap is None:
        return out_fd, err_fd
    outputs: tuple[int, int] = cap.outputs(spec, out_fd, err_fd)
    return outputs


def log_cap(spec: dict[str, Any]) -> ModuleType | None:
    """The logcap module for a job whose logs are capped, or None."""
    if not spec.get("max_log_bytes"):
        return None
    from gpusched.proc import logcap  # noqa: PLC0415 - 1.4 ms (threading) of every start

    return logcap


def note_in_log(spec: dict[str, Any], line: str) -> None:
    """A line of gpusched's own in the job's stderr log (as ourselves: root, in system mode,
    writes in no user's directory, so there it is left out)."""
    if spec.get("run_as") is None:
        _note_in_log(spec, None, line)


def _note_in_log(spec: dict[str, Any], who: Identity | None, line: str) -> None:
    try:
        fd = _open_job_log(spec, spec["stderr"], who)
    except OSError:
        return
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
