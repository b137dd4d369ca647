"""Pure placement: which pending job starts next, on which GPUs, and why the others wait."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from gpusched.models import GpuInfo, Inventory, Job, Request


@dataclass(frozen=True)
class PlacementRules:
    max_util_pct: float = 90.0
    mem_headroom_bytes: int = 512 * 2**20
    # An exclusive job wants an idle card: nothing of ours on it and almost no outside memory.
    exclusive_idle_mem_bytes: int = 2**30


@dataclass(frozen=True)
class GpuLoad:
    """One schedulable GPU with what gpusched has promised on it."""

    gpu: GpuInfo
    job_ids: tuple[int, ...] = ()
    # Memory promised to our running jobs that they have not allocated yet: NVML cannot
    # see it, but a job placed seconds ago will take it (task-spooler's lesson).
    promised_bytes: int = 0
    # Memory our own jobs hold now; the rest of the used memory belongs to others.
    ours_used_bytes: int = 0
    is_held_exclusively: bool = False

    @property
    def effective_free_bytes(self) -> int:
        used = self.gpu.mem_used_bytes
        if used is None:  # the driver would not say: trust only what we promised
            used = self.ours_used_bytes
        return self.gpu.mem_total_bytes - used - self.promised_bytes

    @property
    def outside_used_bytes(self) -> int:
        return max(0, (self.gpu.mem_used_bytes or 0) - self.ours_used_bytes)


@dataclass(frozen=True)
class Plan:
    starts: tuple[tuple[int, tuple[GpuInfo, ...]], ...] = ()
    reasons: Mapping[int, str] = field(default_factory=dict)


def job_order(jobs: Iterable[Job]) -> list[Job]:
    """Priority first (higher earlier), then submission order."""
    return sorted(jobs, key=lambda j: (-j.priority, j.id))


def _declared_bytes(job: Job, gpu: GpuInfo) -> int:
    if job.request.gpu_mem_bytes is None:
        return gpu.mem_total_bytes
    return job.request.gpu_mem_bytes


def gpu_loads(inventory: Inventory, running: Sequence[Job],
              pid_jobs: Mapping[int, int]) -> dict[str, GpuLoad]:
    """Per GPU: our jobs on it, what they use now (by process), and what they still will."""
    observed: dict[tuple[int, str], int] = {}
    for gpu in inventory.schedulable():
        for proc in gpu.processes:
            job_id = pid_jobs.get(proc.pid)
            if job_id is not None and proc.used_mem_bytes is not None:
                key = (job_id, gpu.uuid)
                observed[key] = observed.get(key, 0) + proc.used_mem_bytes
    loads = {gpu.uuid: GpuLoad(gpu) for gpu in inventory.schedulable()}
    for job in running:
        for uuid in job.gpu_uuids:
            load = loads.get(uuid)
            if load is None:
                continue
            used = observed.get((job.id, uuid), 0)
            loads[uuid] = replace(
                load, job_ids=load.job_ids + (job.id,),
                promised_bytes=load.promised_bytes + max(0, _declared_bytes(job, load.gpu) - used),
                ours_used_bytes=load.ours_used_bytes + used,
                is_held_exclusively=load.is_held_exclusively or job.request.is_exclusive
                or load.gpu.parent_index is not None)
    return loads


def _usable(load: GpuLoad) -> bool:
    return load.gpu.is_healthy and not load.is_held_exclusively


def _is_busy(load: GpuLoad, rules: PlacementRules) -> bool:
    return load.gpu.util_pct is not None and load.gpu.util_pct >= rules.max_util_pct


def _fits(load: GpuLoad, request: Request, rules: PlacementRules) -> bool:
    if not _usable(load) or _is_busy(load, rules):
        return False
    if request.is_exclusive or load.gpu.parent_index is not None:
        # Whole cards and MIG devices are given to one job at a time.
        if load.job_ids:
            return False
    if request.is_exclusive:
        return load.outside_used_bytes <= rules.exclusive_idle_mem_bytes
    return load.effective_free_bytes >= request.gpu_mem_bytes + rules.mem_headroom_bytes


def _pack_key(load: GpuLoad) -> tuple[int, int]:
    # Best fit: the least free memory that still fits, so big holes stay for big jobs.
    # On a tie the highest index wins, keeping GPU 0 (the one people's desktops and
    # stray notebooks use) for last.
    return (load.effective_free_bytes, -load.gpu.index)


def choose_gpus(request: Request, loads: Mapping[str, GpuLoad],
                rules: PlacementRules) -> tuple[GpuInfo, ...] | None:
    """All the GPUs a job asks for, or None: a multi-GPU job gets all or nothing."""
    fitting = sorted((l for l in loads.values() if _fits(l, request, rules)), key=_pack_key)
    if len(fitting) < request.gpus:
        return None
    return tuple(l.gpu for l in fitting[: request.gpus])


def _take(loads: dict[str, GpuLoad], job: Job, gpus: tuple[GpuInfo, ...]) -> None:
    for gpu in gpus:
        load = loads[gpu.uuid]
        loads[gpu.uuid] = replace(
            load, job_ids=load.job_ids + (job.id,),
            promised_bytes=load.promised_bytes + _declared_bytes(job, gpu),
            is_held_exclusively=job.request.is_exclusive or gpu.parent_index is not None)


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def pending_reason(request: Request, loads: Mapping[str, GpuLoad], inventory: Inventory,
                   rules: PlacementRules) -> str:
    """Why a job cannot start now, in words a person can act on."""
    n = request.gpus
    plural = "s" if n != 1 else ""
    if not loads:
        return inventory.problem or "no GPUs are available to gpusched"
    usable = [l for l in loads.values() if _usable(l)]
    if not usable:
        return "no GPU can take jobs now (all unhealthy or held whole by running jobs)"
    fitting = [l for l in usable if _fits(l, request, rules)]
    fit_labels = ", ".join(f"GPU {l.gpu.label}" for l in sorted(fitting, key=lambda l: l.gpu.index))
    if request.is_exclusive:
        return f"needs {n} whole GPU{plural}; {len(fitting)} free" + (f" ({fit_labels})" if fitting else "")
    need = f"needs {n} GPU{plural} with {_size(request.gpu_mem_bytes)} free"
    if fitting:
        return f"{need} each; only {len(fitting)} ha{'s' if len(fitting) == 1 else 've'} it ({fit_labels})"
    best = max(usable, key=lambda l: (l.effective_free_bytes, -l.gpu.index))
    busy = f", but it is {best.gpu.util_pct:.0f}% busy" if _is_busy(best, rules) else ""
    return (f"{need}; most free is GPU {best.gpu.label} with "
            f"{_size(max(0, best.effective_free_bytes))}{busy}")


def plan(pending: Sequence[Job], loads: Mapping[str, GpuLoad], inventory: Inventory,
         rules: PlacementRules) -> Plan:
    """Skip-ahead order: every job that fits starts; one that does not never blocks the rest."""
    loads = dict(loads)
    starts: list[tuple[int, tuple[GpuInfo, ...]]] = []
    reasons: dict[int, str] = {}
    for job in job_order(pending):
        if job.request.gpus == 0:
            starts.append((job.id, ()))
            continue
        chosen = choose_gpus(job.request, loads, rules)
        if chosen is None:
            reasons[job.id] = pending_reason(job.request, loads, inventory, rules)
        else:
            _take(loads, job, chosen)
            starts.append((job.id, chosen))
    return Plan(starts=tuple(starts), reasons=reasons)


def impossible_reason(request: Request, inventory: Inventory) -> str | None:
    """Why no state of this box could ever run the request (refused at submit), or None."""
    devices = inventory.schedulable()
    if request.gpus == 0 or not devices:
        return None  # CPU jobs always fit; with no GPUs read yet, the job pends with a reason
    if request.gpus > len(devices):
        return f"asks for {request.gpus} GPUs; this box has {len(devices)}"
    if request.gpu_mem_bytes is not None:
        big = sorted((g.mem_total_bytes for g in devices), reverse=True)[request.gpus - 1]
        if request.gpu_mem_bytes > big:
            return (f"asks for {_size(request.gpu_mem_bytes)} on each of {request.gpus} GPU(s); "
                    f"the largest here have {_size(big)}")
    return None
