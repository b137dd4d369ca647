"""Submitted job specs: Slurm-style option syntax, and the daemon's check of each field."""

from __future__ import annotations

from typing import Any, overload

from gpusched.core.errors import UsageError
from gpusched.core.models import DEFAULT_RETRY_DELAY_S, Constraints, Job, Request
from gpusched.core.sched import gpuoom, gpupromise
from gpusched.core.sched.topology import TOPOLOGY_MODES
from gpusched.core.spec import begintime, outpattern, syntax, values
from gpusched.core.spec.syntax import (
    DEPENDENCY_KINDS,
    MAX_ARRAY_INDEX,
    MAX_ARRAY_SIZE,
    MAX_JOB_ID,
    MAX_PRIORITY,
    RETRY_ON_CHOICES,
)

MAX_GPUS_PER_JOB = 64
MAX_GPU_INDEX = 1023
MAX_DURATION_S = syntax.MAX_DURATION_S
# The fields of a job spec (what the CLI's build_request and job_spec() write): any other
# is refused, so that a misspelt field is not ignored in silence.
SPEC_FIELDS = (
    "command",
    "name",
    "gpus",
    "gpu_mem_bytes",
    "cpus",
    "mem_bytes",
    "priority",
    "hold",
    "kill_on_invalid_dep",
    "dependencies",
    "retries",
    "retry_on",
    "retry_delay_s",
    "policy",
    "constraints",
    "time_limit_s",
    "warn_signal",
    "warn_before_s",
    "array",
    "preemptible",
    "preempt_grace_s",
    "gpu_mem_auto",
    "mem_growth",
    "gpu_mem_over",
    "interactive",
    "pty",
    "container",
    "warn_batch",
    "output",
    "error",
    "open_mode",
    "begin_time",
    "reservation",
)
CONSTRAINT_FIELDS = (
    "gpu_ids",
    "exclude_gpus",
    "gpu_type",
    "min_gpu_total_mem_bytes",
    "min_compute_capability",
    "topology",
)


# The submit option that sets each field, where its name is not the field's: an error names
# what the user typed (--time), never the request's key (time_limit_s).
_OPTION_OF = {
    "time_limit_s": "--time",
    "retry_delay_s": "--retry-delay",
    "warn_before_s": "--signal's @SECONDS",
    "warn_signal": "--signal",
    "warn_batch": "--signal's B:",
    "mem_bytes": "--mem",
    "gpu_mem_bytes": "--gpu-mem",
    "min_gpu_total_mem_bytes": "--min-gpu-total-mem",
    "dependencies": "--dependency",
    "begin_time": "--begin",
}


def _what(key: str) -> str:
    """The option of a spec field, and the unit the request carries it in."""
    option = _OPTION_OF.get(key) or "--" + key.replace("_", "-")
    unit = (
        " (in seconds)" if key.endswith("_s") else " (in bytes)" if key.endswith("_bytes") else ""
    )
    return option + unit


@overload
def whole_number(spec: dict[str, Any], key: str, default: int, low: int, high: int) -> int: ...
@overload
def whole_number(
    spec: dict[str, Any], key: str, default: None, low: int, high: int
) -> int | None: ...
def whole_number(
    spec: dict[str, Any], key: str, default: int | None, low: int, high: int
) -> int | None:
    """spec[key] checked; null, as a missing key, is the default."""
    value = spec.get(key)
    if value is None:
        return default
    return values.whole_number(value, _what(key), low, high)


def _number(spec: dict[str, Any], key: str, low: float) -> float | None:
    value = spec.get(key)
    return None if value is None else values.number(value, _what(key), low, MAX_DURATION_S)


def _flag(spec: dict[str, Any], key: str) -> bool:
    value = spec.get(key)
    return False if value is None else values.flag(value, _what(key))


def _gpu_indices(spec: dict[str, Any], key: str) -> tuple[int, ...]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(values.is_whole(v, 0, MAX_GPU_INDEX) for v in value):
        raise UsageError(
            f"{_what(key)} must be a list of GPU indices (0 to {MAX_GPU_INDEX}), "
            f"not {values.shown(value)}"
        )
    return tuple(value)


