"""Pure placement: which GPUs can take a request, which of them a policy prefers, and why not."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpusched.core.models import GpuInfo, GpuProcess, Inventory, Job, Request
from gpusched.core.sched import gpupromise, linkplace


@dataclass(frozen=True)
class PlacementRules:
    max_util_pct: float = 90.0
    mem_headroom_bytes: int = 512 * 2**20
    # An exclusive job wants an idle card: nothing of ours on it and almost no outside memory.
    exclusive_idle_mem_bytes: int = 2**30
    policy: str = "pack"
    # Processes gpusched did not start: "count" their memory, or "block" their GPU.
    outside: str = "count"
    outside_ignore_below_bytes: int = 0
    # A process idle (0% utilization) for this long is ignored, as if it held nothing.
    outside_idle_after_s: float | None = None
    gpu_weights: Mapping[int, float] = field(default_factory=dict)  # weighted-round-robin
    gpu_order: tuple[int, ...] = ()  # the "order" policy: preferred GPU indices first
    # Extra policies by name (the daemon loads them from the gpusched.policies entry points).
    custom_policies: Mapping[str, Policy] = field(default_factory=dict)


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
    # Outside memory the rules let us ignore (small or long-idle processes).
    ignored_outside_bytes: int = 0
    # Outside memory freed within [memory] others_peak_window: counted as still held, so
    # that a spiky neighbour's dip does not invite a job it will then crush.
    outside_dip_bytes: int = 0
    is_held_exclusively: bool = False
    blocked_by: str = ""  # why outside processes keep jobs off this GPU ("block" rule)

    @property
    def effective_free_bytes(self) -> int:
        used = self.gpu.mem_used_bytes
        if used is None:  # the driver would not say: trust only what we know
            used = self.ours_used_bytes
        held = used - self.ignored_outside_bytes + self.outside_dip_bytes
        return self.gpu.mem_total_bytes - held - self.promised_bytes

    @property
    def outside_used_bytes(self) -> int:
        used = self.gpu.mem_used_bytes or 0
        return max(0, used - self.ours_used_bytes - self.ignored_outside_bytes)


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may look at besides the candidates."""

    placements: Mapping[int, int]  # GPU index -> jobs placed on it so far (round-robin)
    weights: Mapping[int, float]
    order: tuple[int, ...]


# A placement policy: the candidate GPUs (all can take the request) in the order the
# policy prefers them. It must be pure: same inputs, same order.
Policy = Callable[[Request, Sequence[GpuLoad], PolicyContext], Sequence[GpuLoad]]


class Veto(Exception):
    """Raised by a custom policy that gives the job no GPU now: the job waits, and its
    pending reason gives the policy's words (`turned down by policy NAME: WORDS`)."""


def _pack(request: Request, loads: Sequence[GpuLoad], ctx: PolicyContext) -> list[GpuLoad]:
    # Best fit: the least free memory that still fits, so big holes stay for big jobs.
    # On a tie the highest index wins, keeping GPU 0 (the one people's desktops and
    # stray notebooks use) for last.
    return sorted(loads, key=lambda load: (load.effective_free_bytes, -load.gpu.index))


def _spread(request: Request, loads: Sequence[GpuLoad], ctx: PolicyContext) -> list[GpuLoad]:
    return sorted(
        loads,
        key=lambda load: (-load.effective_free_bytes, load.gpu.util_pct or 0.0, -load.gpu.index),
    )


def _round_robin(request: Request, loads: Sequence[GpuLoad], ctx: PolicyContext) -> list[GpuLoad]:
    return sorted(loads, key=lambda load: (ctx.placements.get(load.gpu.index, 0), load.gpu.index))


def _weighted(request: Request, loads: Sequence[GpuLoad], ctx: PolicyContext) -> list[GpuLoad]:
    def key(load: GpuLoad) -> tuple[float, float, int]:
        weight = ctx.weights.get(load.gpu.index, 1.0)
        return (ctx.placements.get(load.gpu.index, 0) / weight, -weight, load.gpu.index)

    return sorted(loads, key=key)


