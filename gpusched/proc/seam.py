"""The daemon's hands on processes: start jobs, find, signal and measure them, hold ports.

Every call the daemon makes on the processes outside it goes through one ProcessSeam,
which the daemon is given: tests hand it a fake (tests/inproc.py) and drive the
daemon's decisions without a real shim.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from gpusched.core.models import Job
from gpusched.proc import containerrun, jobtree, leftovers, privileges, runfile
from gpusched.proc.supervisorclient import SUPERVISOR_PATH, SupervisorLink, supervisor_socket


def read_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


_SUPERVISED_KEPT = 1024  # pids of supervised jobs kept before the gone ones are let go


def _is_supervisor(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return SUPERVISOR_PATH.encode() in cmdline.read()
    except OSError:
        return False


def hold_port(port: int) -> socket.socket:
    """A bound socket that keeps the port from other binds without SO_REUSEADDR; raises
    OSError (EADDRINUSE) when something else has the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("0.0.0.0", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    except OSError:
        sock.close()
        raise
    return sock


class ProcessSeam:
    """The real processes: psutil and /proc for looking, the job supervisor for starting.

    A job's watched process (job.runner_pid, its runner) is its shim, or for a job the supervisor started
    without one (a "supervised" shim record), the job's own process, leader of its session
    and process group: signals for it go through the supervisor (the grace period's
    SIGKILL), its memory counts the process itself."""

    def __init__(self, supervisor_socket: str | None = None) -> None:
        # Read once: a boot id changes only with a reboot, which ends this process too.
        self.boot_id = read_boot_id()
        self._supervisor = SupervisorLink(supervisor_socket)
        self._supervised: set[int] = set()  # pids of watched processes that are jobs
        self._prune_at = _SUPERVISED_KEPT
        self._port_holds: dict[int, socket.socket] = {}  # job id -> what keeps its MASTER_PORT

    def launch(self, spec: dict[str, Any]) -> None:
        """Have the supervisor start the job, or fork its shim, without waiting for it: the
        pid comes back in its acknowledgement (started), and is in the job's run file (see
        runfile.read_run). OSError if it cannot be asked to."""
        if self._supervisor.path is None:  # beside the wake socket, in the run directory
            self._supervisor.path = supervisor_socket(os.path.dirname(spec["wake"]))
        self._supervisor.send(spec)

    def started(self) -> dict[str, runfile.ShimRecord]:
        """Run token -> the process to watch for it, as the supervisor acknowledged the
        starts since the last call (the run file says the same, a moment later)."""
        found = {}
        for ack in self._supervisor.started():
            try:
                record = runfile.ShimRecord(
                    int(ack["pid"]), int(ack["start_ticks"]), bool(ack.get("supervised"))
                )
            except (KeyError, TypeError, ValueError):
                continue
            found[str(ack.get("run"))] = record
        return found

    def close(self) -> None:
        """Let the supervisor go; it runs on while jobs it started do (see supervisor/main.py)."""
        self._supervisor.close()

    # -- a job's runner -------------------------------------------------------------------
    def _runner_process(self, job: Job) -> psutil.Process | None:
        """The job's runner (its shim, or the supervised job itself) if it is still that
        very process (same pid, start time and boot).
        A supervised job that has ended but is not reaped yet counts while its supervisor
        lives: the supervisor records its exit first."""
        if not job.runner_pid or job.boot_id != self.boot_id:
            return None
        try:
            proc = psutil.Process(job.runner_pid)
            if abs(proc.create_time() - (job.runner_start_time or 0)) > 0.05:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE and not self._awaits_record(proc):
                return None
            return proc
        except psutil.Error:
            return None

    def _awaits_record(self, proc: psutil.Process) -> bool:
        """Whether an ended supervised job's parent is its supervisor, about to record it."""
        return proc.pid in self._supervised and self._supervisor_watches(proc)

    @staticmethod
    def _supervisor_watches(proc: psutil.Process) -> bool:
        """Whether the job's parent is still a supervisor: if the supervisor was killed, no
        exit record will come, and the job is lost as a shim's is (daemon/jobs/lostrunners.py)."""
        try:
            return _is_supervisor(proc.ppid())
        except psutil.Error:
            return False

    def is_alive(self, job: Job) -> bool:
        proc = self._runner_process(job)
        if proc is not None and job.runner_pid in self._supervised:
            return self._supervisor_watches(proc)
        return proc is not None

    def signal_job(self, job: Job, signum: int = signal.SIGTERM) -> bool:
        """Send a signal through the shim, which passes it to the job's process group; for
        a supervised job, through the supervisor, which does as a shim does (or, with no
        supervisor left, to the group directly)."""
        proc = self._runner_process(job)
        if proc is None:
            return False
        if job.runner_pid in self._supervised:
            return self._signal_supervised(proc.pid, signum)
        try:
            proc.send_signal(signum)
        except psutil.Error:
            return False
        return True

    def _signal_supervised(self, pid: int, signum: int) -> bool:
        try:
            if self._supervisor.send(
                {"op": "signal", "pid": pid, "signal": int(signum)}, start=False
            ):
                return True
        except OSError:
            pass
        try:
            os.killpg(pid, signum)
        except OSError:
            return False
        return True

    def warn_job(self, job: Job, signum: int) -> bool:
        """Send the job's warning signal as Slurm's --signal does (jobtree.deliver_warning:
        its children, or with B: its main process), not through the shim to the group."""
        proc = self._runner_process(job)
        if proc is None:
            return False
        if job.runner_pid in self._supervised:
            return jobtree.deliver_warning_below(proc.pid, signum, job.warn_batch)
        return jobtree.deliver_warning(proc.pid, signum, job.warn_batch)

    def tree_rss_bytes(self, job: Job) -> int | None:
        """Resident memory of the job's processes (not the shim's), or None if it is gone."""
        proc = self._runner_process(job)
        if proc is None:
            return None
        total = 0
        try:
            children = proc.children(recursive=True)
        except psutil.Error:
            return None
        if job.runner_pid in self._supervised:
            children.append(proc)  # the job's own process: no shim above it
        for child in children:
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass  # exited between the listing and the reading
        return total

    def kill_job_now(self, job: Job) -> None:
        """SIGKILL every process under the shim (not the shim, which records the death); a
        supervised job's group, and what it left, through its supervisor."""
        proc = self._runner_process(job)
        if proc is None:
            return
        if job.runner_pid in self._supervised:
            self._signal_supervised(proc.pid, signal.SIGKILL)
            return
        try:
            children = proc.children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass

    # -- a job whose shim died ------------------------------------------------------------
    @staticmethod
    def job_processes(marks: leftovers.JobMarks) -> dict[int, int]:
        """pid -> start ticks of the job's live processes, found without its shim."""
        return leftovers.find(marks)

    @staticmethod
    def signal_processes(found: dict[int, int], signum: int) -> None:
        """Signal job_processes' result, skipping any pid that went to another process."""
        leftovers.signal_all(found, signum)

    def identify_shim(self, pid: int, ticks: int, supervised: bool = False) -> tuple[int, float]:
        """(pid, start time) of a shim from its "shim" record: the start time is the
        process's own (as is_alive compares it) while that process is the shim, and 0.0,
        which no process matches, once it has ended or its pid went to another process.
        supervised: the record's process is the job itself (runfile.ShimRecord)."""
        try:
            if runfile.read_proc_stat(pid).start_ticks == ticks:
                if supervised:
                    self._note_supervised(pid)
                return pid, psutil.Process(pid).create_time()
        except (OSError, ValueError, IndexError, psutil.Error):
            pass
        return pid, 0.0

    def _note_supervised(self, pid: int) -> None:
        """Keep the pid of a supervised job; those of processes gone are let go now and
        then (a job's end is read from its run file, never told to the seam)."""
        if len(self._supervised) >= self._prune_at:
            self._supervised = {p for p in self._supervised if os.path.exists(f"/proc/{p}")}
            self._prune_at = max(_SUPERVISED_KEPT, 2 * len(self._supervised))
        self._supervised.add(pid)

    @staticmethod
    def pid_owners(running: Iterable[Job]) -> dict[int, int]:
        """pid -> job id for every process under a running job's shim (one scan of /proc)."""
        owners = {job.runner_pid: job.id for job in running if job.runner_pid}
        children: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"]):
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
        stack = list(owners)
        while stack:
            parent = stack.pop()
            for child in children.get(parent, ()):
                if child not in owners:
                    owners[child] = owners[parent]
                    stack.append(child)
        return owners

    @staticmethod
    def remove_container(spec: dict[str, Any]) -> None:
        """Remove a lost job's container (proc/containerrun.py), off the loop: a runtime
        may take seconds."""
        threading.Thread(
            target=containerrun.remove,
            args=(spec,),
            daemon=True,
            name=f"remove {spec['container_remove']['name']}",
        ).start()

    @staticmethod
    def append_to_log(path: str, line: str, uid: int) -> None:
        """A note from gpusched in the job's log, where its owner will look. The daemon
        may be root and the log a user's (its --output file, anywhere): only a regular
        file of the job's user (uid), with one link, never through a link nor a FIFO."""
        fd = privileges.open_owned(path, os.O_WRONLY | os.O_APPEND, uid)
        if fd is None:
            return
        try:
            if os.fstat(fd).st_nlink == 1:
                os.write(fd, f"gpusched: {line}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    # -- MASTER_PORT ----------------------------------------------------------------------
    def pick_master_port(self, job_id: int, low: int, high: int, taken: Iterable[int]) -> int:
        """The lowest port in the range that no running job has and nobody holds, kept
        for the job until release_port (unless no socket could be made).

        A port only probed free can be taken by another process (another user's gpusched
        giving out the same port) in the seconds before the job binds it: EADDRINUSE in
        its rendezvous. So the probe stays bound, not listening, with SO_REUSEADDR set
        after the bind: any later bind without SO_REUSEADDR (another daemon's probe) fails,
        while the job's own server, which sets it (torch's TCPStore does), can still listen.
        """
        taken = set(taken)
        for port in range(low, high + 1):
            if port in taken:
                continue
            try:
                self._port_holds[job_id] = hold_port(port)
                return port
            except OSError as exc:
                if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                    break  # out of descriptors, say: give the port without a hold
        else:
            port = low + (max(taken, default=low) - low + 1) % (high - low + 1)
        return port

    def hold_port(self, job_id: int, port: int) -> None:
        """Keep an adopted job's MASTER_PORT from other daemons, unless something (its
        own rendezvous, most likely) already has it."""
        if job_id in self._port_holds:
            return
        try:
            self._port_holds[job_id] = hold_port(port)
        except OSError:
            pass

    def release_port(self, job_id: int) -> None:
        hold = self._port_holds.pop(job_id, None)
        if hold is not None:
            hold.close()