def check_constraints(spec: Any) -> Constraints:
    spec = values.mapping(spec or {}, "constraints", CONSTRAINT_FIELDS)
    capability = spec.get("min_compute_capability")
    if capability is not None and (
        not isinstance(capability, list)
        or len(capability) != 2
        or not all(values.is_whole(v, 0, 1000) for v in capability)
    ):
        raise UsageError(
            f"--min-compute-capability wants MAJOR.MINOR like 8.0, not {values.shown(capability)}"
        )
    gpu_type = spec.get("gpu_type") or ""
    if not values.is_text(gpu_type):
        raise UsageError(f"--gpu-type must be a string, not {values.shown(gpu_type)}")
    # "" is what job_spec() writes back for the default; any other value is a choice
    # (0, false or [] once passed as the default).
    topology_mode = spec.get("topology")
    if topology_mode is None or topology_mode == "":
        topology_mode = ""
    else:
        values.choice(topology_mode, "topology", TOPOLOGY_MODES)
    return Constraints(
        gpu_ids=_gpu_indices(spec, "gpu_ids"),
        exclude_gpus=_gpu_indices(spec, "exclude_gpus"),
        gpu_type=gpu_type,
        min_gpu_total_mem_bytes=whole_number(spec, "min_gpu_total_mem_bytes", 0, 0, 2**60),
        min_compute_capability=tuple(capability) if capability else None,
        # "best" is what every job gets: stored as the default
        topology="" if topology_mode == "best" else topology_mode,
    )


def check_array(spec: dict[str, Any]) -> tuple[tuple[int | None, ...], int | None]:
    """The checked array part of a job spec, (indices, at-most-at-once); ((None,), None)
    for a single job."""
    array = spec.get("array")
    if array is None:
        return (None,), None
    array = values.mapping(array, "array", ("indices", "throttle"))
    indices, throttle = array.get("indices"), array.get("throttle")
    if (
        not isinstance(indices, list)
        or not 0 < len(indices) <= MAX_ARRAY_SIZE
        or not all(values.is_whole(i, 0, MAX_ARRAY_INDEX) for i in indices)
        or len(set(indices)) != len(indices)
    ):
        raise UsageError(
            f"an array needs 1 to {MAX_ARRAY_SIZE:,} different indices from 0 to "
            f"{MAX_ARRAY_INDEX:,}, not {values.shown(indices)}"
        )
    if throttle is not None and not values.is_whole(throttle, 1, MAX_JOB_ID):
        raise UsageError(
            "an array's at-most-at-once count must be a positive number, not "
            f"{values.shown(throttle)}"
        )
    return tuple(indices), throttle


def _command(spec: dict[str, Any]) -> tuple[str, ...]:
    command = spec.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not command[0]
        or not all(values.is_text(a, os_text=True) for a in command)
    ):
        raise UsageError(
            "the job has no command (a list of strings without NUL characters); "
            "put it after `--`, e.g. `gpusched submit -- python train.py`"
        )
    return tuple(command)


