"""Turn `submit` options into the job request the daemon queues: one place for every
reading of an option (the typer command, the fast path, `resubmit` and `service`)."""

from __future__ import annotations

import os
import time

from gpusched.client.submit.options import SubmitOptions
from gpusched.client.submit.slurmflags import check_one_node, exported_environment, gres_as_gpus
from gpusched.core.errors import UsageError

# typing is imported only by type checkers: the submit fast path imports this module, and
# typing would cost every submit several ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


def _syntax() -> Any:
    """core.syntax (and the modules it imports), imported only when an option given needs
    it: a plain `submit -- CMD` does without, and each module costs every submit a little."""
    from gpusched.core.spec import syntax  # noqa: PLC0415 - 0.7 ms of every submit

    return syntax


# The options that choose among the GPUs (SubmitOptions fields).
GPU_CONSTRAINT_OPTIONS = (
    "gpu_ids",
    "exclude_gpus",
    "gpu_type",
    "min_gpu_total_mem",
    "min_compute_capability",
    "topology",
)


def env_pairs(pairs: Iterable[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env wants NAME=VALUE, not {pair!r}")
        out[key] = value
    return out


def _index_list(text: str | None, option: str) -> list[int]:
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option} wants GPU indices like 0,2, not {text!r}") from None


def size_option(text: str | None, option: str) -> int | None:
    """A size option's bytes (--gpu-mem, --min-gpu-total-mem, simulate's --mem; None if
    not given); a bad one is a UsageError naming it. A bare number is refused: submit's
    `--mem 10` is 10 MiB as in Slurm, and 10 bytes of GPU memory is never what was meant."""
    if text is None:
        return None
    if text.strip().replace(".", "", 1).isdecimal():
        raise UsageError(
            f"{option} {text}: give a unit, e.g. {text.strip()}G (GiB) or {text.strip()}M (MiB)"
        )
    from gpusched.core.units import parse_size  # noqa: PLC0415 - as syntax's in _syntax

    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _duration(text: str, option: str) -> float:
    from gpusched.core.units import parse_duration  # noqa: PLC0415 - as syntax's in _syntax

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None
    if seconds > _syntax().MAX_DURATION_S:
        raise UsageError(f"{option} {text!r} is over the longest, 100 years; give a shorter one")
    return seconds


def _growth(text: str) -> float:
    try:
        factor = float(text.strip().lower().removeprefix("x"))
    except ValueError:
        factor = 0.0
    if not 1.0 <= factor <= 16.0:  # core/gpuoom.MAX_GROWTH; not imported on the fast path
        raise UsageError(f"--mem-growth wants a factor from 1 to 16 like 1.5, not {text!r}")
    return factor


def _capability(text: str | None) -> list[int] | None:
    if not text:
        return None
    major, _, minor = text.partition(".")
    if not major.isdigit() or not (minor or "0").isdigit():
        raise UsageError(f"--min-compute-capability wants MAJOR.MINOR like 8.0, not {text!r}")
    return [int(major), int(minor or 0)]


def gpus_and_type(opts: SubmitOptions) -> tuple[int | None, str]:
    """--gpus N, or Slurm's TYPE:N, beside --gpu-type: (the count or None, the type or "")."""
    gpu_type = opts.gpu_type or ""
    gpus = opts.gpus
    if gpus is None and opts.gres is None:
        return None, gpu_type
    syntax = _syntax()
    if opts.gres is not None:
        from_gres = gres_as_gpus(opts.gres)
        if gpus is not None and syntax.parse_gpus(str(gpus)) != syntax.parse_gpus(from_gres):
            raise UsageError(
                f"--gpus {gpus} and --gres {opts.gres} ask for different GPUs; give one of them"
            )
        gpus = from_gres
    if gpus is None:
        return None, gpu_type
    count, named_type = syntax.parse_gpus(str(gpus))
    if named_type and gpu_type and named_type.lower() != gpu_type.lower():
        raise UsageError(
            f"--gpus {opts.gpus} and --gpu-type {gpu_type} name different GPU "
            "types; give one of them"
        )
    return count, named_type or gpu_type


def scheduling_fields(opts: SubmitOptions) -> dict[str, Any]:
    """The Slurm-style options of a job spec: hold, dependencies, arrays, limits, constraints."""
    spec: dict[str, Any] = {
        "mem_bytes": None if opts.mem is None else _syntax().parse_mem(opts.mem),
        "hold": opts.hold,
        "kill_on_invalid_dep": opts.kill_on_invalid_dep,
        "dependencies": [list(d) for d in _syntax().parse_dependencies(opts.after, opts.dependency)]
        if opts.after or opts.dependency
        else [],
        "retries": opts.retries,
        "policy": opts.policy or "",
        "constraints": {
            "gpu_ids": _index_list(opts.gpu_ids, "--gpu-ids"),
            "exclude_gpus": _index_list(opts.exclude_gpus, "--exclude-gpus"),
            "gpu_type": gpus_and_type(opts)[1],
            "min_gpu_total_mem_bytes": size_option(opts.min_gpu_total_mem, "--min-gpu-total-mem")
            or 0,
            "min_compute_capability": _capability(opts.min_compute_capability),
            "topology": opts.topology or "",
        },
    }
    if opts.cpus is not None:  # only cores asked for are a limit (see jobspec)
        spec["cpus"] = opts.cpus
    if opts.retry_on:
        spec["retry_on"] = [r.strip() for r in opts.retry_on.split(",") if r.strip()]
    if opts.mem_growth is not None:
        spec["mem_growth"] = _growth(opts.mem_growth)
    if opts.gpu_mem_over is not None:
        spec["gpu_mem_over"] = opts.gpu_mem_over
    if opts.interactive:
        spec["interactive"] = True
    if opts.pty:
        spec["pty"] = True
    if opts.retry_delay is not None:
        spec["retry_delay_s"] = _duration(opts.retry_delay, "--retry-delay")
    # --time auto: no limit; the runtime predicted from earlier runs orders the queue, as
    # for a job with no --time (core/sched/runtimes.py).
    no_limit = opts.time is None or opts.time.strip().lower() == "auto"
    time_limit_s = None if no_limit else _syntax().parse_time_limit(opts.time)
    if time_limit_s is not None:
        spec["time_limit_s"] = time_limit_s
    if opts.signal is not None:
        if time_limit_s is None:
            raise UsageError(
                "--signal warns before the time limit: add a --time limit (not 0 or UNLIMITED)"
            )
        syntax = _syntax()
        try:
            spec["warn_signal"], spec["warn_before_s"] = syntax.parse_signal_spec(opts.signal)
            if syntax.signal_is_batch_only(opts.signal):
                spec["warn_batch"] = True
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    spec.update(preemption_fields(opts))
    if opts.begin is not None:
        from gpusched.core.spec.begintime import parse_begin  # noqa: PLC0415 - only with --begin: datetime, 2.6 ms

        spec["begin_time"] = parse_begin(opts.begin, time.time())
    if opts.reservation:
        spec["reservation"] = opts.reservation
    if opts.array is not None:
        indices, throttle = _syntax().parse_array(opts.array)
        spec["array"] = {"indices": list(indices), "throttle": throttle}
    return spec


def preemption_fields(opts: SubmitOptions) -> dict[str, Any]:
    """--preemptible, --no-preemptible and --preempt-grace; what is not given is left to
    the daemon's config."""
    if opts.preemptible and opts.no_preemptible:
        raise UsageError("--preemptible and --no-preemptible contradict each other; give one")
    spec: dict[str, Any] = {}
    if opts.preemptible or opts.no_preemptible:
        spec["preemptible"] = bool(opts.preemptible)
    if opts.preempt_grace is not None:
        spec["preempt_grace_s"] = _duration(opts.preempt_grace, "--preempt-grace")
    return spec


def submitting_environment() -> dict[str, str]:
    """The environment this process was started with, which the job gets.

    Read from /proc/self/environ rather than os.environ: Python changes its own
    environment as it starts (PEP 538 adds LC_CTYPE=C.UTF-8 under the C locale), and the
    job must see what the caller's shell exported, nothing more. os.environ where /proc
    cannot tell (not Linux, or not readable).
    """
    try:
        with open("/proc/self/environ", "rb") as environ:
            raw = environ.read()
    except OSError:
        return dict(os.environ)
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:  # the first of a repeated name wins, as in os.environ
            env.setdefault(os.fsdecode(name), os.fsdecode(value))
    return env


def job_cwd(option: str | None) -> str:
    """The job's working directory: --cwd made absolute, or the current one; it must exist."""
    if option is None or not os.path.isabs(option):
        try:
            here = os.getcwd()
        except FileNotFoundError:  # deleted under the shell that runs us
            if option is None:
                raise UsageError(
                    "the current directory no longer exists (was it deleted?), "
                    "and a job runs where it is submitted. cd to a directory "
                    "that exists, or give --cwd DIR"
                ) from None
            raise UsageError(
                f"--cwd {option} is relative to the current directory, which no "
                "longer exists (was it deleted?). cd to a directory that "
                "exists, or give an absolute --cwd"
            ) from None
        option = os.path.join(here, option or "")
    cwd = os.path.normpath(option)
    if not os.path.exists(cwd):
        raise UsageError(f"--cwd {cwd} does not exist. Give a directory that exists")
    if not os.path.isdir(cwd):
        raise UsageError(f"--cwd {cwd} is not a directory. Give a directory")
    return cwd


def build_request(opts: SubmitOptions) -> dict[str, Any]:
    """The `submit` request's arguments: jobs, environment and working directory."""
    check_one_node(opts.ntasks, opts.nodes)
    gpus_asked = gpus_and_type(opts)[0]
    gpu_mem_auto = opts.gpu_mem is not None and opts.gpu_mem.strip().lower() == "auto"
    gpu_mem_bytes = None if gpu_mem_auto else size_option(opts.gpu_mem, "--gpu-mem")
    if gpu_mem_bytes is not None and gpu_mem_bytes <= 0:
        raise UsageError(f"--gpu-mem must be more than zero, not {opts.gpu_mem!r}")
    # Asking for GPU memory or for particular GPUs means a GPU: without --gpus, one (of
    # the GPUs --gpu-ids names, say); --gpus N asks for more.
    wants_gpu = (
        gpu_mem_bytes or gpu_mem_auto or any(getattr(opts, name) for name in GPU_CONSTRAINT_OPTIONS)
    )
    gpus = gpus_asked if gpus_asked is not None else (1 if wants_gpu else 0)
    cwd = job_cwd(opts.cwd)
    env = submitting_environment()
    if opts.export is not None:
        env = exported_environment(env, opts.export)
    env.update(env_pairs(opts.env))
    if opts.from_file is not None:
        if opts.command:
            raise UsageError("give either --from-file or a command after `--`, not both")
        from gpusched.client.submit import sweepfile  # noqa: PLC0415 - 13 ms of every submit

        # One template: its lines follow in a stream (client/streamedrequest.py), read as sent.
        command = sweepfile.SHELL
    elif opts.command:
        command = list(opts.command)
    else:
        raise UsageError(
            "no command to run; put it after `--`, e.g. "
            "`gpusched submit --gpus 1 -- python train.py`"
        )
    extra = {
        **scheduling_fields(opts),
        **container_field(opts),
        **_output_fields(opts, cwd, command),
    }
    if gpu_mem_auto:
        extra["gpu_mem_auto"] = True
    jobs = [
        {
            "command": command,
            "name": opts.name,
            "gpus": gpus,
            "gpu_mem_bytes": gpu_mem_bytes,
            "priority": opts.priority - (opts.nice or 0),
            **extra,
        }
    ]
    request: dict[str, Any] = {"jobs": jobs, "env": env, "cwd": cwd}
    if opts.cluster:
        request["cluster"] = opts.cluster
    # The daemon checks a request against its limits and says which one it is over; a
    # sweep is checked here too, before its lines stream (each as it is read and sent).
    if opts.from_file is not None:
        from gpusched.client.submit import sweepfile  # noqa: PLC0415 - 13 ms of every submit

        check_limits(request)
        array = extra.get("array")
        request["lines"] = sweepfile.sweep_lines(
            opts.from_file, len(array["indices"]) if array else 1
        )
    return request


def _output_fields(opts: SubmitOptions, cwd: str, command: list[str]) -> dict[str, str]:
    """-o, -e and --open-mode as the job spec's fields; {} (and no import) for none."""
    if opts.output is None and opts.error is None and opts.open_mode is None:
        return {}
    # 14 ms of every submit (outpattern, jobname): only for -o/-e
    from gpusched.client.submit.outputs import output_fields  # noqa: PLC0415
    from gpusched.core.spec.jobname import program_name  # noqa: PLC0415

    return output_fields(
        opts.output, opts.error, opts.open_mode, cwd, opts.name or program_name(command)
    )


def container_field(opts: SubmitOptions) -> dict[str, Any]:
    """--container IMAGE and its --container-opt options, as the job spec's field; the
    variables --env sets are passed into the container by name (core/spec/container.py)."""
    if opts.container is None:
        if opts.container_opt:
            raise UsageError(
                "--container-opt is an option for the container runtime: add --container IMAGE"
            )
        return {}
    if not opts.container or opts.container.startswith("-"):
        raise UsageError(
            f"--container takes an image name, not {opts.container!r}; give "
            "runtime options with --container-opt"
        )
    by_name = [f"--env={name}" for name in env_pairs(opts.env)]
    return {"container": [opts.container, *by_name, *opts.container_opt]}


def check_limits(request: dict[str, Any]) -> None:
    """Refuse, before sending, a submit over the daemon's limits (which enforces them
    anyway): a sweep's, and one too big to send at all. Checked against the defaults
    first; only a request over one of those reads the config, which may have raised it."""
    from gpusched.core.spec import limits  # noqa: PLC0415 - 10 ms of every submit

    try:
        limits.check_submit(request, limits.DEFAULT)
    except UsageError:
        from gpusched.client.modes import client_paths  # noqa: PLC0415 - with config's
        from gpusched.core.config import load_settings  # noqa: PLC0415 - 70 ms of every submit

        limits.check_submit(
            request, limits.from_settings(load_settings(client_paths().config_file, environ={}))
        )
