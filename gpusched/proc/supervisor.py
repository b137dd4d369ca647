"""The job supervisor: starts plain jobs itself, one loop over their exits; forks a shim for the rest.

One per daemon home, detached from the daemon (a session of its own), listening on a unix
socket in the daemon's run directory (SOCKET_NAME). The daemon connects and writes one
request per line (JSON): a job's run spec to start it, or {"op": "signal", ...} to signal
a job it started. A restarted daemon connects to the same supervisor again (the socket's
path is fixed), so jobs it started keep their exit status across daemon restarts and
SIGKILLs; a supervisor with no daemon connected and no job left exits.

A plain job (needs_shim: none of system mode, cgroups, containers or capped logs) is
posix_spawned directly, leading a session of its own, its logs, environment, working
directory and CPU pinning as a shim would give them (the spawn is the shim's own code,
shim._spawn_as_ourselves). Its pid and start ticks go into its run file's "shim" record,
marked supervised: the daemon watches and measures the job's own process, and signals
it through us. Each job has a pidfd in our epoll set; one loop turn takes every exit that
turn saw, appends each exit record to its run file (runfile.append_exit, the shim's format)
and only then reaps the jobs: until its record is written, an ended job is a zombie the
daemon still counts as running (seam.ProcessSeam.is_alive). Each end wakes the daemon as a
shim's does, from an address named for the run (shim.notify_daemon), and the daemon
answers once the end is committed to its queue (daemon/endacks.py); a record left
unanswered for a second is flushed to disk then (all of a turn's in one pass). Flushing
every record before the wake-up, as measured, cost each job a second disk flush on the
path from one job's end to the next one's start (the daemon's commit is the first), about
twice the time between them; the queue holds the end durably either way.

A SIGTERM from the daemon goes to the job's process group and to any process it left
outside (we are the child subreaper of every job: orphans become ours), and arms a SIGKILL
of all of them after the job's grace period, as a shim's Forwarder does. If we are killed,
a job runs on to its end; it then vanishes without an exit record, and the daemon reports
it lost with that reason (daemon/shimloss.py), as it does for a shim's job.

Run as `python -I -S supervisor.py FD` with FD the listening socket, made by the daemon
(seam.SupervisorLink). Standard library only, like the shim it forks.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

if __name__ == "__main__":  # run by path with -I -S: make the package importable
    sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..")))

from gpusched.proc import jobenv, jobexec, jobtree, launcher, leftovers, runfile, shim  # noqa: E402

SOCKET_NAME = "sup.sock"  # in the daemon's run directory: short, for AF_UNIX's 107 bytes
HELLO = b"gpusched-supervisor "  # + our pid and a newline: sent to every daemon that connects
CONNECT_WAIT_S = 10.0  # a supervisor no daemon connected to in this long exits
_SHIM_REAP_EVERY_S = 1.0  # forked shims are reaped at least this often
_SO_PEERCRED = struct.Struct("3i")
_FDS_MAX = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # jobs keep the soft limit: not raised
if _FDS_MAX == resource.RLIM_INFINITY or _FDS_MAX <= 0:
    _FDS_MAX = 1 << 30
_FDS_SPARE = 64  # descriptors kept for links, a spawn's logs, run files


def needs_shim(spec: dict) -> bool:
    """Whether the job needs a shim of its own: a privilege drop (system mode), a cgroup to
    join, a container to remove, or logs to cap (threads that copy its output)."""
    return (spec.get("run_as") is not None or bool(spec.get("cgroup"))
            or bool(spec.get("max_log_bytes")) or "container_remove" in spec or not CAN_SUPERVISE)


# pidfds: Linux 5.3 and Python 3.9; waitid on one, Linux 5.4. Without them, a shim per job.
CAN_SUPERVISE = hasattr(os, "pidfd_open") and hasattr(os, "P_PIDFD")


class Supervised:
    """A job we started and watch: its pid (its session and group), pidfd and run."""

    __slots__ = ("pid", "pidfd", "run_file", "run", "wake", "grace_s", "token", "kill_at")

    def __init__(self, spec: dict, pid: int, pidfd: int):
        self.pid, self.pidfd = pid, pidfd
        self.run_file, self.run, self.wake = spec["run_file"], spec.get("run"), spec["wake"]
        self.grace_s = float(spec.get("grace_s", 10.0))
        self.token = spec["env"].get(jobenv.RUN_TOKEN, "")
        self.kill_at: float | None = None  # when a SIGTERM's grace runs out (monotonic)


class Supervisor:
    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.poll = select.epoll()
        self.poll.register(listener.fileno(), select.EPOLLIN)
        self.links: dict[int, list] = {}  # fd -> [socket, bytes not yet a whole line]
        self.jobs: dict[int, Supervised] = {}  # pidfd -> job
        self.by_pid: dict[int, Supervised] = {}
        self.shims: set[int] = set()  # pids of forked shims not reaped yet
        # Ends reported, the daemon's answer awaited: fd -> (socket, run file, the daemon's
        # wake path, when to flush the record unanswered)
        self.reports: dict[int, tuple] = {}
        self.dirs: set[str] = set()  # id-range directories known to exist
        self.waker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.waker.setblocking(False)
        self.connected_once = False
        self.started = time.monotonic()

    # -- the loop -------------------------------------------------------------------------
    def serve(self) -> None:
        while not self._done():
            ended = []
            for fd, _ in self.poll.poll(self._timeout_s()):
                if fd == self.listener.fileno():
                    self._accept()
                elif fd in self.links:
                    self._read(fd)
                elif fd in self.jobs:
                    ended.append(self.jobs[fd])
                elif fd in self.reports:
                    self._answered(fd)
            if ended:
                self._end(ended)
            self._flush_unanswered()
            self._kill_overdue()
            self._reap_others()

    def _done(self) -> bool:
        """No daemon and no job of ours left: nothing to do. A daemon that connected just
        now (waiting in the backlog) keeps us going."""
        if self.links or self.by_pid or self.reports:
            return False
        if not self.connected_once and time.monotonic() - self.started < CONNECT_WAIT_S:
            return False
        self.listener.setblocking(False)
        try:
            self._take(self.listener.accept()[0])
        except OSError:
            return True
        return False

    def _timeout_s(self) -> float:
        kills = [job.kill_at for job in self.by_pid.values() if job.kill_at is not None]
        kills += [report[3] for report in self.reports.values()]
        if kills:
            return max(0.0, min(kills) - time.monotonic())
        if self.shims or not self.connected_once:
            return _SHIM_REAP_EVERY_S
        return -1  # nothing is due: until a request or an exit

    # -- the daemon's requests ------------------------------------------------------------
    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        """Serve a connection of our own user only: it may start jobs as that user (root
        in system mode)."""
        uid = _SO_PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _SO_PEERCRED.size))[1]
        if uid != os.geteuid():
            conn.close()
            return
        try:
            conn.setblocking(True)
            conn.sendall(HELLO + str(os.getpid()).encode() + b"\n")
        except OSError:
            conn.close()
            return
        self.connected_once = True
        self.links[conn.fileno()] = [conn, b""]
        self.poll.register(conn.fileno(), select.EPOLLIN)

    def _read(self, fd: int) -> None:
        link = self.links[fd]
        try:
            chunk = link[0].recv(262144)
        except OSError:
            chunk = b""
        if not chunk:  # the daemon is gone: its jobs go on, their ends recorded
            self.poll.unregister(fd)
            link[0].close()
            del self.links[fd]
            return
        lines = (link[1] + chunk).split(b"\n")
        link[1] = lines.pop()
        for line in lines:
            self._request(line)

    def _request(self, line: bytes) -> None:
        try:
            request = json.loads(line)
        except ValueError:
            return  # not from a daemon of ours
        if not isinstance(request, dict):
            return
        if request.get("op") == "signal":
            self._signal(int(request["pid"]), int(request["signal"]))
        elif "job_id" in request:
            self._launch(request, line)

    # -- starts ---------------------------------------------------------------------------
    def _launch(self, spec: dict, line: bytes) -> None:
        # Each job we watch holds a pidfd: past our descriptor limit, a shim watches it.
        if needs_shim(spec) or len(self.jobs) + len(self.reports) + _FDS_SPARE >= _FDS_MAX:
            self.shims.add(launcher.fork_shim(spec, line))
            return
        directory = os.path.dirname(spec["run_file"])
        if directory not in self.dirs:  # the job's logs go beside its run file
            os.makedirs(directory, 0o700, exist_ok=True)
            self.dirs.add(directory)
        try:
            pid = _spawn(spec)
        except OSError as exc:  # noted in the job's log by the spawn
            self._failed_start(spec, line, f"cannot start: {jobexec.in_words(exc)}")
            return
        pidfd = os.pidfd_open(pid)
        try:
            runfile.begin_run_file(spec, line, (pid, runfile.read_proc_stat(pid).start_ticks))
        except OSError as exc:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(pidfd)
            shim.notify_daemon(spec, runfile.launch_failure(
                spec["job_id"], f"cannot create its run file: {exc}"))
            return
        job = Supervised(spec, pid, pidfd)
        self.jobs[pidfd] = self.by_pid[pid] = job
        self.poll.register(pidfd, select.EPOLLIN)

    def _failed_start(self, spec: dict, line: bytes, why: str) -> None:
        try:
            path = runfile.begin_run_file(spec, line)
            runfile.append_exit(path, runfile.ExitRecord(127, None, time.time(), why),
                                spec.get("run"))
            _make_durable([path])
        except OSError as exc:
            why = f"cannot create its run file: {exc}"
            shim.notify_daemon(spec, runfile.launch_failure(spec["job_id"], why))
            return
        self._wake({spec["wake"]})

    # -- signals --------------------------------------------------------------------------
    def _signal(self, pid: int, signum: int) -> None:
        """A signal for a job's process group (the daemon has checked the pid is the job's);
        for one of ours also to what it left outside the group, and a SIGTERM arms the
        SIGKILL after its grace period."""
        job = self.by_pid.get(pid)
        _killpg(pid, signum)
        if job is None:
            return
        self._signal_orphans([job], signum)
        if signum == signal.SIGTERM and job.kill_at is None:
            job.kill_at = time.monotonic() + max(job.grace_s, 0.001)

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        due = [job for job in self.by_pid.values()
               if job.kill_at is not None and job.kill_at <= now]
        for job in due:
            job.kill_at = None
            _killpg(job.pid, signal.SIGKILL)
        if due:
            self._signal_orphans(due, signal.SIGKILL)

    def _signal_orphans(self, jobs: list[Supervised], signum: int) -> None:
        """Signal the processes these jobs left outside their group that became ours (a
        launcher that starts its workers in sessions of their own), known by run token.
        Only our children count: one read of /proc, skipped when none is an orphan."""
        orphans = _children() - self.by_pid.keys() - self.shims
        if not orphans:
            return
        for job in jobs:
            entry = f"{jobenv.RUN_TOKEN}={job.token}".encode()
            for pid in orphans:
                if job.token and leftovers.carries(pid, entry, os.getuid()):
                    _killpg(pid, signum) if _leads_group(pid) else _kill(pid, signum)

    # -- ends -----------------------------------------------------------------------------
    def _end(self, ended: list[Supervised]) -> None:
        """Record the ends of one turn: every exit record appended and reported, then the
        jobs reaped (see the module's docstring)."""
        flush = []
        for job in ended:
            try:
                status = os.waitid(os.P_PIDFD, job.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                status = None  # reaped already (cannot happen: only we reap it)
            if status is not None and status.si_pid == 0:
                continue  # not ended after all
            code, signum = _exit_of(status)
            _killpg(job.pid, signal.SIGKILL)  # leftovers in its group hold GPU memory
            try:
                runfile.append_exit(job.run_file, runfile.ExitRecord(code, signum, time.time()),
                                    job.run)
            except OSError:
                pass  # no record: the daemon reports the job lost
            else:
                self._report(job, flush)
        self._signal_orphans(ended, signal.SIGKILL)
        _make_durable(flush)
        for job in ended:
            self.poll.unregister(job.pidfd)
            os.close(job.pidfd)
            del self.jobs[job.pidfd], self.by_pid[job.pid]
            try:
                os.waitpid(job.pid, 0)
            except ChildProcessError:
                pass

    def _report(self, job: Supervised, flush: list[str]) -> None:
        """Wake the daemon as a shim does (shim.notify_daemon: from an address named for the
        run), and wait, in the loop, for its word that the end is stored: only then may the
        record stay unflushed. Without one (flush), it is flushed now."""
        sock = shim.notify_daemon({"run": job.run, "wake": job.wake})
        if sock is None:
            flush.append(job.run_file)
            return
        self.reports[sock.fileno()] = (sock, job.run_file, job.wake,
                                       time.monotonic() + shim.STORED_WAIT_S)
        self.poll.register(sock.fileno(), select.EPOLLIN)

    def _answered(self, fd: int) -> None:
        sock, _, wake, _ = self.reports[fd]
        try:
            message, sender = sock.recvfrom(64)
        except OSError:
            return
        if message == runfile.STORED and sender == wake:
            self._drop_report(fd)

    def _flush_unanswered(self) -> None:
        """Flush the records whose end no daemon said it stored in time (none runs, or it
        cannot write its queue): they are then the only record of the end."""
        now = time.monotonic()
        late = [fd for fd, report in self.reports.items() if report[3] <= now]
        _make_durable([self.reports[fd][1] for fd in late])
        for fd in late:
            self._drop_report(fd)

    def _drop_report(self, fd: int) -> None:
        self.poll.unregister(fd)
        self.reports.pop(fd)[0].close()

    def _wake(self, wakes: set[str]) -> None:
        for path in wakes:
            try:
                self.waker.sendto(runfile.WAKE, path)
            except OSError:
                pass  # no daemon: its successor reads the records

    def _reap_others(self) -> None:
        """Reap forked shims and orphans that ended; a job of ours is left to _end, which
        must record its exit before it is reaped."""
        while True:
            try:
                status = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if status is None or status.si_pid == 0 or status.si_pid in self.by_pid:
                return
            try:
                os.waitpid(status.si_pid, 0)
            except ChildProcessError:
                pass
            self.shims.discard(status.si_pid)


def _spawn(spec: dict) -> int:
    """The job posix_spawned in its own session, from its working directory and pinned to
    its cores: both set on us for the spawn (inherited), then undone (a working directory
    we stayed in would keep its filesystem from being unmounted)."""
    pinned = spec.get("cpu_ids")
    before = os.sched_getaffinity(0) if pinned else None
    try:
        return shim._spawn_as_ourselves(spec, own_session=True)
    finally:
        os.chdir("/")
        if before is not None:
            os.sched_setaffinity(0, before)


def _exit_of(status) -> tuple[int | None, int | None]:
    """(exit code, signal) of a waitid result."""
    if status is None:
        return None, None
    if status.si_code == os.CLD_EXITED:
        return status.si_status, None
    return None, status.si_status


def _make_durable(paths: list[str]) -> None:
    """fsync each run file, then each of their directories once."""
    for path in paths:
        _fsync(path)
    for directory in {os.path.dirname(path) for path in paths}:
        _fsync(directory)


def _fsync(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except OSError:
        pass  # gone: nothing left to signal


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def main(listen_fd: int) -> None:
    # A forked shim copies each memory page it writes to, and a garbage collection pass
    # writes to every object: the shims allocate no cycles worth collecting.
    gc.disable()
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the daemon's terminal is for it
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.chdir("/")
    jobtree.become_subreaper()  # a job's orphans become ours: signalled, killed at its end
    Supervisor(socket.socket(fileno=listen_fd)).serve()


if __name__ == "__main__":
    main(int(sys.argv[1]))
