"""The per-job parent: owns the job's session and logs, forwards signals, writes the exit record.

Forked by the job supervisor (gpusched/proc/supervisor/main.py, through launcher.py) in a new
session, so that it outlives the daemon, for a job that needs one (supervisor/starts.py, needs_shim:
system mode, a cgroup, a container, a capped log); the supervisor starts other jobs itself,
with this module's spawn (_spawn_as_ourselves). `python -I -S shim.py RUN_FILE` runs a job
again by hand, from its run file. It imports only the standard library and stdlib-only
modules of ours (runfile, the formats it writes; jobexec; jobtree, the job's processes;
logcap for a capped log; and in system mode privileges).
"""

from __future__ import annotations

# The signal module's Python wrappers turn every signal number into an enum member; in a
# freshly forked shim that machinery costs about 0.35 ms of copy-on-write page faults, for
# every job. Its C core takes and returns plain numbers.
import _signal
import os
import signal
import socket
import sys
import time

if __name__ == "__main__":  # run by path with -I -S: make the package importable
    sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..")))

from gpusched.proc import jobexec, jobtree, runfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from gpusched.proc.logcap import Handoff
    from gpusched.proc.privileges import Identity

# Signals a user (or the daemon) may send to the shim that belong to the job instead.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
)


def make_durable(path: str) -> None:
    """fsync a file and its directory, so that it and its name survive a power cut."""
    for name in (path, os.path.dirname(path) or "."):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _open_log(path: str) -> int:
    return jobexec.open_output(path, os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)


def apply_host_limits(spec: dict[str, Any]) -> None:
    """In the job's process before exec: join its memory cgroup, pin it to its cores."""
    if spec.get("cgroup"):
        with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as procs:
            procs.write("0")  # "0" moves the writing process itself
    if spec.get("cpu_ids"):
        os.sched_setaffinity(0, spec["cpu_ids"])


def _identity(spec: dict[str, Any]) -> Identity | None:
    """System mode (the spec names a uid): who the job runs as, and its log directory.

    Runs as root, so it only reads the password and group databases and makes the
    user's directory in a root-owned parent; it never opens a user-named path.
    """
    if spec.get("run_as") is None:
        return None
    from gpusched.proc import privileges

    who = privileges.identity_of(int(spec["run_as"]))
    users = spec.get("user_logs") or ()  # the user's --output files: not root's to touch
    for log in {os.path.dirname(p) for p in (spec["stdout"], spec["stderr"]) if p not in users}:
        privileges.prepare_log_dir(log, who)
    return who


def _open_job_log(
    spec: dict[str, Any], path: str, who: Identity | None, truncate: bool = False
) -> int:
    """A log of the job: one of the user's --output/--error files (spec["user_logs"]),
    opened as the job's own programs would open it, or gpusched's own log."""
    if path in (spec.get("user_logs") or ()):
        flags = os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        return jobexec.open_output(path, flags, 0o666)
    if who is None:
        return _open_log(path)
    from gpusched.proc import privileges

    return privileges.open_log(path)