def _order(request: Request, loads: Sequence[GpuLoad], ctx: PolicyContext) -> list[GpuLoad]:
    rank = {index: pos for pos, index in enumerate(ctx.order)}
    return sorted(loads, key=lambda load: (rank.get(load.gpu.index, len(rank)), load.gpu.index))


BUILTIN_POLICIES: dict[str, Policy] = {
    "pack": _pack,
    "spread": _spread,
    "round-robin": _round_robin,
    "weighted-round-robin": _weighted,
    "order": _order,
}


def policy_names(rules: PlacementRules) -> list[str]:
    return [*BUILTIN_POLICIES, *rules.custom_policies]


def _declared_bytes(job: Job, gpu: GpuInfo) -> int:
    """What a job may use on a GPU: its whole card, or the larger of its declared memory
    and the most it was seen to use (a job that outgrew its --gpu-mem will again)."""
    if job.request.gpu_mem_bytes is None:
        return gpu.mem_total_bytes
    return max(job.request.gpu_mem_bytes, job.gpu_mem_peak_bytes or 0)


def _is_ignored(
    proc: GpuProcess, rules: PlacementRules, idle_since: Mapping[int, float], now: float
) -> bool:
    if proc.used_mem_bytes is not None and proc.used_mem_bytes < rules.outside_ignore_below_bytes:
        return True
    if rules.outside_idle_after_s is None or proc.pid not in idle_since:
        return False
    return now - idle_since[proc.pid] >= rules.outside_idle_after_s


def _outside_view(
    gpu: GpuInfo,
    pid_jobs: Mapping[int, int],
    rules: PlacementRules,
    idle_since: Mapping[int, float],
    now: float,
) -> tuple[int, str]:
    """(ignored outside bytes, block reason) for the processes gpusched did not start."""
    ignored, blockers = 0, []
    for proc in gpu.processes:
        if proc.pid in pid_jobs:
            continue
        if _is_ignored(proc, rules, idle_since, now):
            ignored += proc.used_mem_bytes or 0
        elif rules.outside == "block":
            blockers.append(f"pid {proc.pid} ({proc.user or 'unknown user'})")
    blocked = f"GPU {gpu.label} is in use by {', '.join(blockers)}" if blockers else ""
    return ignored, blocked


def observed_usage(inventory: Inventory, pid_jobs: Mapping[int, int]) -> dict[tuple[int, str], int]:
    """(job id, GPU uuid) -> GPU memory its processes hold now, as the driver reports it."""
    observed: dict[tuple[int, str], int] = {}
    for gpu in inventory.schedulable():
        for proc in gpu.processes:
            job_id = pid_jobs.get(proc.pid)
            if job_id is not None and proc.used_mem_bytes is not None:
                key = (job_id, gpu.uuid)
                observed[key] = observed.get(key, 0) + proc.used_mem_bytes
    return observed


def job_gpu_peaks(inventory: Inventory, pid_jobs: Mapping[int, int]) -> dict[int, int]:
    """Job id -> the most GPU memory it holds now on any one of its GPUs."""
    peaks: dict[int, int] = {}
    for (job_id, _), used in observed_usage(inventory, pid_jobs).items():
        peaks[job_id] = max(peaks.get(job_id, 0), used)
    return peaks


