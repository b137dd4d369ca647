"""Turn `submit` options into the daemon's request, and its replies into exit statuses."""

from __future__ import annotations

import json
import os
import sys

from gpusched import syntax
from gpusched.errors import GpuschedError, UsageError, detach_stdout
from gpusched.units import parse_duration, parse_size

# typing is imported only by type checkers: the submit fast path imports this module, and
# typing would cost every submit several ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable


class SubmitOptions:
    """Everything `gpusched submit` accepts, before it is checked.

    A plain class, not a dataclass: the submit fast path imports this module, and the
    dataclasses machinery alone would cost every submit about 15 ms of start-up.
    """

    # Each option and its default; the lists are copied per instance.
    DEFAULTS: dict = {
        "command": [], "gpus": None, "gpu_mem": None, "name": "", "priority": 0, "cwd": None,
        "env": [], "from_file": None, "wait": False, "json": False, "hold": False,
        "after": [], "dependency": [], "kill_on_invalid_dep": False, "array": None,
        "time": None, "signal": None, "retries": 0, "retry_on": None, "policy": None,
        "gpu_ids": None, "exclude_gpus": None, "gpu_type": None, "min_gpu_total_mem": None,
        "min_compute_capability": None, "cpus": 1, "mem": None,
    }

    def __init__(self, **values: Any):
        unknown = values.keys() - self.DEFAULTS.keys()
        if unknown:
            raise TypeError(f"unknown submit options: {sorted(unknown)}")
        for name, default in self.DEFAULTS.items():
            value = values.get(name, default)
            setattr(self, name, list(value) if isinstance(default, list) else value)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.DEFAULTS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubmitOptions) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return f"SubmitOptions({self.as_dict()!r})"


# The options that choose among the GPUs (SubmitOptions fields).
GPU_CONSTRAINT_OPTIONS = ("gpu_ids", "exclude_gpus", "gpu_type", "min_gpu_total_mem",
                          "min_compute_capability")