def _open_outputs(spec: dict[str, Any], who: Identity | None) -> tuple[int, int]:
    """The job's stdout and stderr logs, opened (as the user, in system mode); one file
    opened once when they are the same (`--output` without `--error`). --open-mode
    truncate empties the user's files at the job's first run only (spec["truncate"])."""
    truncate = bool(spec.get("truncate"))
    out_fd = _open_job_log(spec, spec["stdout"], who, truncate)
    if spec["stderr"] == spec["stdout"]:
        return out_fd, os.dup(out_fd)
    return out_fd, _open_job_log(spec, spec["stderr"], who, truncate)


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
        apply_host_limits(spec)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if who is not None:
            from gpusched.proc import privileges

            privileges.drop(who)
            dropped = True
        jobexec.enter_cwd(spec["cwd"])
        out_fd, err_fd = _open_outputs(spec, who)
        if handoff is not None:  # capped: the logs go to the shim, the job writes to pipes
            out_fd, err_fd = handoff.in_child(out_fd, err_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        # Found as the user, in the job's directory, on the job's own PATH.
        jobexec.start_program(
            spec["command"],
            spec["env"],
            lambda program: os.execve(program, spec["command"], spec["env"]),
        )
    except BaseException as exc:
        message = jobexec.in_words(exc)
        if dropped:  # only as the user: root never writes into a user's directory
            _note_in_log(spec, who, f"gpusched: cannot start: {message}\n")
        os.write(write_end, message.encode()[:4000])
    os._exit(127)


def _note_in_log(spec: dict[str, Any], who: Identity | None, line: str) -> None:
    try:
        fd = _open_job_log(spec, spec["stderr"], who)
    except OSError:
        return
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _spawn_as_ourselves(spec: dict[str, Any], own_session: bool = False) -> int:
    """User mode: posix_spawn the job in its own process group (own_session: leading a
    session of its own, as the supervisor starts a job it watches itself).

    Unlike fork, posix_spawn shares our memory until the exec instead of copying every
    page Python touches (a few milliseconds a job). The cwd, cgroup and CPU pinning are
    applied to the caller first and inherited: the job runs as the caller's own user here.
    """
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


def _log_cap(spec: dict[str, Any]) -> ModuleType | None:
    """The logcap module for a job whose logs are capped, or None."""
    if not spec.get("max_log_bytes"):
        return None
    from gpusched.proc import logcap  # threads: only for a job that needs them

    return logcap


def _job_outputs(spec: dict[str, Any]) -> tuple[int, int]:
    """The job's stdout and stderr: its log files, or pipes to them when they are capped."""
    cap = _log_cap(spec)
    out_fd, err_fd = _open_outputs(spec, None)
    if cap is None:
        return out_fd, err_fd
    outputs: tuple[int, int] = cap.outputs(spec, out_fd, err_fd)
    return outputs


def spawn(spec: dict[str, Any]) -> int:
    """Start the job in its own process group; start errors are raised as OSError.

    System mode forks: the child drops to the user before it touches any user path, and
    its errors come back through a pipe.
    """
    who = _identity(spec)
    if who is None:
        return _spawn_as_ourselves(spec)
    cap = _log_cap(spec)
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


# How long a shim waits for the daemon to say it stored the job's end before it makes the
# exit record durable itself. A daemon answers within its pass (milliseconds); one that
# is stopped, or cannot write its queue, never does.
STORED_WAIT_S = 1.0


def notify_daemon(spec: dict[str, Any], message: bytes = runfile.WAKE) -> socket.socket | None:
    """Best effort: wake the daemon now rather than at its next pass (half a second).

    One datagram: the daemon reads the exit record itself, so the usual message carries
    nothing and a lost one costs only that wait. The plain wake-up goes from a socket
    named for the run (runfile.end_address), returned for the daemon's answer (None if it
    could not be sent so).
    """
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        if message == runfile.WAKE and spec.get("run"):
            try:
                sock.bind(runfile.end_address(os.getpid(), spec["run"]))
            except OSError:
                pass  # not Linux, or the name is taken: a wake-up all the same
        sock.setblocking(False)
        sock.sendto(message[: runfile.WAKE_MAX_BYTES], spec["wake"])
        if sock.getsockname():
            return sock
    except OSError:
        pass
    sock.close()
    return None


def end_is_stored(sock: socket.socket, wake_path: str) -> bool:
    """Whether the daemon says, within STORED_WAIT_S, that it stored the job's end in its
    queue. Only its wake socket can send from that path (a private directory)."""
    deadline = time.monotonic() + STORED_WAIT_S
    with sock:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                message, sender = sock.recvfrom(64)
            except OSError:  # the wait ran out
                return False
            if message == runfile.STORED and sender == wake_path:
                return True
    return False


def record_exit(run_path: str, spec: dict[str, Any], record: runfile.ExitRecord) -> None:
    """Append the exit record, wake the daemon, and make the record durable unless the
    daemon says it has stored the end in its queue (synchronous) already.

    The record's own fsync (of the file and its directory) matters only while no daemon
    runs; a running one answers within milliseconds, which spares two disk flushes a job
    (and, on ext4, the directory's lock that every other job's file creations wait for).
    """
    runfile.append_exit(run_path, record, spec.get("run"))
    reply_on = notify_daemon(spec)
    if reply_on is not None and end_is_stored(reply_on, spec["wake"]):
        return
    try:
        make_durable(run_path)
    except FileNotFoundError:
        # The daemon has read the record already and cleared the file for a retry. Not a
        # failure: reported as one, it would fail the next attempt, just launched.
        pass


def _end_container(
    spec: dict[str, Any], exit_code: int | None, signum: int | None
) -> tuple[int | None, int | None]:
    from gpusched.proc import containerrun  # a container job's only

    def note(line: str) -> None:  # as ourselves only: root writes in no user's directory
        if spec.get("run_as") is None:
            _note_in_log(spec, None, line)

    return containerrun.finish(spec, exit_code, signum, note)


def run(spec: dict[str, Any], spec_line: bytes | None = None) -> int:
    """Run the job of `spec` (spec_line: the same as the launcher received it)."""
    # Hold signals until the forwarder exists, so an early cancel is never lost (the
    # launcher forks us with them blocked already).
    _signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        run_path = runfile.begin_run_file(spec, spec_line)
    except OSError as exc:
        notify_daemon(
            spec, runfile.launch_failure(spec["job_id"], f"cannot create its run file: {exc}")
        )
        return 1
    jobtree.become_subreaper()
    try:
        pid = spawn(spec)
    except OSError as exc:  # the child noted it in the job's log, as the job's user
        why = f"cannot start: {jobexec.in_words(exc)}"
        record_exit(run_path, spec, runfile.ExitRecord(127, None, time.time(), why))
        return 0
    cap = _log_cap(spec)
    if cap is not None:
        cap.start()  # copying the job's output, now that nothing forks any more
    forward = jobtree.Forwarder(
        pid,
        float(spec.get("grace_s", 10.0)),  # the job leads its group
        "container_remove" in spec,
    )
    for sig in FORWARDED:
        _signal.signal(sig, forward)
    _signal.signal(signal.SIGALRM, forward.kill)
    _signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    exit_code, signum = jobtree.wait_for(pid, forward.group_only)
    if spec.get("container_remove"):  # before leftovers: the runtime stops its own processes
        exit_code, signum = _end_container(spec, exit_code, signum)
    jobtree.end_leftovers(forward)
    if cap is not None:
        cap.finish()  # the last of the output in the logs before the end is recorded
    record_exit(run_path, spec, runfile.ExitRecord(exit_code, signum, time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(run(runfile.read_spec(sys.argv[1])))