def _dependencies(spec: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    deps = spec.get("dependencies") or []
    if not isinstance(deps, list) or not all(
        isinstance(d, list)
        and len(d) == 2
        and isinstance(d[0], str)
        and (
            (d[0] in DEPENDENCY_KINDS and values.is_whole(d[1], 0, MAX_JOB_ID))
            or (d[0] in (syntax.SINGLETON, syntax.ANY_OF) and values.is_whole(d[1], 0, 0))
        )
        for d in deps
    ):
        raise UsageError(f"dependencies must be [KIND, ID] pairs, not {values.shown(deps)}")
    # ANY_OF marks the whole list: first, where the scheduler looks for it (a stable sort).
    return tuple(
        sorted(((kind, job_id) for kind, job_id in deps), key=lambda d: d[0] != syntax.ANY_OF)
    )


def _retry_on(spec: dict[str, Any]) -> tuple[str, ...]:
    retry_on = spec.get("retry_on") or ["failed"]
    if not isinstance(retry_on, list) or not all(
        isinstance(r, str) and r in RETRY_ON_CHOICES for r in retry_on
    ):
        raise UsageError(
            f"--retry-on takes: {', '.join(RETRY_ON_CHOICES)}; not {values.shown(retry_on)}"
        )
    return tuple(retry_on)


def _container(spec: dict[str, Any]) -> tuple[str, ...]:
    """(image, runtime options...) of a job run in a container; () for none."""
    container = spec.get("container") or []
    if (
        not isinstance(container, list)
        or (container and not container[0])
        or not all(values.is_text(a, os_text=True) for a in container)
    ):
        raise UsageError(
            "container must be a list of strings without NUL characters: the "
            f"image, then the runtime's options; not {values.shown(container)}"
        )
    if container and container[0].startswith("-"):
        raise UsageError(
            f"--container takes an image name, not the option {container[0]!r}; "
            "give runtime options with --container-opt"
        )
    return tuple(container)


def check_job_spec(spec: Any, policies: list[str]) -> dict[str, Any]:
    """The Job fields of one submitted job, every value checked (the daemon trusts no client)."""
    spec = values.mapping(spec, "each job", SPEC_FIELDS)
    name = spec.get("name") or ""
    if not values.is_text(name):  # its length is limits.name's (core/spec/limits.py), one rule
        raise UsageError(
            f"the job name must be a string without NUL characters, not {values.shown(name)}"
        )
    if values.has_controls(name):  # one name, one line, wherever it is written
        raise UsageError(
            "--name (-J) must not hold control characters (a newline, a tab, "
            f"...), not {values.shown(name)}"
        )
    gpus = whole_number(spec, "gpus", 0, 0, MAX_GPUS_PER_JOB)
    # Cores asked for are a limit; a GPU job that did not ask is counted as using one
    # but never waits for it; a job without GPUs needs its one core (else a queue of
    # CPU jobs would all start at once).
    cpus = whole_number(spec, "cpus", None, 0, 100_000)
    cpus_required = cpus is not None or gpus == 0
    host_mem = whole_number(spec, "mem_bytes", None, 1, 2**60)
    mem = whole_number(spec, "gpu_mem_bytes", None, 1, 2**50)
    mem_auto = _flag(spec, "gpu_mem_auto")
    if mem_auto and mem is not None:
        raise UsageError("--gpu-mem is either a size or auto, not both")
    if (mem is not None or mem_auto) and gpus == 0:
        raise UsageError("--gpu-mem needs at least one GPU; add --gpus 1")
    constraints = check_constraints(spec.get("constraints"))
    if gpus == 0 and constraints != Constraints():
        raise UsageError("GPU constraints (--gpu-ids, --gpu-type, ...) need --gpus 1 or more")
    policy = spec.get("policy")
    if policy not in (None, ""):
        values.choice(policy, "policy", policies)
    retry_delay_s = _number(spec, "retry_delay_s", 0.0)
    warn_signal = whole_number(spec, "warn_signal", None, 1, 64)
    if warn_signal is not None and warn_signal not in syntax.warn_signals():
        raise UsageError(
            f"--signal must be one the job's shim passes on "
            f"({', '.join(str(s) for s in syntax.warn_signals())}), not {warn_signal}"
        )
    return {
        "command": _command(spec),
        "name": name,
        "policy": policy or "",
        "request": Request(
            gpus, mem, constraints, 1 if cpus is None else cpus, host_mem, cpus_required
        ),
        "priority": whole_number(spec, "priority", 0, -MAX_PRIORITY, MAX_PRIORITY),
        "held": _flag(spec, "hold"),
        "dependencies": _dependencies(spec),
        "kill_on_invalid_dep": _flag(spec, "kill_on_invalid_dep"),
        "time_limit_s": _number(spec, "time_limit_s", 1.0),
        "warn_signal": warn_signal,
        "warn_before_s": _number(spec, "warn_before_s", 0.0) or 0.0,
        "warn_batch": _flag(spec, "warn_batch"),
        "retries": whole_number(spec, "retries", 0, 0, 1000),
        "retry_on": _retry_on(spec),
        "retry_delay_s": DEFAULT_RETRY_DELAY_S if retry_delay_s is None else retry_delay_s,
        **_memory_fields(spec),
        # None: the config's default for the user (core/preemption.job_defaults).
        "preemptible": None if spec.get("preemptible") is None else _flag(spec, "preemptible"),
        "preempt_grace_s": _number(spec, "preempt_grace_s", 0.0),
        "container": _container(spec),
        "pty": _flag(spec, "pty"),
        "begin_time": checked_begin_time(spec),
        "reservation": values.text(spec.get("reservation") or "", "--reservation"),
        **_output_fields(spec),
    }


def checked_begin_time(spec: dict[str, Any]) -> float | None:
    """--begin as the client sends it, epoch seconds (begintime.parse_begin); None without."""
    value = spec.get("begin_time")
    return None if value is None else values.number(value, "--begin", 0.0, begintime.MAX_BEGIN_TIME)


def _output_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """--output and --error, patterns the daemon expands with the job's id, and
    --open-mode: "" for a job without them."""
    paths = {}
    for key, field in (("output", "output_pattern"), ("error", "error_pattern")):
        pattern = spec.get(key) or ""
        # Strict UTF-8, as the working directory is: the store keeps both as text.
        if not values.is_text(pattern) or len(pattern) > 4096:
            raise UsageError(
                f"--{key} must be a UTF-8 file name of at most 4096 characters "
                f"without NUL characters, not {values.shown(pattern)}"
            )
        paths[field] = pattern
    mode = spec.get("open_mode") or ""
    if mode:
        values.choice(mode, "open-mode", outpattern.OPEN_MODES)
    return {**paths, "open_mode": (mode or outpattern.OPEN_MODES[0]) if any(paths.values()) else ""}


def _memory_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """What GPU memory that learns keeps of a spec (core/sched/gpuoom.py). Its --gpu-mem auto
    (wants_gpu_mem_auto) and its job key are the daemon's submit to work out."""
    growth = spec.get("mem_growth")
    if growth is not None:
        growth = values.number(growth, "mem-growth", 1.0, gpuoom.MAX_GROWTH)
    over = spec.get("gpu_mem_over")
    return {
        "mem_growth": gpuoom.DEFAULT_GROWTH if growth is None else growth,
        "gpu_mem_over": values.choice(over, "gpu-mem-over", gpupromise.ACTIONS) if over else "",
        "interactive": _flag(spec, "interactive"),
    }


def wants_gpu_mem_auto(spec: dict[str, Any]) -> bool:
    """Whether a spec (checked by check_job_spec) asks for --gpu-mem auto."""
    return _flag(spec, "gpu_mem_auto")


def job_spec(job: Job) -> dict[str, Any]:
    """The spec that check_job_spec turns back into this job's fields: what `resubmit`
    queues again. Not held: a hold is asked for anew (`resubmit --hold`)."""
    request, constraints = job.request, job.request.constraints
    capability = constraints.min_compute_capability
    return {
        "command": list(job.command),
        "name": job.name,
        "policy": job.policy,
        "gpus": request.gpus,
        "gpu_mem_bytes": request.gpu_mem_bytes,
        # Cores not asked for stay so: a GPU job then still never waits for one.
        "cpus": request.cpus if request.cpus_required else None,
        "mem_bytes": request.mem_bytes,
        "priority": job.priority,
        "hold": False,
        "constraints": {
            "gpu_ids": list(constraints.gpu_ids),
            "exclude_gpus": list(constraints.exclude_gpus),
            "gpu_type": constraints.gpu_type,
            "min_gpu_total_mem_bytes": constraints.min_gpu_total_mem_bytes,
            "min_compute_capability": list(capability) if capability else None,
            "topology": constraints.topology,
        },
        "retries": job.retries,
        "retry_on": list(job.retry_on),
        "retry_delay_s": job.retry_delay_s,
        "dependencies": [[kind, dep] for kind, dep in job.dependencies],
        "kill_on_invalid_dep": job.kill_on_invalid_dep,
        "time_limit_s": job.time_limit_s,
        "warn_signal": job.warn_signal,
        "warn_before_s": job.warn_before_s,
        "mem_growth": job.mem_growth,
        "gpu_mem_over": job.gpu_mem_over,
        "interactive": job.interactive,
        "pty": job.pty,
        "preemptible": job.preemptible,
        "preempt_grace_s": job.preempt_grace_s,
        "container": list(job.container),
        "warn_batch": job.warn_batch,
        "output": job.output_pattern,
        "error": job.error_pattern,
        "open_mode": job.open_mode,
    }


RESUBMIT_CHANGES = (
    "gpus",
    "gpu_mem_bytes",
    "name",
    "priority",
    "time_limit_s",
    "cpus",
    "mem_bytes",
    "hold",
)


def changed(spec: dict[str, Any], changes: Any) -> dict[str, Any]:
    """A job's spec with the changes `resubmit` may make (checked again like any spec)."""
    if not isinstance(changes, dict) or not set(changes) <= set(RESUBMIT_CHANGES):
        raise UsageError(f"resubmit may change only: {', '.join(RESUBMIT_CHANGES)}")
    if changes.get("gpus") == 0 and "gpu_mem_bytes" not in changes:
        # No GPUs now: what only a GPU job may ask for goes with them.
        spec = {**spec, "gpu_mem_bytes": None, "constraints": None}
    return {**spec, **changes}