def _env_pairs(pairs: Iterable[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env wants NAME=VALUE, not {pair!r}")
        out[key] = value
    return out


def _from_file_lines(path: str) -> list[str]:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --from-file {path}: {exc}") from None
    lines = [line.strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _index_list(text: str | None, option: str) -> list[int]:
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option} wants GPU indices like 0,2, not {text!r}") from None


def _size(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _capability(text: str | None) -> list[int] | None:
    if not text:
        return None
    major, _, minor = text.partition(".")
    if not major.isdigit() or not (minor or "0").isdigit():
        raise UsageError(f"--min-compute-capability wants MAJOR.MINOR like 8.0, not {text!r}")
    return [int(major), int(minor or 0)]


def scheduling_fields(opts: SubmitOptions) -> dict[str, Any]:
    """The Slurm-style options of a job spec: hold, dependencies, arrays, limits, constraints."""
    spec: dict[str, Any] = {
        "cpus": opts.cpus, "mem_bytes": _size(opts.mem, "--mem"),
        "hold": opts.hold, "kill_on_invalid_dep": opts.kill_on_invalid_dep,
        "dependencies": [list(d) for d in syntax.parse_dependencies(opts.after, opts.dependency)],
        "retries": opts.retries, "policy": opts.policy or "",
        "constraints": {"gpu_ids": _index_list(opts.gpu_ids, "--gpu-ids"),
                        "exclude_gpus": _index_list(opts.exclude_gpus, "--exclude-gpus"),
                        "gpu_type": opts.gpu_type or "",
                        "min_gpu_total_mem_bytes": _size(opts.min_gpu_total_mem,
                                                         "--min-gpu-total-mem") or 0,
                        "min_compute_capability": _capability(opts.min_compute_capability)},
    }
    if opts.retry_on:
        spec["retry_on"] = [r.strip() for r in opts.retry_on.split(",") if r.strip()]
    if opts.time is not None:
        try:
            spec["time_limit_s"] = parse_duration(opts.time)
        except ValueError as exc:
            raise UsageError(f"--time: {exc}") from None
    if opts.signal is not None:
        if opts.time is None:
            raise UsageError("--signal warns before the time limit: add --time")
        try:
            spec["warn_signal"], spec["warn_before_s"] = syntax.parse_signal_spec(opts.signal)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if opts.array is not None:
        indices, throttle = syntax.parse_array(opts.array)
        spec["array"] = {"indices": list(indices), "throttle": throttle}
    return spec


def build_request(opts: SubmitOptions) -> dict[str, Any]:
    """The `submit` request's arguments: jobs, environment and working directory."""
    if opts.gpus is not None and opts.gpus < 0:
        raise UsageError(f"--gpus must be 0 or more, not {opts.gpus}")
    gpu_mem_bytes = None
    if opts.gpu_mem is not None:
        try:
            gpu_mem_bytes = parse_size(opts.gpu_mem)
        except ValueError as exc:
            raise UsageError(f"--gpu-mem: {exc}") from None
        if gpu_mem_bytes <= 0:
            raise UsageError(f"--gpu-mem must be more than zero, not {opts.gpu_mem!r}")
    # Asking for GPU memory or for particular GPUs means a GPU: without --gpus, one (of
    # the GPUs --gpu-ids names, say); --gpus N asks for more.
    wants_gpu = gpu_mem_bytes or any(getattr(opts, name) for name in GPU_CONSTRAINT_OPTIONS)
    gpus = opts.gpus if opts.gpus is not None else (1 if wants_gpu else 0)
    cwd = os.path.abspath(opts.cwd) if opts.cwd else os.getcwd()
    if not os.path.isdir(cwd):
        raise UsageError(f"--cwd {cwd} is not a directory")
    env = dict(os.environ)
    env.update(_env_pairs(opts.env))
    if opts.from_file is not None:
        if opts.command:
            raise UsageError("give either --from-file or a command after `--`, not both")
        # Each line is a shell command, as a sweep file would hold it.
        commands = [["/bin/sh", "-c", line] for line in _from_file_lines(opts.from_file)]
        if not commands:
            raise UsageError(f"--from-file {opts.from_file} has no commands")
    elif opts.command:
        commands = [list(opts.command)]
    else:
        raise UsageError("no command to run; put it after `--`, e.g. "
                         "`gpusched submit --gpus 1 -- python train.py`")
    extra = scheduling_fields(opts)
    jobs = [{"command": c, "name": opts.name, "gpus": gpus, "gpu_mem_bytes": gpu_mem_bytes,
             "priority": opts.priority, **extra} for c in commands]
    return {"jobs": jobs, "env": env, "cwd": cwd}


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
        result = client.call("wait", timeout_s=None, ids=ids)
        if result["done"]:
            return result["jobs"]


def _jobs_named(ids: list[int]) -> str:
    if len(ids) == 1:
        return f"job {ids[0]}"
    listed = ", ".join(map(str, ids)) if len(ids) <= 5 else f"{ids[0]} to {ids[-1]}"
    return f"jobs {listed}"


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def submit_and_report(opts: SubmitOptions) -> int:
    """`gpusched submit`, for the typer command and the fast path alike: one round trip."""
    from gpusched.client import Client

    request = build_request(opts)
    client = Client()
    ids = client.call("submit", **request)["ids"]
    try:
        if opts.json:
            print_json({"id": ids[0]} if len(ids) == 1 else {"ids": ids})
        else:
            sys.stdout.write("\n".join(str(i) for i in ids) + "\n")
        sys.stdout.flush()
    except (OSError, AttributeError, ValueError):  # no stdout (closed), or a closed pipe
        detach_stdout()
        # The jobs are queued whatever became of the output: name them where it can be read.
        raise GpuschedError(f"queued {_jobs_named(ids)}, but could not print "
                            f"{'its id' if len(ids) == 1 else 'their ids'}: standard output "
                            "is closed") from None
    if not opts.wait:
        return 0
    jobs = wait_for_jobs(client, ids)
    return next((s for s in map(exit_status, jobs) if s != 0), 0)
