"""`ls` options as the `list` request's filters, and its plain columns for scripts (--format)."""

from __future__ import annotations

import pwd
import time

from gpusched.client.textcells import job_label, shell_quote
from gpusched.core.errors import UsageError
from gpusched.core.spec.syntax import items
from gpusched.core.users import current_user_name

# No typing, and jobfilter (which imports the job model) only when an option needs it:
# the fast command path imports this module for every `ls`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# -- --format ----------------------------------------------------------------------------


def slurm_duration(seconds: float | None) -> str:
    """Slurm's time format: M:SS, H:MM:SS, D-HH:MM:SS."""
    if seconds is None:
        return "N/A"
    minutes, secs = divmod(int(max(0.0, seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def compact_size(num_bytes: int | None) -> str:
    """Sizes as Slurm prints them, without a space: 512M, 20G, 1.5T."""
    if not num_bytes:
        return "N/A"
    for power, unit in ((4, "T"), (3, "G"), (2, "M"), (1, "K")):
        scale = 1024**power
        if num_bytes >= scale:
            value = num_bytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{num_bytes}B"


def _timestamp(seconds: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds)) if seconds else "N/A"


def _used_s(job: dict[str, Any], now: float) -> float | None:
    if job["started_at"] is None:
        return None if job["state"] != "pending" else 0.0
    used: float = (job["ended_at"] or now) - job["started_at"]
    return used


def _left(job: dict[str, Any], now: float) -> str:
    if job["time_limit_s"] is None:
        return "UNLIMITED"
    used = _used_s(job, now) or 0.0
    return slurm_duration(job["time_limit_s"] - used)


def _reason(job: dict[str, Any]) -> str:
    reason: str = job["pending_reason"] if job["state"] == "pending" else job["end_reason"]
    return reason


def _exit_code(job: dict[str, Any]) -> str:
    if job["exit_code"] is None and not job["signal"]:
        return "N/A"
    return f"{job['exit_code'] or 0}:{job['signal'] or 0}"


def _compact(state: str) -> str:
    from gpusched.core.jobfilter import COMPACT  # noqa: PLC0415 - jobfilter: 65 ms (the job model)

    return COMPACT.get(state, state)


def _progress(job: dict[str, Any]) -> str:
    progress = job.get("progress")
    return f"{progress['fraction'] * 100:.0f}%" if progress else "N/A"


# Field name (Slurm's squeue --Format name where it has one) -> its value for a job.
FIELDS: dict[str, Callable[[dict[str, Any], float], Any]] = {
    "jobid": lambda j, now: j["id"],
    "jobarrayid": lambda j, now: job_label(j),
    "arrayjobid": lambda j, now: j["array_id"],
    "arraytaskid": lambda j, now: j["array_index"],
    "name": lambda j, now: j["name"],
    "username": lambda j, now: j["user"],
    "userid": lambda j, now: j["uid"],
    "state": lambda j, now: j["state"],
    "statecompact": lambda j, now: _compact(j["state"]),
    "reason": lambda j, now: _reason(j),
    "exitcode": lambda j, now: _exit_code(j),
    "priority": lambda j, now: j["priority"],
    "gpus": lambda j, now: j["gpus_requested"],
    "gpumem": lambda j, now: compact_size(j["gpu_mem_bytes"]),
    "gpuids": lambda j, now: ",".join(j.get("gpu_labels") or map(str, j["gpu_indices"])),
    "cpus": lambda j, now: j["cpus"],
    "minmemory": lambda j, now: compact_size(j["mem_bytes"]),
    "timeused": lambda j, now: slurm_duration(_used_s(j, now)),
    "timelimit": lambda j, now: (
        slurm_duration(j["time_limit_s"]) if j["time_limit_s"] is not None else "UNLIMITED"
    ),
    "timeleft": _left,
    "submittime": lambda j, now: _timestamp(j["submitted_at"]),
    "starttime": lambda j, now: _timestamp(j["started_at"]),
    "endtime": lambda j, now: _timestamp(j["ended_at"]),
    "dependency": lambda j, now: ",".join(j["dependencies"]),
    "progress": lambda j, now: _progress(j),
    "workdir": lambda j, now: j["cwd"],
    "command": lambda j, now: " ".join(map(shell_quote, j["command"])),
}
ALIASES = {
    "user": "username",
    "uid": "userid",
    "id": "jobid",
    "st": "statecompact",
    "numcpus": "cpus",
    "mem": "minmemory",
    "time": "timeused",
    "nodelist": "gpuids",
    "cwd": "workdir",
}
DEFAULT_FORMAT = "jobid,username,name,state,gpus,gpuids,timeused,reason"


def parse_fields(text: str) -> list[str]:
    """'JobID,user,State' -> ['jobid', 'username', 'state']; a wrong one names the valid ones."""
    fields = []
    for item in items(text):
        name = ALIASES.get(item.lower(), item.lower())
        if name not in FIELDS:
            raise UsageError(f"--format: no field {item!r}; choose from {', '.join(FIELDS)}")
        fields.append(name)
    if not fields:
        raise UsageError(f"--format wants field names like {DEFAULT_FORMAT}, not {text!r}")
    return fields


def _cell(value: Any) -> str:
    # One line per job and no empty cell, so that `awk '{print $3}'` finds the third field.
    text = "N/A" if value is None or value == "" else str(value)
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split()) or "N/A"


def format_rows(
    jobs: list[dict[str, Any]], fields: list[str], header: bool = True, now: float | None = None
) -> str:
    """Plain columns, each as wide as its widest cell, two spaces apart; the last unpadded."""
    now = time.time() if now is None else now
    rows = [[_cell(FIELDS[f](job, now)) for f in fields] for job in jobs]
    if header:
        rows.insert(0, [f.upper() for f in fields])
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(len(fields) - 1)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]) for row in rows]
    return "\n".join(lines) + "\n"


def request_filters(
    users: str | None, me: bool, states: str | None, names: str | None
) -> dict[str, list[str]]:
    """`ls` options as the `list` request's filters, checked before the daemon is asked."""
    args: dict[str, list[str]] = {}
    wanted = items(users) if users is not None else []
    for name in wanted:
        try:
            pwd.getpwnam(name)
        except KeyError:
            if not name.isdigit():  # a job of a deleted user shows its uid
                raise UsageError(f"--user: no user {name!r} on this machine") from None
    if users is not None and not wanted:
        raise UsageError(f"--user wants user names like alice,bob, not {users!r}")
    if wanted or me:
        args["users"] = wanted + ([current_user_name()] if me else [])
    if states is not None:
        from gpusched.core.jobfilter import parse_states  # noqa: PLC0415 - as COMPACT's

        args["states"] = parse_states(states)
    if names is not None:
        args["names"] = items(names)
        if not args["names"]:
            raise UsageError(f"--name wants names or patterns like 'sweep-*', not {names!r}")
    return args
