"""The job supervisor's ends: exit records appended, reported, flushed when unanswered.

One loop turn takes every exit that turn saw, appends each exit record to its run file
(runfile.append_exit, the shim's format) and only then are the jobs reaped: until its
record is written, an ended job is a zombie the daemon still counts as running
(seam.ProcessSeam.is_alive). Each end wakes the daemon as a shim's does, from an address
named for the run (runreport.notify_daemon), and the daemon answers once the end is committed
to its queue (daemon/jobs/endacks.py); a record left unanswered for a second is flushed to
disk then (all of a turn's in one pass). Flushing every record before the wake-up, as
measured, cost each job a second disk flush on the path from one job's end to the next
one's start (the daemon's commit is the first), about twice the time between them; the
queue holds the end durably either way. Standard library only (proc/supervisor/main.py).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import time

from gpusched.proc import runfile, runreport
from gpusched.proc.supervisor.signals import killpg

TYPE_CHECKING = False  # not typing: the supervisor's import chain, which forks the shim
if TYPE_CHECKING:
    from gpusched.proc.supervisor.starts import Supervised


class Ends:
    """The records of ended jobs, and the reports awaiting the daemon's word."""

    def __init__(self, poll: select.epoll):
        self.poll = poll  # the supervisor's: a report's socket is watched for the answer
        # Ends reported, the daemon's answer awaited: fd -> (socket, run file, the daemon's
        # wake path, when to flush the record unanswered)
        self.reports: dict[int, tuple[socket.socket, str, str, float]] = {}

    def record(self, ended: list[Supervised]) -> list[Supervised]:
        """Append and report the exit records of these jobs (Supervised) whose pidfd said
        they ended; those that did (to be reaped once what they left is killed)."""
        flush: list[str] = []
        done: list[Supervised] = []
        for job in ended:
            try:
                status = os.waitid(os.P_PIDFD, job.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                status = None  # reaped already (cannot happen: only we reap it)
            if status is not None and status.si_pid == 0:
                continue  # not ended after all
            done.append(job)
            code, signum = _exit_of(status)
            killpg(job.pid, signal.SIGKILL)  # leftovers in its group hold GPU memory
            try:
                runfile.append_exit(
                    job.run_file, runfile.ExitRecord(code, signum, time.time()), job.run
                )
            except OSError:
                pass  # no record: the daemon reports the job lost
            else:
                self._report(job, flush)
        runreport.make_durable(flush)
        return done

    def _report(self, job: Supervised, flush: list[str]) -> None:
        """Wake the daemon as a shim does (runreport.notify_daemon: from an address named for the
        run), and wait, in the loop, for its word that the end is stored: only then may the
        record stay unflushed. Without one (flush), it is flushed now."""
        sock = runreport.notify_daemon({"run": job.run, "wake": job.wake})
        if sock is None:
            flush.append(job.run_file)
            return
        self.reports[sock.fileno()] = (
            sock,
            job.run_file,
            job.wake,
            time.monotonic() + runreport.STORED_WAIT_S,
        )
        self.poll.register(sock.fileno(), select.EPOLLIN)

    def answered(self, fd: int) -> None:
        sock, _, wake, _ = self.reports[fd]
        try:
            message, sender = sock.recvfrom(64)
        except OSError:
            return
        if message == runfile.STORED and sender == wake:
            self._drop(fd)

    def flush_unanswered(self) -> None:
        """Flush the records whose end no daemon said it stored in time (none runs, or it
        cannot write its queue): they are then the only record of the end."""
        now = time.monotonic()
        late = [fd for fd, report in self.reports.items() if report[3] <= now]
        runreport.make_durable([self.reports[fd][1] for fd in late])
        for fd in late:
            self._drop(fd)

    def next_flush_at(self) -> float | None:
        """When the next unanswered record is due to be flushed (monotonic), if any waits."""
        return min((report[3] for report in self.reports.values()), default=None)

    def _drop(self, fd: int) -> None:
        self.poll.unregister(fd)
        self.reports.pop(fd)[0].close()


def _exit_of(status: os.waitid_result | None) -> tuple[int | None, int | None]:
    """(exit code, signal) of a waitid result."""
    if status is None:
        return None, None
    if status.si_code == os.CLD_EXITED:
        return status.si_status, None
    return None, status.si_status
