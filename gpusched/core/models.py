"""Plain data the rest of gpusched passes around: jobs, their states, GPUs (stdlib only)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field

from gpusched.core.spec.jobname import program_name
from gpusched.core.spec.syntax import dependency_words
from gpusched.core.spec.values import HIDDEN  # noqa: F401 - where the daemon reads it

TYPE_CHECKING = False  # not typing: 12 ms of `ls --state` (cli/listing.py)
if TYPE_CHECKING:
    from typing import Any

# The end_reason of a running job whose shim (or, for a job started without one, the job
# supervisor) died, while the processes it left are being stopped (daemon/jobs/lostrunners.py):
# the job keeps its GPUs until they are gone.
SHIM_LOST_REASON = "its shim died; stopping its processes"
SUPERVISOR_LOST_REASON = "its supervisor died; stopping its processes"
LOST_WATCHER_REASONS = (SHIM_LOST_REASON, SUPERVISOR_LOST_REASON)

# The queue disciplines (queuerules.QueueRules); the first is the default. Here, not in
# scheduling, so that the command line names them without importing the scheduler.
DISCIPLINES = ("fifo", "backfill", "fairshare", "sjf", "las")


class JobState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    OOM = "oom"
    LOST = "lost"
    # A run stopped to go back to the queue (preempted, or `gpusched requeue`): the job
    # passes through it to pending in the same write (daemon/jobs/requeue.py).
    PREEMPTED = "preempted"
    GPU_OOM = "gpu_oom"  # died of CUDA out-of-memory (core/sched/gpuoom.py), not host memory

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.OOM,
        JobState.LOST,
        JobState.GPU_OOM,
    }
)

# Every legal edge. RUNNING -> PENDING is taken when a job with retries left is re-queued;
# RUNNING -> PREEMPTED -> PENDING when a run is stopped to be requeued. The only way out
# of a final state is `gpusched requeue` (to PENDING, as `scontrol requeue`). LOST is for
# a job whose shim vanished without an exit record.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.RUNNING: FINAL_STATES | {JobState.PENDING, JobState.PREEMPTED},
    JobState.PREEMPTED: frozenset({JobState.PENDING}),
    **{state: frozenset({JobState.PENDING}) for state in FINAL_STATES},
}


# Before a retry: this long after the first failed attempt, doubling after each further one.
DEFAULT_RETRY_DELAY_S = 10.0


class IllegalTransition(ValueError):
    """A state change that the job state machine does not allow."""


@dataclass(frozen=True)
class Constraints:
    """Which GPUs a job may use at all. Empty fields allow everything."""

    gpu_ids: tuple[int, ...] = ()
    exclude_gpus: tuple[int, ...] = ()
    gpu_type: str = ""  # a case-insensitive substring of the GPU's name
    min_gpu_total_mem_bytes: int = 0
    min_compute_capability: tuple[int, int] | None = None
    # "strict": a multi-GPU job waits for a set linked as well as the box allows
    # (core/sched/topology.py); "" takes the best-linked set that is free now.
    topology: str = ""

    def allows(self, gpu: GpuInfo) -> bool:
        index = gpu.index if gpu.parent_index is None else gpu.parent_index
        if self.gpu_ids and index not in self.gpu_ids:
            return False
        if index in self.exclude_gpus or gpu.mem_total_bytes < self.min_gpu_total_mem_bytes:
            return False
        if (
            self.gpu_type
            and self.gpu_type.lower() not in gpu.name.lower()
            and self.gpu_type.lower() != (gpu.mig_profile or "").lower()
        ):
            return False
        if self.min_compute_capability is not None:
            return (
                gpu.compute_capability is not None
                and gpu.compute_capability >= self.min_compute_capability
            )
        return True


@dataclass(frozen=True)
class Request:
    """What a job asks of the GPUs. gpu_mem_bytes None means whole GPUs, exclusively."""

    gpus: int = 0
    gpu_mem_bytes: int | None = None
    constraints: Constraints = Constraints()
    cpus: int = 1
    mem_bytes: int | None = None  # host memory; None: not declared
    # Whether the job waits for its cores. A GPU job that did not ask with --cpus is
    # counted as using its core but never waits for one: on a box with fewer cores than
    # GPUs, GPU jobs must not queue behind cores they barely use.
    cpus_required: bool = True

    @property
    def is_exclusive(self) -> bool:
        return self.gpus > 0 and self.gpu_mem_bytes is None


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    command: tuple[str, ...]
    cwd: str
    uid: int
    user: str
    request: Request = Request()
    name: str = ""
    priority: int = 0
    env: dict[str, str] = field(default_factory=dict, compare=False)
    state: JobState = JobState.PENDING
    submitted_at: float = 0.0
    submit_pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    gpu_uuids: tuple[str, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    pending_reason: str = ""
    master_port: int | None = None
    # The process the daemon watches for the run: the job's shim, or the job itself where
    # the supervisor started it without one. Its pid plus its start time and the boot id,
    # so that a restarted daemon never mistakes a recycled pid for its job.
    runner_pid: int | None = None
    runner_start_time: float | None = None
    boot_id: str = ""
    cancel_requested: bool = False
    # The job's logs: gpusched's own files, or those its --output and --error patterns
    # name (core/spec/outpattern.py); open_mode: "truncate" or "append" at its first start
    # for those, "" when it has none.
    stdout_path: str = ""
    stderr_path: str = ""
    output_pattern: str = ""
    error_pattern: str = ""
    open_mode: str = ""
    end_reason: str = ""
    # Scheduling semantics (Slurm's vocabulary).
    held: bool = False
    # (syntax.DEPENDENCY_KINDS, id), (SINGLETON, 0), and (ANY_OF, 0) first for Slurm's `?`.
    dependencies: tuple[tuple[str, int], ...] = ()
    kill_on_invalid_dep: bool = False
    array_id: int | None = None  # the id of the array's first element
    array_index: int | None = None
    array_throttle: int | None = None  # at most this many elements of the array at once
    time_limit_s: float | None = None
    warn_signal: int | None = None  # sent warn_before_s before the time limit
    warn_before_s: float = 0.0
    warned: bool = False
    warn_batch: bool = False  # --signal B:: to the main process only, not its children
    timed_out: bool = False
    retries: int = 0
    retry_on: tuple[str, ...] = ("failed",)  # end states that re-queue while retries last
    attempt: int = 1
    retry_delay_s: float = DEFAULT_RETRY_DELAY_S  # before the 2nd attempt; doubles after
    eligible_at: float | None = None  # a re-queued attempt may not start before this
    begin_time: float | None = None  # --begin: the job may not start before this
    reservation: str = (
        ""  # --reservation: runs on its GPUs, in its window (core/sched/reservations.py)
    )
    last_attempt_end: str = ""  # the state the previous attempt ended in ("failed", ...)
    policy: str = ""  # placement policy for this job; "" = the configured one
    # Host resources and what the job was seen to use.
    cpu_ids: tuple[int, ...] = ()  # cores it is pinned to (cpu_binding), else ()
    mem_peak_bytes: int | None = None  # host memory of its process tree, at most
    gpu_mem_peak_bytes: int | None = None  # GPU memory on one of its GPUs, at most
    mem_over: bool = False  # went past its declared --mem plus the margin
    oom_killed: bool = False
    # Preemption and requeue (core/sched/preemption.py, daemon/jobs/requeue.py).
    preemptible: bool = False
    preempt_grace_s: float = 60.0  # between the checkpoint signal and SIGTERM
    restarts: int = 0  # runs stopped and requeued (preempted or requeued): GPUSCHED_RESTARTS
    preemptions: int = 0  # of those, preemptions: at most [preemption] max_preemptions
    requeueing: bool = False  # running, being stopped to go back to the queue
    requeue_term_at: float | None = None  # when it gets SIGTERM; None once sent
    requeue_reason: str = ""  # why it was (or is being) requeued: who, and when
    preempted_by: int | None = None  # the job it last made way for
    preempted_at: float | None = None  # when that preemption began
    # On a job that preempted others: which, when, and the GPUs kept for it meanwhile.
    preempted_jobs: tuple[int, ...] = ()
    preempted_jobs_at: float | None = None
    preempt_hold: tuple[str, ...] = ()
    # GPU memory that learns (core/sched/gpuoom.py, core/sched/memestimate.py): the factor a CUDA
    # out-of-memory retry raises --gpu-mem by, the key its peaks are filed under for
    # --gpu-mem auto, and why its --gpu-mem is what it is (an estimate, a raise).
    mem_growth: float = 1.25
    job_key: str = ""
    gpu_mem_reason: str = ""
    # Runtimes learned from history (core/sched/runtimes.py): the predicted runtime, its
    # 80 % interval and where it came from; None without history. Never a limit: it
    # orders backfill's queue and forecasts starts.
    predicted_s: float | None = None
    predicted_low_s: float | None = None
    predicted_high_s: float | None = None
    runtime_reason: str = ""
    interactive: bool = False  # exempt from idle_action (daemon/jobs/idlegpus.py)
    # GPU memory promises (daemon/jobs/gpuover.py): the job's --gpu-mem-over ("" for
    # [memory] gpu_over), what this run used past its --gpu-mem ("used 31.2 GiB of GPU 0,
    # asked for 10 GiB"), and whether it is being stopped for that (it then ends gpu_oom).
    gpu_mem_over: str = ""
    gpu_mem_over_by: str = ""
    gpu_mem_stop: bool = False
    # Run in a container (core/spec/container.py): (image, runtime options...), or () for none.
    container: tuple[str, ...] = ()
    pty: bool = False  # --pty: runs on a terminal of its shim's, for `gpusched attach`

    @property
    def is_running(self) -> bool:
        return self.state is JobState.RUNNING

    @property
    def display_name(self) -> str:
        """Its --name, else the program it runs (core/spec/jobname.py): one name in ls, show,
        top, history, usage, notifications and Slurm's -J."""
        return self.name or program_name(self.command)


