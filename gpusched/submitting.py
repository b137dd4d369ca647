"""Turn `submit` options into the daemon's request, and its replies into exit statuses."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

from gpusched.errors import UsageError
from gpusched.units import parse_size


@dataclass
class SubmitOptions:
    """Everything `gpusched submit` accepts, before it is checked."""

    command: list[str] = field(default_factory=list)
    gpus: int | None = None
    gpu_mem: str | None = None
    name: str = ""
    priority: int = 0
    cwd: str | None = None
    env: list[str] = field(default_factory=list)
    from_file: str | None = None
    wait: bool = False
    json: bool = False


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
    gpus = opts.gpus if opts.gpus is not None else (1 if gpu_mem_bytes else 0)
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
    jobs = [{"command": c, "name": opts.name, "gpus": gpus, "gpu_mem_bytes": gpu_mem_bytes,
             "priority": opts.priority} for c in commands]
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


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def submit_and_report(opts: SubmitOptions) -> int:
    """`gpusched submit`, for the typer command and the fast path alike: one round trip."""
    from gpusched.client import Client

    request = build_request(opts)
    client = Client()
    ids = client.call("submit", **request)["ids"]
    if opts.json:
        print_json({"id": ids[0]} if len(ids) == 1 else {"ids": ids})
    else:
        sys.stdout.write("\n".join(str(i) for i in ids) + "\n")
    sys.stdout.flush()
    if not opts.wait:
        return 0
    jobs = wait_for_jobs(client, ids)
    return next((s for s in map(exit_status, jobs) if s != 0), 0)
