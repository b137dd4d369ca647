"""Clean-up of the processes a test or a benchmark started: plain psutil, no pytest, so that
bench/ uses the very same code (bench/reliability/harness.py)."""

from __future__ import annotations

import psutil


def with_descendants(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = list(procs)
    for proc in procs:
        try:
            out += proc.children(recursive=True)
        except psutil.Error:
            pass
    return out


def kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


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
