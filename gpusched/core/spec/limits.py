"""Size limits on every request (command, cwd, environment, name, jobs per submit, JSON
nesting) and on what one user may keep queued (daemon/requests/quotas.py).

The daemon enforces them all (a client can be bypassed), and its refusal names the limit;
the client checks the same before it streams a sweep's lines, and for a request too big
to send at all. Kept light: a `submit --from-file` imports this module.
"""

from __future__ import annotations

import re

from gpusched.core.errors import ProtocolError, UsageError
from gpusched.core.record import Record
from gpusched.core.units import parse_size

TYPE_CHECKING = False  # not typing: 12 ms of `submit --from-file` (client/submit/sweepfile.py)
if TYPE_CHECKING:
    from typing import Any


class Limits(Record):
    __slots__ = (
        "command_bytes",
        "cwd_bytes",
        "env_bytes",
        "name_bytes",
        "jobs",
        "json_depth",
        "queued_jobs",
        "queued_bytes",
    )
    command_bytes: int
    cwd_bytes: int
    env_bytes: int
    name_bytes: int
    jobs: int
    json_depth: int
    queued_jobs: int
    queued_bytes: int


# [limits] key -> (Settings field, default as written in TOML, highest value allowed, what
# it bounds). The highest values keep one listed job (whose command, cwd and name a reply
# carries, escaped up to six times over in JSON) well under the 16 MiB frame.
CONFIG: dict[str, tuple[str, str | int, int, str]] = {
    "command": (
        "limit_command_bytes",
        "128KiB",
        2 * 2**20,
        "Bytes of a job's command line, all its arguments together.",
    ),
    "cwd": (
        "limit_cwd_bytes",
        "4KiB",
        64 * 2**10,
        "Bytes of a job's working directory path (Linux's PATH_MAX is 4 KiB).",
    ),
    "env": (
        "limit_env_bytes",
        "1MiB",
        8 * 2**20,
        "Bytes of a job's environment, all NAME=VALUE pairs together.",
    ),
    "name": ("limit_name_bytes", "256B", 4 * 2**10, "Bytes of a job's --name."),
    "jobs": (
        "limit_jobs",
        100_000,
        1_000_000,
        "Jobs one submit queues (array elements times --from-file lines), and job ids "
        "one request names.",
    ),
    "json_depth": (
        "limit_json_depth",
        32,
        500,
        "How deeply a request's JSON may nest objects and lists.",
    ),
    # Per user, over all their submits (daemon/requests/quotas.py): what one user may keep on the
    # daemon's disk and in its memory.
    "queued_jobs": (
        "limit_queued_jobs",
        200_000,
        10**9,
        "Jobs one user may have pending, held or running at once.",
    ),
    "queued_bytes": (
        "limit_queued_bytes",
        "512MiB",
        2**40,
        "Bytes one user's pending, held and running jobs may store: each job's "
        "command, environment, working directory and name.",
    ),
}
DEFAULT = Limits(*(parse_size(default) for _, default, _, _ in CONFIG.values()))


def from_settings(settings: object) -> Limits:
    """The limits a Settings holds (core.config.Settings: its limit_* fields)."""
    return Limits(*(getattr(settings, field) for field, *_ in CONFIG.values()))


def text_bytes(text: str) -> int:
    # surrogatepass: a JSON string may hold a lone surrogate, which plain UTF-8 refuses.
    return len(text.encode("utf-8", "surrogatepass"))


def over(what: str, size: int, limit: int, key: str, unit: str = "bytes") -> UsageError:
    return UsageError(
        f"{what} is {size:,} {unit}, over the limit of {limit:,} ({key} in the "
        "daemon's config); make it smaller, or ask the daemon's admin to "
        f"raise {key}"
    )


def check_owner(env: object, cwd: object, limits: Limits) -> None:
    """The submit's environment and working directory, which every job of it shares."""
    if isinstance(cwd, str) and (size := text_bytes(cwd)) > limits.cwd_bytes:
        raise over("the working directory", size, limits.cwd_bytes, "limits.cwd")
    if isinstance(env, dict):
        size = sum(
            text_bytes(k) + 1 + text_bytes(v)
            for k, v in env.items()
            if isinstance(k, str) and isinstance(v, str)
        )
        if size > limits.env_bytes:
            raise over("the job environment (all NAME=VALUE)", size, limits.env_bytes, "limits.env")


def check_spec(spec: object, limits: Limits) -> None:
    """One job spec's command and name (the types are core.jobspec's to check)."""
    if not isinstance(spec, dict):
        return
    command = spec.get("command")
    if isinstance(command, list):
        size = sum(text_bytes(arg) for arg in command if isinstance(arg, str))
        if size > limits.command_bytes:
            raise over("the command", size, limits.command_bytes, "limits.command")
    name = spec.get("name")
    if isinstance(name, str) and (size := text_bytes(name)) > limits.name_bytes:
        raise over("the job name", size, limits.name_bytes, "limits.name")


def job_count(specs: list[Any]) -> int:
    """How many jobs the specs queue: one each, or one per array index."""
    total = 0
    for spec in specs:
        array = spec.get("array") if isinstance(spec, dict) else None
        indices = array.get("indices") if isinstance(array, dict) else None
        total += len(indices) if isinstance(indices, list) else 1
    return total


def check_job_count(count: int, limits: Limits) -> None:
    """How many jobs one submit queues (array elements times commands)."""
    if count > limits.jobs:
        raise over("the submit", count, limits.jobs, "limits.jobs", unit="jobs")


def check_submit(args: dict[str, Any], limits: Limits) -> None:
    """A whole `submit` request: how many jobs, and each one's sizes."""
    specs = args.get("jobs")
    if not isinstance(specs, list):
        return
    check_job_count(job_count(specs), limits)
    check_owner(args.get("env"), args.get("cwd"), limits)
    for spec in specs:
        check_spec(spec, limits)


def check_ids(ids: object, limits: Limits) -> None:
    if isinstance(ids, list) and len(ids) > limits.jobs:
        raise over("the list of job ids", len(ids), limits.jobs, "limits.jobs", unit="ids")


# A JSON string, escapes included: what is inside one is never structure. (Compiled
# where the daemon needs it: every submit imports this module, and re costs it 4 ms.)
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_AS_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")  # open: +1, close: -1 (after -1)


def json_depth(raw: bytes) -> int:
    """How deeply the JSON text nests objects and lists, read from the bytes alone, so
    that a 100,000-deep request is measured without recursing into it."""
    brackets = re.sub(_STRING, b"", raw, flags=re.DOTALL).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for step in brackets.translate(_AS_STEPS):
        depth += step - 1
        if depth > deepest:
            deepest = depth
    return deepest


def check_depth(raw: bytes, max_depth: int) -> None:
    """Refuse a frame nested deeper than max_depth, before json.loads recurses into it."""
    # Cheap first: fewer brackets than the limit cannot nest deeper than it.
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return
    depth = json_depth(raw)
    if depth > max_depth:
        raise ProtocolError(
            f"the request nests {depth:,} levels deep, over the limit of "
            f"{max_depth} (limits.json_depth in the daemon's config)"
        )
