"""Turn `submit` options into the daemon's request, and its replies into exit statuses."""

from __future__ import annotations

import os
import sys

from gpusched.client import sweepfile
from gpusched.client.options import RESUBMIT_FIELDS, SubmitOptions
from gpusched.client.outputs import output_fields
from gpusched.client.slurmflags import check_one_node, exported_environment, gres_as_gpus
from gpusched.core import limits, syntax
from gpusched.core.errors import GpuschedError, UsageError, detach_stdout
from gpusched.core.units import parse_duration, parse_size

# typing is imported only by type checkers: the submit fast path imports this module, and
# typing would cost every submit several ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable


# The options that choose among the GPUs (SubmitOptions fields).
GPU_CONSTRAINT_OPTIONS = ("gpu_ids", "exclude_gpus", "gpu_type", "min_gpu_total_mem",
                          "min_compute_capability", "topology")


def _env_pairs(pairs: Iterable[str]) -> dict[str, str]:
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
    """An option's size in bytes (None if not given); a bad one is a UsageError naming it."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _duration(text: str, option: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None
    if seconds > syntax.MAX_DURATION_S:
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
    if opts.gres is not None:
        from_gres = gres_as_gpus(opts.gres)
        if gpus is not None and syntax.parse_gpus(str(gpus)) != syntax.parse_gpus(from_gres):
            raise UsageError(f"--gpus {gpus} and --gres {opts.gres} ask for different GPUs; "
                             "give one of them")
        gpus = from_gres
    if gpus is None:
        return None, gpu_type
    count, named_type = syntax.parse_gpus(str(gpus))
    if named_type and gpu_type and named_type.lower() != gpu_type.lower():
        raise UsageError(f"--gpus {opts.gpus} and --gpu-type {gpu_type} name different GPU "
                         "types; give one of them")
    return count, named_type or gpu_type


def scheduling_fields(opts: SubmitOptions) -> dict[str, Any]:
    """The Slurm-style options of a job spec: hold, dependencies, arrays, limits, constraints."""
    spec: dict[str, Any] = {
        "mem_bytes": None if opts.mem is None else syntax.parse_mem(opts.mem),
        "hold": opts.hold, "kill_on_invalid_dep": opts.kill_on_invalid_dep,
        "dependencies": [list(d) for d in syntax.parse_dependencies(opts.after, opts.dependency)],
        "retries": opts.retries, "policy": opts.policy or "",
        "constraints": {"gpu_ids": _index_list(opts.gpu_ids, "--gpu-ids"),
                        "exclude_gpus": _index_list(opts.exclude_gpus, "--exclude-gpus"),
                        "gpu_type": gpus_and_type(opts)[1],
                        "min_gpu_total_mem_bytes": size_option(opts.min_gpu_total_mem,
                                                               "--min-gpu-total-mem") or 0,
                        "min_compute_capability": _capability(opts.min_compute_capability),
                        "topology": opts.topology or ""},
    }
    if opts.cpus is not None:  # only cores asked for are a limit (see jobspec)
        spec["cpus"] = opts.cpus
    if opts.retry_on:
        spec["retry_on"] = [r.strip() for r in opts.retry_on.split(",") if r.strip()]
    if opts.mem_growth is not None:
        spec["mem_growth"] = _growth(opts.mem_growth)
    if opts.interactive:
        spec["interactive"] = True
    if opts.retry_delay is not None:
        spec["retry_delay_s"] = _duration(opts.retry_delay, "--retry-delay")
    time_limit_s = None if opts.time is None else syntax.parse_time_limit(opts.time)
    if time_limit_s is not None:
        spec["time_limit_s"] = time_limit_s
    if opts.signal is not None:
        if time_limit_s is None:
            raise UsageError("--signal warns before the time limit: add a --time limit "
                             "(not 0 or UNLIMITED)")
        try:
            spec["warn_signal"], spec["warn_before_s"] = syntax.parse_signal_spec(opts.signal)
            if syntax.signal_is_batch_only(opts.signal):
                spec["warn_batch"] = True
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    spec.update(preemption_fields(opts))
    if opts.array is not None:
        indices, throttle = syntax.parse_array(opts.array)
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
                raise UsageError("the current directory no longer exists (was it deleted?), "
                                 "and a job runs where it is submitted. cd to a directory "
                                 "that exists, or give --cwd DIR") from None
            raise UsageError(f"--cwd {option} is relative to the current directory, which no "
                             "longer exists (was it deleted?). cd to a directory that "
                             "exists, or give an absolute --cwd") from None
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
    wants_gpu = gpu_mem_bytes or gpu_mem_auto or any(getattr(opts, name)
                                                      for name in GPU_CONSTRAINT_OPTIONS)
    gpus = gpus_asked if gpus_asked is not None else (1 if wants_gpu else 0)
    cwd = job_cwd(opts.cwd)
    env = submitting_environment()
    if opts.export is not None:
        env = exported_environment(env, opts.export)
    env.update(_env_pairs(opts.env))
    if opts.from_file is not None:
        if opts.command:
            raise UsageError("give either --from-file or a command after `--`, not both")
        # One template: its lines follow in a stream (client/streams.py), read as sent.
        command = sweepfile.SHELL
    elif opts.command:
        command = list(opts.command)
    else:
        raise UsageError("no command to run; put it after `--`, e.g. "
                         "`gpusched submit --gpus 1 -- python train.py`")
    extra = {**scheduling_fields(opts), **container_field(opts),
             **output_fields(opts.output, opts.error, opts.open_mode, cwd,
                             opts.name or os.path.basename(command[0]))}
    if gpu_mem_auto:
        extra["gpu_mem_auto"] = True
    jobs = [{"command": command, "name": opts.name, "gpus": gpus,
             "gpu_mem_bytes": gpu_mem_bytes, "priority": opts.priority - (opts.nice or 0),
             **extra}]
    request = {"jobs": jobs, "env": env, "cwd": cwd}
    if opts.cluster:
        request["cluster"] = opts.cluster
    check_limits(request)
    if opts.from_file is not None:  # each line checked as it is read and sent
        array = extra.get("array")
        request["lines"] = sweepfile.sweep_lines(opts.from_file,
                                                 len(array["indices"]) if array else 1)
    return request


def container_field(opts: SubmitOptions) -> dict[str, Any]:
    """--container IMAGE and its --container-opt options, as the job spec's field; the
    variables --env sets are passed into the container by name (core/container.py)."""
    if opts.container is None:
        if opts.container_opt:
            raise UsageError("--container-opt is an option for the container runtime: add "
                             "--container IMAGE")
        return {}
    if not opts.container or opts.container.startswith("-"):
        raise UsageError(f"--container takes an image name, not {opts.container!r}; give "
                         "runtime options with --container-opt")
    by_name = [f"--env={name}" for name in _env_pairs(opts.env)]
    return {"container": [opts.container, *by_name, *opts.container_opt]}


def check_limits(request: dict[str, Any]) -> None:
    """Refuse, before sending, a submit over the daemon's limits (which enforces them
    anyway). Checked against the defaults first; only a request over one of those reads
    the config, which may have raised it."""
    try:
        limits.check_submit(request, limits.DEFAULT)
    except UsageError:
        from gpusched.client.modes import client_paths
        from gpusched.core.config import load_settings

        limits.check_submit(request, limits.from_settings(
            load_settings(client_paths().config_file, environ={})))


def exit_status(job: dict[str, Any]) -> int:
    """A finished job as a shell exit status: its code, 128+signal, or 1 if it has neither."""
    if job.get("exit_code") is not None:
        return int(job["exit_code"])
    if job.get("signal"):
        return 128 + int(job["signal"])
    return 0 if job.get("state") == "succeeded" else 1


def wait_for_jobs(client: Any, ids: list[int]) -> list[dict[str, Any]]:
    """Block until every job ended; the daemon answers in slices, so ask again until done."""
    while True:
        result = client.call_paged("wait", timeout_s=None, ids=ids)
        if result["done"]:
            return result["jobs"]


def wait_or_explain(client: Any, ids: list[int]) -> list[dict[str, Any]]:
    """wait_for_jobs; on Ctrl-C, say on stderr that the jobs go on and how to cancel them,
    then let KeyboardInterrupt end the command (status 130)."""
    try:
        return wait_for_jobs(client, ids)
    except KeyboardInterrupt:
        sys.stderr.write(_interrupted_note(client, ids) + "\n")
        raise


_NOTE_TIMEOUT_S = 2.0  # leaving a daemon that hangs must not take a second Ctrl-C


def _interrupted_note(client: Any, ids: list[int]) -> str:
    """What became of the jobs a wait was interrupted on: they go on, and how to cancel them."""
    try:
        jobs = client.call_paged("show", timeout_s=_NOTE_TIMEOUT_S, ids=ids)["jobs"]
    except GpuschedError:  # no answer: say what is sure
        jobs = [{"id": i, "state": "unknown"} for i in ids]
    live = [j for j in jobs if j["state"] not in _ENDED]
    if not live:
        return "Interrupted: stopped waiting."
    groups = []
    for state, one, many in _GOING_ON:
        found = [j["id"] for j in live if j["state"] == state]
        if found:
            groups.append(f"{_jobs_named(found)} {one if len(found) == 1 else many}")
    return (f"Interrupted: stopped waiting; {' and '.join(groups)}. "
            f"`{_cancel_command(live, ids)}` cancels "
            f"{'it' if len(live) == 1 else 'them'}.")


_ENDED = ("succeeded", "failed", "cancelled", "timeout", "oom", "lost", "gpu_oom")
_GOING_ON = (("running", "keeps running", "keep running"),
             ("pending", "stays queued", "stay queued"),
             ("unknown", "is still queued or running", "are still queued or running"))


def _cancel_command(jobs: list[dict[str, Any]], waited_ids: list[int]) -> str:
    """`gpusched cancel ...` for these jobs: by the array's id when they are of one array
    whose first element was waited for (`submit --wait --array`)."""
    arrays = {j.get("array_id") for j in jobs}
    if len(jobs) > 1 and len(arrays) == 1 and (array_id := arrays.pop()) in waited_ids:
        return f"gpusched cancel {array_id}"
    return "gpusched cancel " + " ".join(str(j["id"]) for j in jobs)


def _jobs_named(ids: list[int]) -> str:
    if len(ids) == 1:
        return f"job {ids[0]}"
    listed = ", ".join(map(str, ids)) if len(ids) <= 5 else f"{ids[0]} to {ids[-1]}"
    return f"jobs {listed}"


def _id_words(ids: list[int]) -> str:
    """Ids as the shell gives them to a command: a few listed, evenly spaced ones (a
    sweep's) as `$(seq FIRST STEP LAST)`."""
    steps = {b - a for a, b in zip(ids, ids[1:])}
    if len(ids) <= 5 or len(steps) != 1:
        return " ".join(map(str, ids))
    step = steps.pop()
    return f"$(seq {ids[0]} {ids[-1]})" if step == 1 else f"$(seq {ids[0]} {step} {ids[-1]})"


def submit_json(ids: list[int], array_ids: list[int]) -> dict[str, Any]:
    """`submit --json`: {"id": N} for one job, {"ids": [...]} for several, and the id of
    the array ("array_id", or "array_ids" when --from-file made one array per line)."""
    out: dict[str, Any] = {"id": ids[0]} if len(ids) == 1 else {"ids": ids}
    if len(array_ids) == 1:
        out["array_id"] = array_ids[0]
    elif array_ids:
        out["array_ids"] = array_ids
    return out


def ended_status(jobs: list[dict[str, Any]]) -> int:
    """`wait`'s exit status: the first job's that did not succeed (0 if all did). Jobs that
    could not start are named on stderr with the reason, which their 127 cannot tell."""
    unstarted: dict[str, list[int]] = {}
    for job in jobs:
        reason = job.get("end_reason") or ""
        if job.get("state") == "failed" and reason.startswith("cannot start"):
            unstarted.setdefault(reason, []).append(job["id"])
    for reason, ids in unstarted.items():  # "cannot start: why" -> "could not start: why"
        sys.stderr.write(f"Error: {_jobs_named(ids)} could not{reason[len('cannot'):]}\n")
    return next((s for s in map(exit_status, jobs) if s != 0), 0)


def print_json(data: object) -> None:
    import json  # only for --json: json imports re, which costs every command 4 ms

    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def submit_and_report(opts: SubmitOptions) -> int:
    """`gpusched submit`, for the typer command and the fast path alike: one round trip."""
    from gpusched.client.connection import Client
    from gpusched.client.sbatchlines import with_script_options

    try:
        opts = with_script_options(opts, os.getcwd())
    except FileNotFoundError:
        pass  # no current directory: build_request says so
    try:
        request = build_request(opts)
    except KeyboardInterrupt:  # reading --from-file's first lines (a pipe, say)
        if opts.from_file is not None:
            sys.stderr.write(_NOTHING_QUEUED)
        raise
    client = Client()
    lines = request.pop("lines", None)
    if lines is None:
        return report_queued(client, client.call("submit", **request), opts)
    return report_queued(client, submit_streamed(client, request, lines, opts), opts)


_NOTHING_QUEUED = "Interrupted: nothing of this submit was queued.\n"


def submit_streamed(client: Any, request: dict[str, Any], lines: Iterable[str | None],
                    opts: SubmitOptions) -> dict[str, Any]:
    """A --from-file submit, its lines streamed. Ctrl-C asks the daemon to drop it; the
    daemon then says whether it did (nothing queued) or had already queued every job,
    and so does stderr, before the command ends with status 130."""
    from gpusched.client import streams

    try:
        return streams.call_streamed(client, "submit", "lines", lines, **request)
    except streams.Interrupted as stop:
        if stop.reply is not None and stop.reply.get("ok"):
            result = stop.reply["result"]
            report_queued(client, result,
                          SubmitOptions(**{**opts.as_dict(), "wait": False, "notify": False}))
            ids = result["ids"]
            sys.stderr.write(f"Interrupted too late: {_jobs_named(ids)} "
                             f"{'was' if len(ids) == 1 else 'were'} queued already; "
                             f"`gpusched cancel {_id_words(result['array_ids'] or ids)}` "
                             f"cancels {'it' if len(ids) == 1 else 'them'}.\n")
        elif stop.reply is not None or not stop.sent_all:
            sys.stderr.write(_NOTHING_QUEUED)
        else:
            sys.stderr.write("Interrupted: the daemon did not say whether it queued the "
                             "jobs; see `gpusched ls`.\n")
        raise KeyboardInterrupt from None


def report_queued(client: Any, result: dict[str, Any], opts: SubmitOptions) -> int:
    """Print the ids of jobs just queued (as JSON with --json); with --wait, wait for them
    and return the exit status that `submit --wait` gives. An array is named by its id
    alone, as `sbatch --parsable` prints it, so that `jid=$(gpusched submit --array ...)`
    can be given to --dependency, wait or cancel."""
    ids, array_ids = result["ids"], result.get("array_ids", [])
    try:
        if opts.json:
            print_json(submit_json(ids, array_ids))
        else:
            sys.stdout.write("\n".join(str(i) for i in array_ids or ids) + "\n")
        sys.stdout.flush()
    except (OSError, AttributeError, ValueError):  # no stdout (closed), or a closed pipe
        detach_stdout()
        # The jobs are queued whatever became of the output: name them where it can be read.
        raise GpuschedError(f"queued {_jobs_named(ids)}, but could not print "
                            f"{'its id' if len(ids) == 1 else 'their ids'}: standard output "
                            "is closed") from None
    if opts.notify and not opts.wait:
        from gpusched.client.desktop import watch_in_background

        watch_in_background(ids)
    if not opts.wait:
        return 0
    jobs = wait_or_explain(client, ids)
    if opts.notify:
        from gpusched.client.desktop import tell_ended

        tell_ended(jobs)
    return ended_status(jobs)


def resubmit_and_report(job_id: str, opts: SubmitOptions, given: Iterable[str]) -> int:
    """`gpusched resubmit`: the daemon queues the job again from the spec it keeps, with
    the given options changed, read exactly as `submit` reads them."""
    from gpusched.client.connection import Client

    probe = SubmitOptions(**{**opts.as_dict(), "command": ["resubmit"], "cwd": "/", "env": []})
    spec = build_request(probe)["jobs"][0]
    if spec.get("gpu_mem_auto") and "gpu_mem" in given:
        raise UsageError("resubmit --gpu-mem takes a size such as 20G; auto is for submit, "
                         "which estimates from the job's history")
    changes = {RESUBMIT_FIELDS[option]: spec[RESUBMIT_FIELDS[option]] for option in given}
    client = Client()
    return report_queued(client, client.call("resubmit", id=job_id, changes=changes), opts)