def gpu_loads(
    inventory: Inventory,
    running: Sequence[Job],
    pid_jobs: Mapping[int, int],
    rules: PlacementRules = PlacementRules(),
    idle_since: Mapping[int, float] | None = None,
    now: float = 0.0,
    outside_peaks: Mapping[str, int] | None = None,
) -> dict[str, GpuLoad]:
    """Per GPU: our jobs on it, what they use now (by process), and what they still will.
    outside_peaks: GPU uuid -> the most outside memory read within the window."""
    idle_since, outside_peaks = idle_since or {}, outside_peaks or {}
    observed = observed_usage(inventory, pid_jobs)
    loads = {}
    for gpu in inventory.schedulable():
        ignored, blocked = _outside_view(gpu, pid_jobs, rules, idle_since, now)
        dip = outside_peaks.get(gpu.uuid, 0) - gpupromise.outside_bytes(gpu, pid_jobs)
        loads[gpu.uuid] = GpuLoad(
            gpu, ignored_outside_bytes=ignored, outside_dip_bytes=max(0, dip), blocked_by=blocked
        )
    for job in running:
        for uuid in job.gpu_uuids:
            load = loads.get(uuid)
            if load is None:
                continue
            used = observed.get((job.id, uuid), 0)
            loads[uuid] = replace(
                load,
                job_ids=load.job_ids + (job.id,),
                promised_bytes=load.promised_bytes + max(0, _declared_bytes(job, load.gpu) - used),
                ours_used_bytes=load.ours_used_bytes + used,
                is_held_exclusively=load.is_held_exclusively
                or job.request.is_exclusive
                or load.gpu.parent_index is not None,
            )
    return loads


def track_idle(
    inventory: Inventory, pid_jobs: Mapping[int, int], idle_since: Mapping[int, float], now: float
) -> dict[int, float]:
    """Since when each outside process has shown 0% utilization (for outside_idle_after).

    A process whose utilization is unknown is never taken for idle.
    """
    out: dict[int, float] = {}
    for gpu in inventory.schedulable():
        for proc in gpu.processes:
            if proc.pid not in pid_jobs and proc.util_pct == 0:
                out[proc.pid] = idle_since.get(proc.pid, now)
    return out


def is_usable(load: GpuLoad) -> bool:
    # A GPU in MIG mode is never given out whole: CUDA can use only its MIG devices.
    return (
        load.gpu.is_healthy
        and not load.gpu.is_mig_mode
        and not load.is_held_exclusively
        and not load.blocked_by
    )


def _is_busy(load: GpuLoad, rules: PlacementRules) -> bool:
    return load.gpu.util_pct is not None and load.gpu.util_pct >= rules.max_util_pct


def fits(load: GpuLoad, request: Request, rules: PlacementRules) -> bool:
    """Whether this GPU can take the request right now."""
    if not is_usable(load) or _is_busy(load, rules) or not request.constraints.allows(load.gpu):
        return False
    if request.is_exclusive or load.gpu.parent_index is not None:
        # Whole cards and MIG devices are given to one job at a time.
        if load.job_ids:
            return False
    if request.gpu_mem_bytes is None:  # is_exclusive: a job without GPUs is never placed
        return load.outside_used_bytes + load.outside_dip_bytes <= rules.exclusive_idle_mem_bytes
    return load.effective_free_bytes >= request.gpu_mem_bytes + rules.mem_headroom_bytes


def choose_gpus(
    request: Request,
    loads: Mapping[str, GpuLoad],
    rules: PlacementRules,
    placements: Mapping[int, int] | None = None,
    policy: str = "",
    links: Sequence[Sequence[str]] = (),
) -> tuple[GpuInfo, ...] | None:
    """All the GPUs a job asks for, or None: a multi-GPU job gets all or nothing.

    With `links` (Inventory.links), a multi-GPU job gets the best-linked set of the
    fitting GPUs, the policy's order breaking ties.
    """
    fitting = [load for load in loads.values() if fits(load, request, rules)]
    if len(fitting) < request.gpus:
        return None
    name = policy or rules.policy
    choose = BUILTIN_POLICIES.get(name) or rules.custom_policies[name]
    ctx = PolicyContext(placements or {}, rules.gpu_weights, rules.gpu_order)
    try:
        ordered = [load.gpu for load in choose(request, fitting, ctx)]
    except Veto:
        return None
    chosen = linkplace.best_linked(request, ordered, loads, links)
    if chosen is None:
        return None
    uuids = [g.uuid for g in chosen]
    # A custom policy may veto GPUs, never invent them or offer one twice.
    if (
        len(uuids) < request.gpus
        or len(set(uuids)) < len(uuids)
        or not set(uuids) <= {load.gpu.uuid for load in fitting}
    ):
        return None
    # The policy chose which GPUs; the job gets them in index order (CUDA_VISIBLE_DEVICES,
    # ls, show), as nvidia-smi numbers them: its cuda:0 is its lowest GPU, not 3 of 3,2,1,0.
    return tuple(sorted((loads[uuid].gpu for uuid in uuids), key=lambda g: (g.index, g.label)))


