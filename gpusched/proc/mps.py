"""gpusched's NVIDIA MPS control daemon: started for the first job that shares a GPU, found
again after a restart by its pid file, told to quit when the daemon stops with no job left."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from typing import Any

log = logging.getLogger("gpusched.mps")
# The control daemon writes its pid here, in its pipe directory (NVIDIA's MPS docs).
PID_FILE = "nvidia-cuda-mps-control.pid"
# `-d` forks the daemon and returns; `quit` returns once it has been told.
COMMAND_TIMEOUT_S = 30.0


class MpsControl:
    """One control daemon with its own pipe and log directories, so that gpusched never
    touches an MPS setup of the machine's (/tmp/nvidia-mps). state: "off" (memory.mps is
    false), "idle" (none started yet), "running", or "unavailable" (problem says why: the
    jobs run without MPS)."""

    def __init__(self, program: str, pipe_dir: str, log_dir: str, enabled: bool, refused: str = ""):
        self.program, self.pipe_dir, self.log_dir = program, pipe_dir, log_dir
        self.state = "idle" if enabled else "off"
        self.problem, self.reused = "", False
        self.pid: int | None = None
        if enabled and refused:
            self._unavailable(refused)

    def adopt(self) -> None:
        """After a restart: a control daemon started by an earlier daemon, still running
        (its jobs may still be its clients), is used again rather than started twice."""
        pid = self._running_pid()
        if pid and self.state == "idle":
            self.state, self.pid, self.reused = "running", pid, True
            log.info(
                "MPS control daemon (pid %d) found running in %s: used again", pid, self.pipe_dir
            )
        elif pid:  # memory.mps was turned off since: not used, but not left behind either
            self.pid = pid
            log.info("MPS control daemon (pid %d) still runs; it quits with the daemon", pid)

    def pipe_for_job(self) -> str:
        """The pipe directory a sharing job connects to, starting the control daemon if
        it does not run; "" when MPS is off or cannot be had (said once, in the log)."""
        if self.state == "running" and (self.pid is None or _alive(self.pid)):
            return self.pipe_dir
        if self.state in ("off", "unavailable"):
            return ""
        return self.pipe_dir if self._start() else ""

    def stop(self, jobs_left: int) -> None:
        """At the daemon's stop: quit the control daemon unless jobs still run (they may be
        its clients; a restarted daemon uses it again)."""
        if self.state != "running" and self.pid is None:
            return
        if jobs_left:
            log.info("MPS control daemon left running for %d running jobs", jobs_left)
            return
        try:
            done = self._run([], "quit\n")
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("cannot tell the MPS control daemon to quit: %s", exc)
            return
        if done.returncode:
            log.warning("MPS control daemon: quit failed: %s", _said(done))
        else:
            log.info("MPS control daemon told to quit")
        self.pid = None
        if self.state == "running":
            self.state = "idle"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pid": self.pid,
            "reused": self.reused,
            "pipe_dir": self.pipe_dir if self.state != "off" else "",
            "problem": self.problem,
        }

    def _start(self) -> bool:
        if not self._path():
            return self._unavailable(
                f"the MPS control program '{self.program}' is not found (memory.mps_control)"
            )
        os.makedirs(self.pipe_dir, mode=0o700, exist_ok=True)
        try:
            done = self._run(["-d"], "")
        except (OSError, subprocess.SubprocessError) as exc:
            return self._unavailable(f"{self.program} -d failed: {exc}")
        if done.returncode:
            return self._unavailable(f"{self.program} -d failed: {_said(done)}")
        self.state, self.pid, self.reused = "running", self._running_pid(), False
        log.info("MPS control daemon started (pipe directory %s)", self.pipe_dir)
        return True

    def _unavailable(self, why: str) -> bool:
        self.state, self.problem = "unavailable", why
        log.warning("MPS unavailable: %s; jobs that share a GPU run without it", why)
        return False

    def _path(self) -> str | None:
        return shutil.which(self.program)

    def _run(self, args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
        """The control program, its output in a file of the log directory: with -d, the
        daemon it forks may keep its output open long after the program returns."""
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        # It serves every GPU: a job names its own by UUID, or by nvidia-smi's index.
        env.update(
            CUDA_MPS_PIPE_DIRECTORY=self.pipe_dir,
            CUDA_MPS_LOG_DIRECTORY=self.log_dir,
            CUDA_DEVICE_ORDER="PCI_BUS_ID",
        )
        os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        with open(os.path.join(self.log_dir, "gpusched-control.out"), "w+") as out:
            done = subprocess.run(
                [self._path() or self.program, *args],
                input=stdin,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                timeout=COMMAND_TIMEOUT_S,
                start_new_session=True,  # never in the daemon's process group
            )
            out.seek(0)
            done.stdout = out.read()
        return done

    def _running_pid(self) -> int | None:
        """The pid in the pipe directory's pid file, if that process runs and is the
        control program (not a process that took the pid over after a reboot)."""
        try:
            with open(os.path.join(self.pipe_dir, PID_FILE), encoding="ascii") as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError):
            return None
        return pid if os.path.basename(self.program).encode() in cmdline else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _said(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"
