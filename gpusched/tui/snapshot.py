"""Where `gpusched top`'s snapshots come from: the daemon, or the GPU backend, plus the host."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import psutil

from gpusched.client.connection import Client
from gpusched.core.config import load_settings
from gpusched.core.errors import ConfigError, DaemonUnavailable, GpuschedError
from gpusched.core.models import Inventory, inventory_from_dict
from gpusched.proc import runfile
from gpusched.tui.model import DaemonInfo, HostInfo, ProcHost, Snapshot, TopJob

DAEMON_TIMEOUT_S = 5.0  # a hung daemon must not freeze the screen for longer
FIRST_CPU_SAMPLE_S = 0.1  # the host's CPU % needs two readings; the first frame waits this
NO_DAEMON_BANNER = "gpusched daemon is not running: GPUs read straight from the backend, no queue"


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def process_usage(pid: int, boot_time: float) -> tuple[float, int, float] | None:
    """(CPU seconds, RSS bytes, start time) of a process from one read of /proc/PID/stat;
    None if it is gone. psutil reads two files in ~100 µs a process, and top looks at
    every GPU process every second: this is a quarter of that."""
    try:
        stat = runfile.read_proc_stat(pid)
    except (OSError, ValueError, IndexError):
        return None
    return (
        (stat.utime_ticks + stat.stime_ticks) / _CLOCK_TICKS,
        stat.rss_pages * _PAGE_BYTES,
        boot_time + stat.start_ticks / _CLOCK_TICKS,
    )


class HostSampler:
    """Host CPU, memory and load, and per-process CPU/RSS, each measured since the last frame."""

    def __init__(self) -> None:
        self.hostname = socket.gethostname()
        self._boot_time = psutil.boot_time()
        # pid -> (start time, CPU seconds, monotonic time) at the previous frame.
        self._cpu: dict[int, tuple[float, float, float]] = {}
        self._is_first = True

    def host(self) -> HostInfo:
        memory = psutil.virtual_memory()
        try:
            load = os.getloadavg()
        except OSError:
            load = None
        # The first reading has no previous one to measure from: take a short one (--once).
        cpu_pct = psutil.cpu_percent(FIRST_CPU_SAMPLE_S if self._is_first else None)
        self._is_first = False
        return HostInfo(
            hostname=self.hostname,
            cpu_pct=cpu_pct,
            mem_used_bytes=memory.total - memory.available,
            mem_total_bytes=memory.total,
            load_avg=load,
        )

    def processes(self, pids: set[int]) -> dict[int, ProcHost]:
        seen = {pid: self._process(pid) for pid in pids}
        self._cpu = {pid: v for pid, v in self._cpu.items() if pid in pids}
        return seen

    def _process(self, pid: int) -> ProcHost:
        stat = process_usage(pid, self._boot_time)
        if stat is None:
            return ProcHost()
        cpu_s, rss_bytes, started_at = stat
        at, before = time.monotonic(), self._cpu.get(pid)
        self._cpu[pid] = (started_at, cpu_s, at)
        if before is None or before[0] != started_at or at <= before[2]:
            # First sight (or a recycled pid): the average over its life, as ps shows it.
            cpu_pct = 100.0 * cpu_s / max(time.time() - started_at, 1e-3)
        else:
            cpu_pct = 100.0 * (cpu_s - before[1]) / (at - before[2])
        return ProcHost(cpu_pct=cpu_pct, rss_bytes=rss_bytes, started_at=started_at)


def _gpu_pids(inventory: Inventory) -> set[int]:
    return {p.pid for g in inventory.schedulable() for p in g.processes if p.is_visible and p.pid}


class SnapshotSource:
    """Takes snapshots from the daemon, or straight from the GPU backend when none answers."""

    def __init__(
        self, open_backend: Callable[[str, str], Any], paths: Any = None, check_daemon: bool = False
    ):
        """open_backend(simulate, processes_file): the GPU backend to read when no daemon
        answers (gpus.open_backend, passed in: the TUI never imports the GPU layer).
        check_daemon: warn on stderr when the daemon runs with other GPUs or config than
        this environment asks for (not while a live screen is up)."""
        # Without paths, the system daemon when one runs. Top only watches: never start one.
        self.client = Client(paths, autostart=False, check_daemon=check_daemon)
        self.paths = self.client.paths
        self.sampler = HostSampler()
        self._open = open_backend
        self._backend: Any = None
        self._backend_problem = ""
        # The pending jobs of the last snapshot, and the daemon's name for them: asked
        # again, the daemon sends them only if they changed.
        self._pending: tuple[TopJob, ...] = ()
        self._pending_version: str | None = None
        self._pending_counts: dict[str, int | None] = {}

    def take(self) -> Snapshot:
        try:
            # The version only once the daemon gave one: an older daemon refuses it.
            known = (
                {"pending_version": self._pending_version}
                if self._pending_version is not None
                else {}
            )
            reply = self.client.call("snapshot", timeout_s=DAEMON_TIMEOUT_S, lean=True, **known)
        except DaemonUnavailable:
            return self._from_backend(NO_DAEMON_BANNER)
        except GpuschedError as exc:
            return self._from_backend(f"the gpusched daemon did not answer: {exc.message}")
        return self._from_daemon(reply)

    def _frame(self, inventory: Inventory, **fields: Any) -> Snapshot:
        now = time.time()
        return Snapshot(
            now=now,
            inventory=inventory,
            host=self.sampler.host(),
            utc_offset_s=time.localtime(now).tm_gmtoff,
            proc_host=MappingProxyType(self.sampler.processes(_gpu_pids(inventory))),
            **fields,
        )

    def _from_daemon(self, reply: dict[str, Any]) -> Snapshot:
        status = reply["daemon"]
        return self._frame(
            inventory_from_dict(reply["inventory"]),
            daemon=DaemonInfo(status["pid"], status["uptime_s"], status["version"]),
            reserved_bytes=MappingProxyType(dict(reply.get("reserved_bytes") or {})),
            pid_jobs=MappingProxyType(
                {int(pid): job_id for pid, job_id in (reply.get("pid_jobs") or {}).items()}
            ),
            jobs=self._jobs(reply),
            gpu_reservations=tuple(
                (name, tuple(gpus), start, end)
                for name, gpus, start, end in reply.get("gpu_reservations") or ()
            ),
            **self._pending_counts,
            services=tuple(
                (
                    s["name"],
                    s["wanted"],
                    s["ready"],
                    s["requests_per_s"],
                    s["p95_ms"],
                    s["in_flight"],
                )
                for s in reply.get("services") or ()
            ),
        )

    def _jobs(self, reply: dict[str, Any]) -> tuple[TopJob, ...]:
        """The running jobs of the reply, then its pending ones, or those of the last
        snapshot when the daemon says they are the same (an older daemon never does)."""
        jobs = tuple(TopJob.from_dict(j) for j in reply.get("jobs") or ())
        if reply.get("pending_same"):
            return jobs + self._pending
        self._pending = tuple(job for job in jobs if job.state != "running")
        self._pending_version = reply.get("pending_version")
        self._pending_counts = {key: reply.get(key) for key in ("pending_total", "pending_mine")}
        return jobs

    def _from_backend(self, banner: str) -> Snapshot:
        backend = self._open_backend()
        if backend is None:
            inventory = Inventory(backend="none", problem=self._backend_problem)
        else:
            inventory = backend.read(())
        return self._frame(inventory, banner=banner)

    def _open_backend(self) -> Any:
        if self._backend is None and not self._backend_problem:
            settings = load_settings(self.paths.config_file)
            try:
                self._backend = self._open(settings.simulate, self.paths.sim_processes)
            except ConfigError as exc:
                self._backend_problem = exc.message
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
