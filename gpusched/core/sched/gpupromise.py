"""GPU memory promises, pure: which sharing jobs use more than their --gpu-mem, and the other processes' peaks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.models import GpuInfo, Inventory, Job
from gpusched.core.units import size_human

ACTIONS = ("report", "stop", "requeue")


@dataclass(frozen=True)
class Over:
    """A running job over its promise on one GPU: what it used there, and what it asked."""

    job_id: int
    gpu_label: str
    used_bytes: int
    asked_bytes: int
    is_under_floor: bool = False  # the GPU's free memory is below [memory] gpu_free_floor

    @property
    def text(self) -> str:
        return (
            f"used {size_human(self.used_bytes)} of GPU {self.gpu_label}, "
            f"asked for {size_human(self.asked_bytes)}"
        )


def _usage(inventory: Inventory, pid_jobs: Mapping[int, int]) -> dict[str, dict[int | None, int]]:
    """GPU uuid -> job id (None: a process gpusched did not start) -> memory it holds."""
    out: dict[str, dict[int | None, int]] = {}
    for gpu in inventory.schedulable():
        held = out.setdefault(gpu.uuid, {})
        for proc in gpu.processes:
            owner = pid_jobs.get(proc.pid)
            held[owner] = held.get(owner, 0) + (proc.used_mem_bytes or 0)
    return out


def over_promise(
    inventory: Inventory,
    running: Sequence[Job],
    pid_jobs: Mapping[int, int],
    margin_pct: float,
    floor_bytes: int,
) -> list[Over]:
    """The running jobs to act on, one Over each (the GPU it is furthest over on). Only a
    job that asked for --gpu-mem, on a GPU it shares, is judged: it is over once it holds
    more than its --gpu-mem plus margin_pct; or, when the GPU's free memory is below
    floor_bytes, more than its --gpu-mem at all. A job within its promise never is."""
    usage = _usage(inventory, pid_jobs)
    gpus = {gpu.uuid: gpu for gpu in inventory.schedulable()}
    placed = Counter(uuid for job in running for uuid in job.gpu_uuids)  # jobs per GPU
    found = []
    for job in running:
        asked = job.request.gpu_mem_bytes
        if asked is None:
            continue
        worst: Over | None = None
        for uuid in job.gpu_uuids:
            gpu, held = gpus.get(uuid), usage.get(uuid, {})
            used = held.get(job.id, 0)
            # Shared: another of our jobs is placed there, or a process not ours runs there.
            is_shared = placed[uuid] > 1 or bool(held.get(None))
            if gpu is None or used <= asked or not is_shared:
                continue
            free = gpu.mem_total_bytes - (gpu.mem_used_bytes or sum(held.values()))
            is_under_floor = free < floor_bytes
            if used > asked * (1 + margin_pct / 100) or is_under_floor:
                if worst is None or used - asked > worst.used_bytes - worst.asked_bytes:
                    worst = Over(job.id, gpu.label, used, asked, is_under_floor)
        if worst is not None:
            found.append(worst)
    return found


# -- processes gpusched did not start: counted at their peak over a window -----------------
Samples = Mapping[str, tuple[tuple[float, int], ...]]


def outside_bytes(gpu: GpuInfo, pid_jobs: Mapping[int, int]) -> int:
    """What the GPU's memory holds that is not our jobs' (as placement's GpuLoad counts it)."""
    ours = sum(p.used_mem_bytes or 0 for p in gpu.processes if p.pid in pid_jobs)
    return max(0, (gpu.mem_used_bytes or 0) - ours)


def track_outside(
    inventory: Inventory, pid_jobs: Mapping[int, int], samples: Samples, now: float, window_s: float
) -> dict[str, tuple[tuple[float, int], ...]]:
    """Each GPU's readings of outside memory within the window, the new one added. Only
    those that can still be the window's peak are kept: a reading with a larger or equal
    one after it never will be (a sliding maximum), so a GPU keeps a few at most."""
    out = {}
    for gpu in inventory.schedulable():
        value = outside_bytes(gpu, pid_jobs)
        kept = [(t, b) for t, b in samples.get(gpu.uuid, ()) if t > now - window_s and b > value]
        out[gpu.uuid] = (*kept, (now, value))
    return out


def outside_peaks(samples: Samples) -> dict[str, int]:
    """GPU uuid -> the most outside memory read on it within the window."""
    return {uuid: max(b for _, b in kept) for uuid, kept in samples.items() if kept}