def take(loads: dict[str, GpuLoad], job: Job, gpus: Sequence[GpuInfo]) -> None:
    """Count a job just placed on these GPUs, so later choices in the same pass see it."""
    for gpu in gpus:
        load = loads[gpu.uuid]
        loads[gpu.uuid] = replace(
            load,
            job_ids=load.job_ids + (job.id,),
            promised_bytes=load.promised_bytes + _declared_bytes(job, gpu),
            is_held_exclusively=job.request.is_exclusive or gpu.parent_index is not None,
        )


def _labels(loads: Sequence[GpuLoad]) -> str:
    return ", ".join(
        f"GPU {load.gpu.label}" for load in sorted(loads, key=lambda load: load.gpu.index)
    )


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


POLICY_REFUSAL = "turned down by policy"  # how policy_refusal's reasons begin


def policy_refusal(
    request: Request,
    fitting: Sequence[GpuLoad],
    rules: PlacementRules,
    policy: str,
    placements: Mapping[int, int] | None = None,
) -> str:
    """Why a custom policy gives the request none of the GPUs that can take it, asked
    again (it is pure); "" for a built-in policy, or when it gives enough."""
    choose = rules.custom_policies.get(policy)
    if choose is None:
        return ""
    ctx = PolicyContext(placements or {}, rules.gpu_weights, rules.gpu_order)
    offered = {load.gpu.uuid for load in fitting}
    try:
        uuids = [load.gpu.uuid for load in choose(request, fitting, ctx)]
    except Veto as veto:
        why = str(veto) or "it gave no reason"
    else:
        if not set(uuids) <= offered or len(set(uuids)) < len(uuids):
            why = "it chose a GPU it was not offered, or one twice"
        elif len(uuids) < request.gpus:
            some = f"{len(uuids)} of" if uuids else "none of"
            why = f"it chose {some} the GPUs that can take the job ({_labels(fitting)})" + (
                f"; it needs {request.gpus}" if request.gpus > 1 else ""
            )
        else:
            return ""
    return f"{POLICY_REFUSAL} {policy}: {why}"


