"""The job supervisor: starts plain jobs itself, one loop over their exits; forks a shim for the rest.

One per daemon home, detached from the daemon (a session of its own), listening on a unix
socket in the daemon's run directory (SOCKET_NAME). The daemon connects and writes one
request per line (JSON): a job's run spec to start it, or {"op": "signal", ...} to signal
a job it started. A start is acknowledged with a line that gives the pid the daemon
watches for the run ({"started": JOB_ID, "run", "pid", "start_ticks", "supervised"}, the
run file's "shim" record); a start that fails is reported as runreport.start_failed says.
A restarted daemon connects to the same supervisor again (the socket's path is fixed), so
jobs it started keep their exit status across daemon restarts and SIGKILLs; a supervisor
with no daemon connected and no job left exits.

Its parts: the starts (proc/supervisor/starts.py: which jobs it starts itself, the spawn,
the run file), the ends (proc/supervisor/ends.py: exit records, the reports to the daemon
and the flushes of those it leaves unanswered) and the signals (proc/supervisor/signals.py:
a job's group, its orphans, the grace period's SIGKILL). This module is the loop: one
epoll set over the daemon's connections, every job's pidfd and the reports' sockets. A
turn records the ends it saw before it starts the jobs asked for: the end's report is
what sets off the daemon's next pass, so it goes out first.

If we are killed, a job runs on to its end; it then vanishes without an exit record, and
the daemon reports it lost with that reason (daemon/jobs/lostrunners.py), as it does for a
shim's job.

Run as `python -I -S proc/supervisor/main.py FD` with FD the listening socket, made by the daemon
(seam.SupervisorLink). Standard library only, like the shim it forks.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import time

if __name__ == "__main__":  # run by path with -I -S: make the package importable
    sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..", "..")))

from gpusched.proc import jobtree, runfile
from gpusched.proc.supervisor import launcher, signals
from gpusched.proc.supervisor.ends import Ends
from gpusched.proc.supervisor.starts import Supervised, has_fds_for_one_more, needs_shim, start

TYPE_CHECKING = False  # not typing: the supervisor's import chain, which forks the shim
if TYPE_CHECKING:
    from typing import Any

SOCKET_NAME = "sup.sock"  # in the daemon's run directory: short, for AF_UNIX's 107 bytes
HELLO = b"gpusched-supervisor "  # + our pid and a newline: sent to every daemon that connects
CONNECT_WAIT_S = 10.0  # a supervisor no daemon connected to in this long exits
_SHIM_REAP_EVERY_S = 1.0  # forked shims are reaped at least this often
_SO_PEERCRED = struct.Struct("3i")


class Supervisor:
    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.poll = select.epoll()
        self.poll.register(listener.fileno(), select.EPOLLIN)
        self.links: dict[int, list[Any]] = {}  # fd -> [socket, bytes not yet a whole line]
        self.jobs: dict[int, Supervised] = {}  # pidfd -> job
        self.by_pid: dict[int, Supervised] = {}
        self.shims: set[int] = set()  # pids of forked shims not reaped yet
        self.ends = Ends(self.poll)
        self.dirs: set[str] = set()  # id-range directories known to exist
        self.connected_once = False
        self.started = time.monotonic()

    # -- the loop -------------------------------------------------------------------------
    def serve(self) -> None:
        while not self._done():
            ended, asking = [], []
            for fd, _ in self.poll.poll(self._timeout_s()):
                if fd == self.listener.fileno():
                    self._accept()
                elif fd in self.links:
                    asking.append(fd)
                elif fd in self.jobs:
                    ended.append(self.jobs[fd])
                elif fd in self.ends.reports:
                    self.ends.answered(fd)
            if ended:  # first: each report sets off the daemon's pass, which starts the next
                self._end(ended)
            for fd in asking:
                self._read(fd)
            self.ends.flush_unanswered()
            signals.kill_overdue(self.by_pid, self.shims)
            self._reap_others()

    def _done(self) -> bool:
        """No daemon and no job of ours left: nothing to do. A daemon that connected just
        now (waiting in the backlog) keeps us going."""
        if self.links or self.by_pid or self.ends.reports:
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
        due = [
            when
            for when in (signals.next_kill_at(self.by_pid), self.ends.next_flush_at())
            if when is not None
        ]
        if due:
            return max(0.0, min(due) - time.monotonic())
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
        uid = _SO_PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _SO_PEERCRED.size)
        )[1]
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
            self._request(line, link[0])

    def _request(self, line: bytes, link: socket.socket) -> None:
        try:
            request = json.loads(line)
        except ValueError:
            return  # not from a daemon of ours
        if not isinstance(request, dict):
            return
        if request.get("op") == "signal":
            signals.signal_job(self.by_pid, self.shims, int(request["pid"]), int(request["signal"]))
        elif "job_id" in request:
            self._acknowledge(link, request, self._launch(request, line))

    # -- starts and ends ------------------------------------------------------------------
    def _launch(self, spec: dict[str, Any], line: bytes) -> tuple[int, bool] | None:
        """Start the job, or fork its shim: (the pid the daemon watches, whether that is the
        job's own), or None if it did not start (the daemon is told why otherwise)."""
        # Each job we watch holds a pidfd: past our descriptor limit, a shim watches it.
        if needs_shim(spec) or not has_fds_for_one_more(len(self.jobs) + len(self.ends.reports)):
            pid = launcher.fork_shim(spec, line)
            self.shims.add(pid)
            return pid, False
        job = start(spec, line, self.dirs)
        if job is None:
            return None
        self.jobs[job.pidfd] = self.by_pid[job.pid] = job
        self.poll.register(job.pidfd, select.EPOLLIN)
        return job.pid, True

    @staticmethod
    def _acknowledge(
        link: socket.socket, spec: dict[str, Any], started: tuple[int, bool] | None
    ) -> None:
        """Tell the daemon the pid it watches for the run, as the run file will: it need not
        read the file for it. Never waits: a daemon that does not read these (one of a
        version before them) has the run file, and a full socket only loses the news."""
        if started is None:
            return
        pid, supervised = started
        try:
            ack = {
                "started": spec["job_id"],
                "run": spec.get("run"),
                "pid": pid,
                "start_ticks": runfile.read_proc_stat(pid).start_ticks,
                "supervised": supervised,
            }
            link.send((json.dumps(ack) + "\n").encode(), socket.MSG_DONTWAIT)
        except OSError:
            pass

    def _end(self, ended: list[Supervised]) -> None:
        """Record the ends of one turn (proc/supervisor/ends.py), kill what the jobs left,
        then reap them: until its record is written, an ended job stays a zombie, which the
        daemon counts as running."""
        done = self.ends.record(ended)
        signals.signal_orphans(done, signal.SIGKILL, self.by_pid, self.shims)
        for job in done:
            os.close(job.pidfd)  # which takes it out of the epoll set
            del self.jobs[job.pidfd], self.by_pid[job.pid]
            try:
                os.waitpid(job.pid, 0)
            except ChildProcessError:
                pass

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
