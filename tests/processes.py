"""Clean-up of the processes a test or a benchmark started: plain psutil, no pytest, so that
bench/ uses the very same code (bench/reliability/harness.py)."""

from __future__ import annotations

import os
import time

import psutil


def with_descendants(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = list(procs)
    for proc in procs:
        try:
            out += proc.children(recursive=True)
        except psutil.Error:
            pass
    return out


def kill_all(procs: list[psutil.Process], timeout_s: float = 10.0) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    # Not psutil.wait_procs: for a process that is not our child it waits until the pid is
    # gone, and a killed daemon or shim stays a zombie until its parent (or PID 1) reaps it.
    deadline = time.monotonic() + timeout_s
    left = list(procs)
    while left and time.monotonic() < deadline:
        left = [proc for proc in left if not is_gone(proc)]
        if left:
            time.sleep(0.01)


def is_gone(proc: int | psutil.Process) -> bool:
    """Whether a process has ended: gone, or a zombie not reaped yet (reaped here if it is
    ours). A process reaped between two looks counts as gone (pid_exists() then status()
    would race the reaper)."""
    try:
        proc = psutil.Process(proc) if isinstance(proc, int) else proc
        if proc.status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    try:
        os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True


def home_processes(home: str) -> list[psutil.Process]:
    """Every process of a gpusched home: its daemon, launcher, shims and the jobs under them
    (by the home's path on their command line or GPUSCHED_HOME in their environment)."""
    mine = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            env = proc.info["environ"] or {}
        except psutil.Error:
            continue
        if home in cmd or env.get("GPUSCHED_HOME") == home:
            mine.append(proc)
    return mine
