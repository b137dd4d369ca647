"""The host's cores and memory that jobs may use, and which cores a pinned job gets."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import psutil

from gpusched.core.config import Settings
from gpusched.core.models import GpuInfo
from gpusched.core.sched.queuerules import HostCapacity


@dataclass(frozen=True)
class Host:
    cpu_ids: tuple[int, ...]  # real cores jobs may be pinned to
    cpus: int  # cores counted in scheduling (host.cpus overrides the detected number)
    mem_bytes: int

    def capacity(self, max_running: int) -> HostCapacity:
        return HostCapacity(self.cpus, self.mem_bytes, max_running or None)


def detect_host(settings: Settings) -> Host:
    """Cores in the daemon's own CPU affinity (as taskset or a cgroup cpuset leave them) and
    total memory, minus the system's reserve."""
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = list(range(os.cpu_count() or 1))
    usable = affinity[settings.reserve_cpus :] or affinity[-1:]
    cpus = settings.host_cpus or len(usable)
    mem = max(psutil.virtual_memory().total - settings.reserve_mem_bytes, 0)
    return Host(tuple(usable), cpus, mem)


def near_cpus(gpus: Sequence[GpuInfo]) -> set[int]:
    """The cores nearest all of a job's GPUs (NVML's CPU affinity: their NUMA node); when
    its GPUs hang off different sockets, the cores near any of them."""
    sets = [set(g.cpu_ids) for g in gpus if g.cpu_ids]
    if not sets:
        return set()
    return set.intersection(*sets) or set.union(*sets)


def pick_cpus(
    host: Host, count: int, taken: Iterable[int], near: Collection[int] = ()
) -> tuple[int, ...]:
    """The lowest free cores for a pinned job, those `near` its GPUs first (memory traffic
    between a job's cores and GPUs then stays on one socket); when host.cpus counts more
    cores than exist (an override), pinned jobs share the real ones round the ring."""
    taken_set = set(taken)
    free = sorted((c for c in host.cpu_ids if c not in taken_set), key=lambda c: c not in near)
    if len(free) >= count:
        return tuple(free[:count])
    ring = free + [c for c in host.cpu_ids if c in taken_set]
    return tuple(ring[i % len(ring)] for i in range(count))
