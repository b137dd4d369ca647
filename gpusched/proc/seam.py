"""The daemon's hands on processes: launch shims, find, signal and measure them, hold ports.

Every call the daemon makes on the processes outside it goes through one ProcessSeam,
which the daemon is given: tests hand it a fake (tests/inproc.py) and drive the
daemon's decisions without a real shim.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterable

import psutil

from gpusched.core.models import Job
from gpusched.proc import jobtree, leftovers, privileges, runfile, shim

LAUNCHER_PATH = str(Path(shim.__file__).with_name("launcher.py"))


def read_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class ShimLauncher:
    """The daemon's handle on the shim launcher (gpusched/proc/launcher.py), restarted if it dies."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        # A clean, fixed environment: the launcher and the shims it forks may run as root,
        # and a user's environment reaches only the job, after any privilege drop.
        return subprocess.Popen(
            [sys.executable, "-I", "-S", LAUNCHER_PATH], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            close_fds=True, env={"PATH": os.defpath}, bufsize=0)

    def launch(self, spec: dict) -> None:
        """Have a shim forked for the job, without waiting for it: the shim records its
        pid in the job's run file (see runfile.read_run)."""
        line = (json.dumps(spec) + "\n").encode()  # JSON has no raw newline: one line
        for _attempt in (1, 2):
            if self._proc is None or self._proc.poll() is not None:
                self.close()
                self._proc = self._start()
            try:
                self._proc.stdin.write(line)
                return
            except OSError:
                self.close()  # it died between jobs: start a new one and try once more
        raise OSError("the shim launcher does not take requests")

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass  # a launcher that died left a broken pipe
            self._proc.wait()
            self._proc = None


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
    """The real processes: psutil and /proc for looking, the shim launcher for starting."""

    def __init__(self) -> None:
        # Read once: a boot id changes only with a reboot, which ends this process too.
        self.boot_id = read_boot_id()
        self._launcher = ShimLauncher()
        self._port_holds: dict[int, socket.socket] = {}  # job id -> what keeps its MASTER_PORT

    def launch(self, spec: dict) -> None:
        """Start a job's shim (see ShimLauncher.launch); OSError if it cannot be asked to."""
        self._launcher.launch(spec)

    def close(self) -> None:
        """Let the launcher go; running shims are in sessions of their own: unaffected."""
        self._launcher.close()

    # -- a job's shim ---------------------------------------------------------------------
    def _shim_process(self, job: Job) -> psutil.Process | None:
        """The job's shim if it is still that very process (same pid, start time and boot)."""
        if not job.shim_pid or job.boot_id != self.boot_id:
            return None
        try:
            proc = psutil.Process(job.shim_pid)
            if abs(proc.create_time() - (job.shim_start_time or 0)) > 0.05:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.Error:
            return None

    def is_alive(self, job: Job) -> bool:
        return self._shim_process(job) is not None

    def signal_job(self, job: Job, signum: int = signal.SIGTERM) -> bool:
        """Send a signal through the shim, which passes it to the job's process group."""
        proc = self._shim_process(job)
        if proc is None:
            return False
        try:
            proc.send_signal(signum)
        except psutil.Error:
            return False
        return True

    def warn_job(self, job: Job, signum: int) -> bool:
        """Send the job's warning signal as Slurm's --signal does (jobtree.deliver_warning:
        its children, or with B: its main process), not through the shim to the group."""
        proc = self._shim_process(job)
        if proc is None:
            return False
        return jobtree.deliver_warning(proc.pid, signum, job.warn_batch)

    def tree_rss_bytes(self, job: Job) -> int | None:
        """Resident memory of the job's processes (not the shim's), or None if it is gone."""
        proc = self._shim_process(job)
        if proc is None:
            return None
        total = 0
        try:
            children = proc.children(recursive=True)
        except psutil.Error:
            return None
        for child in children:
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass  # exited between the listing and the reading
        return total

    def kill_job_now(self, job: Job) -> None:
        """SIGKILL every process under the shim (not the shim, which records the death)."""
        proc = self._shim_process(job)
        if proc is None:
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

    @staticmethod
    def identify_shim(pid: int, ticks: int) -> tuple[int, float]:
        """(pid, start time) of a shim from its "shim" record: the start time is the
        process's own (as is_alive compares it) while that process is the shim, and 0.0,
        which no process matches, once it has ended or its pid went to another process."""
        try:
            if runfile.read_proc_stat(pid).start_ticks == ticks:
                return pid, psutil.Process(pid).create_time()
        except (OSError, ValueError, IndexError, psutil.Error):
            pass
        return pid, 0.0

    @staticmethod
    def pid_owners(running: Iterable[Job]) -> dict[int, int]:
        """pid -> job id for every process under a running job's shim (one scan of /proc)."""
        owners = {job.shim_pid: job.id for job in running if job.shim_pid}
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
    def remove_container(spec: dict) -> None:
        """Remove a lost job's container (proc/containerrun.py), off the loop: a runtime
        may take seconds."""
        from gpusched.proc import containerrun

        threading.Thread(target=containerrun.remove, args=(spec,), daemon=True,
                         name=f"remove {spec['container_remove']['name']}").start()

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