_JOB_FIELDS = Job.__slots__


def job_with(job: Job, **changes: Any) -> Job:
    """dataclasses.replace(job, **changes) without running Job's 70-field __init__: a tenth
    of the cost, which counts where it runs for every job of a queue (a sweep's 100,000
    elements made from one template, the reasons of every job in line changing at each
    start). Only for changes that are checked values already: nothing is validated."""
    copied = object.__new__(Job)
    put = object.__setattr__  # Job is frozen
    for name in _JOB_FIELDS:
        put(copied, name, getattr(job, name))
    for name, value in changes.items():
        put(copied, name, value)
    return copied


def transition(job: Job, new_state: JobState, **changes: Any) -> Job:
    """The one way a job changes state; refuses edges the state machine lacks."""
    if new_state not in TRANSITIONS[job.state]:
        raise IllegalTransition(f"job {job.id}: {job.state.value} -> {new_state.value}")
    # job_with, not replace: Job has no checks in __init__ to run, and the simulator makes
    # a transition per job of a 100,000-job trace.
    return job_with(job, state=new_state, **changes)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU. used_mem_bytes None: the driver would not say."""

    pid: int
    gpu_uuid: str
    used_mem_bytes: int | None = None
    user: str | None = None
    command: str | None = None
    util_pct: float | None = None
    # False when the pid belongs to another pid namespace and cannot be seen from here.
    is_visible: bool = True


@dataclass(frozen=True)
class GpuInfo:
    """One GPU (or MIG device) as the backend last read it; None fields are unknown (N/A)."""

    index: int
    uuid: str
    name: str
    mem_total_bytes: int
    mem_used_bytes: int | None = None
    util_pct: float | None = None
    is_healthy: bool = True
    health_reason: str = ""
    bus_id: str | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    compute_capability: tuple[int, int] | None = None
    processes: tuple[GpuProcess, ...] = ()
    # MIG: a parent GPU in MIG mode lists its devices here and is never given out itself.
    mig_devices: tuple[GpuInfo, ...] = ()
    parent_index: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    parent_uuid: str | None = None  # a MIG device's GPU
    mig_profile: str | None = None  # a MIG device's profile, as nvidia-smi names it: 3g.20gb
    # A GPU in MIG mode: CUDA cannot use it whole, only its MIG devices.
    is_mig_mode: bool = False
    # Topology: the cores and NUMA node nearest the GPU (NVML's CPU and memory affinity).
    cpu_ids: tuple[int, ...] = ()
    numa_node: int | None = None

    @property
    def label(self) -> str:
        if self.parent_index is not None:
            return f"{self.parent_index}/{self.gpu_instance_id}"
        return str(self.index)


@dataclass(frozen=True)
class Inventory:
    """Every GPU the backend sees at one moment, plus why there are none when so."""

    gpus: tuple[GpuInfo, ...] = ()
    backend: str = "simulated"
    problem: str = ""
    driver_version: str | None = None
    cuda_version: str | None = None
    read_at: float = 0.0
    # Link labels between the whole GPUs, in `gpus` order (core/sched/topology.py); () unknown.
    links: tuple[tuple[str, ...], ...] = ()

    def schedulable(self) -> tuple[GpuInfo, ...]:
        """The devices jobs can be given: MIG devices stand in for their parent GPU. A
        parent in MIG mode without MIG devices stays, never usable (placement.is_usable)."""
        out: list[GpuInfo] = []
        for gpu in self.gpus:
            out.extend(gpu.mig_devices if gpu.mig_devices else (gpu,))
        return tuple(out)


def job_to_dict(job: Job) -> dict[str, Any]:
    """A job as stable JSON fields (what `show --json` prints)."""
    return {
        "id": job.id,
        "name": job.display_name,
        "state": job.state.value,
        # A running job told to stop (SIGTERM sent) that has not ended yet: it may be
        # ignoring SIGTERM until the grace period's SIGKILL.
        "cancelling": job.is_running and job.cancel_requested,
        # A running job whose shim (or supervisor) died: end_reason says which of its
        # processes are being stopped; it ends `lost` once they are gone.
        "shim_lost": job.is_running and job.end_reason.startswith(LOST_WATCHER_REASONS),
        "exit_code": job.exit_code,
        "signal": job.signal,
        "gpus": list(job.gpu_uuids),
        "gpu_indices": list(job.gpu_indices),
        "gpus_requested": job.request.gpus,
        "gpu_mem_bytes": job.request.gpu_mem_bytes,
        "priority": job.priority,
        "user": job.user,
        "uid": job.uid,
        "submit_pid": job.submit_pid,
        "command": list(job.command),
        "cwd": job.cwd,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "pending_reason": job.pending_reason if job.state is JobState.PENDING else "",
        "end_reason": job.end_reason,
        "master_port": job.master_port,
        "stdout_path": job.stdout_path,
        "stderr_path": job.stderr_path,
        "output_pattern": job.output_pattern,
        "error_pattern": job.error_pattern,
        "open_mode": job.open_mode,
        "held": job.held,
        "dependencies": dependency_words(job.dependencies),
        "array_id": job.array_id,
        "array_index": job.array_index,
        "array_throttle": job.array_throttle,
        "time_limit_s": job.time_limit_s,
        "warn_signal": job.warn_signal,
        "warn_before_s": job.warn_before_s,
        "warn_batch": job.warn_batch,
        "retries": job.retries,
        "attempt": job.attempt,
        "retry_delay_s": job.retry_delay_s,
        "eligible_at": job.eligible_at,
        "begin_time": job.begin_time,
        "reservation": job.reservation,
        "policy": job.policy,
        "constraints": asdict(job.request.constraints),
        "cpus": job.request.cpus,
        "cpus_required": job.request.cpus_required,
        "mem_bytes": job.request.mem_bytes,
        "cpu_ids": list(job.cpu_ids),
        "mem_peak_bytes": job.mem_peak_bytes,
        "gpu_mem_peak_bytes": job.gpu_mem_peak_bytes,
        "mem_over": job.mem_over,
        "gpu_mem_over": job.gpu_mem_over,
        "gpu_mem_over_by": job.gpu_mem_over_by,
        # A running job being stopped to be requeued (preempted, or `gpusched requeue`).
        "preempting": job.is_running and job.requeueing,
        "preemptible": job.preemptible,
        "preempt_grace_s": job.preempt_grace_s,
        "restarts": job.restarts,
        "preemptions": job.preemptions,
        "requeue_reason": job.requeue_reason,
        "preempted_by": job.preempted_by,
        "preempted_at": job.preempted_at,
        "preempted_jobs": list(job.preempted_jobs),
        "preempted_jobs_at": job.preempted_jobs_at,
        "mem_growth": job.mem_growth,
        "job_key": job.job_key,
        "gpu_mem_reason": job.gpu_mem_reason,
        "predicted_s": job.predicted_s,
        "predicted_low_s": job.predicted_low_s,
        "predicted_high_s": job.predicted_high_s,
        "runtime_reason": job.runtime_reason,
        "interactive": job.interactive,
        "pty": job.pty,
        "container": (
            {"image": job.container[0], "options": list(job.container[1:])}
            if job.container
            else None
        ),
    }


def inventory_to_dict(inventory: Inventory) -> dict[str, Any]:
    """An inventory as plain JSON data (tuples become lists); inventory_from_dict inverts it."""
    return asdict(inventory)


def _gpu_from_dict(data: dict[str, Any]) -> GpuInfo:
    values = dict(data)
    values["processes"] = tuple(GpuProcess(**p) for p in values.get("processes", ()))
    values["mig_devices"] = tuple(_gpu_from_dict(m) for m in values.get("mig_devices", ()))
    if values.get("compute_capability") is not None:
        values["compute_capability"] = tuple(values["compute_capability"])
    values["cpu_ids"] = tuple(values.get("cpu_ids", ()))
    return GpuInfo(**values)


def inventory_from_dict(data: dict[str, Any]) -> Inventory:
    values = dict(data)
    values["gpus"] = tuple(_gpu_from_dict(g) for g in values.get("gpus", ()))
    values["links"] = tuple(tuple(row) for row in values.get("links", ()))
    return Inventory(**values)