def pending_reason(
    request: Request,
    loads: Mapping[str, GpuLoad],
    inventory: Inventory,
    rules: PlacementRules,
    policy: str = "",
    placements: Mapping[int, int] | None = None,
) -> str:
    """Why the GPUs cannot take a request now, in words a person can act on. policy: the
    job's, if not the rules' (a custom one may turn down GPUs that fit), and placements
    the counts it is given."""
    n = request.gpus
    plural = "s" if n != 1 else ""
    if not loads:
        return inventory.problem or "no GPUs are available to gpusched"
    allowed = [load for load in loads.values() if request.constraints.allows(load.gpu)]
    usable = [load for load in allowed if is_usable(load)]
    if request.gpu_mem_bytes is None:  # is_exclusive: asked only of a job with GPUs
        need = f"needs {n} whole GPU{plural}"
    else:
        need = f"needs {n} GPU{plural} with {_size(request.gpu_mem_bytes)} free"
    if not usable:
        blocked = next((load.blocked_by for load in allowed if load.blocked_by), "")
        held = any(load.is_held_exclusively for load in allowed)
        return blocked or f"{need}; every allowed GPU is " + (
            "held whole by a running job" if held else "unhealthy"
        )
    fitting = [load for load in usable if fits(load, request, rules)]  # in choose_gpus' order
    refused = (
        policy_refusal(request, fitting, rules, policy or rules.policy, placements)
        if len(fitting) >= n
        else ""
    )
    if refused:
        return refused
    if len(fitting) >= n and request.constraints.topology == "strict":
        return linkplace.strict_reason(request, fitting, loads, inventory.links)
    fit_labels = _labels(fitting)
    if request.is_exclusive:
        return f"{need}; {len(fitting)} free" + (f" ({fit_labels})" if fitting else "")
    if fitting:
        return f"{need} each; only {len(fitting)} ha{'s' if len(fitting) == 1 else 've'} it ({fit_labels})"
    best = max(usable, key=lambda load: (load.effective_free_bytes, -load.gpu.index))
    busy = f", but it is {best.gpu.util_pct:.0f}% busy" if _is_busy(best, rules) else ""
    dip = (
        f" (counting {_size(best.outside_dip_bytes)} that processes gpusched did not start "
        "freed within [memory] others_peak_window)"
        if best.outside_dip_bytes
        else ""
    )
    return (
        f"{need}; most free is GPU {best.gpu.label} with "
        f"{_size(max(0, best.effective_free_bytes))}{dip}{busy}"
    )


def host_impossible_reason(request: Request, cpus: int, mem_bytes: int) -> str | None:
    """Why this host's cores or memory could never hold the request, or None."""
    if request.cpus > cpus:
        return f"asks for {request.cpus} CPUs; this box has {cpus} usable"
    if request.mem_bytes is not None and request.mem_bytes > mem_bytes:
        return (
            f"asks for {_size(request.mem_bytes)} of host memory; this box has "
            f"{_size(mem_bytes)} usable"
        )
    return None


def impossible_reason(request: Request, inventory: Inventory) -> str | None:
    """Why no state of this box could ever run the request (refused at submit), or None."""
    devices = inventory.schedulable()
    if request.gpus == 0 or not devices:
        return None  # CPU jobs always fit; with no GPUs read yet, the job pends with a reason
    indices = sorted({g.index for g in devices})  # a MIG device has its GPU's index
    absent = [i for i in request.constraints.gpu_ids if i not in indices]
    if absent:
        return (
            f"asks for --gpu-ids {','.join(map(str, request.constraints.gpu_ids))}, but "
            f"this box has no GPU {' or '.join(map(str, absent))}: it has GPUs "
            f"{_index_ranges(indices)}"
        )
    allowed = [g for g in devices if request.constraints.allows(g)]
    if request.gpus > len(allowed):
        names = "; ".join(
            f"GPU {g.label}: {g.name}, {_size(g.mem_total_bytes)}"
            + (
                f", sm {g.compute_capability[0]}.{g.compute_capability[1]}"
                if g.compute_capability
                else ""
            )
            for g in devices
        )
        if len(allowed) == len(devices):
            return f"asks for {request.gpus} GPUs; this box has {len(devices)} ({names})"
        some = f"only {len(allowed)}" if allowed else "none"
        wanted = "1 GPU that meets" if request.gpus == 1 else f"{request.gpus} GPUs that meet"
        return (
            f"asks for {wanted} its constraints; {some} of the {len(devices)} GPUs here "
            f"{'meets' if len(allowed) == 1 else 'meet'} them ({names})"
        )
    if request.gpu_mem_bytes is not None:
        big = sorted((g.mem_total_bytes for g in allowed), reverse=True)[request.gpus - 1]
        if request.gpu_mem_bytes > big:
            return (
                f"asks for {_size(request.gpu_mem_bytes)} on each of {request.gpus} GPU(s); "
                f"the largest here have {_size(big)}"
            )
    return None


def _index_ranges(indices: list[int]) -> str:
    """0-3 for 0,1,2,3; 0, 2-3 for 0,2,3."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
