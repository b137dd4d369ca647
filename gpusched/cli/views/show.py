"""Human output of `show`: one job in the shape of `scontrol show job`, values human."""

from __future__ import annotations

import time

from gpusched.cli.views.lsview import idle_human, progress_human, shown_state
from gpusched.client.clusterview import cluster_human
from gpusched.client.textcells import command_human, printable
from gpusched.core.spec.syntax import signal_name
from gpusched.core.units import duration_human, size_human

# No typing, no rich: the fast command path prints `show` with this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

INDENT = "   "
# `show` prints a whole command line (`show --json` has it too): only an absurd one is cut.
COMMAND_MAX_CHARS = 4096


def local_time(epoch_s: float | None) -> str:
    """Local date-time in Slurm's form, 2026-03-01T14:02:09; '-' for none."""
    if epoch_s is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch_s))


def start_human(job: dict[str, Any]) -> str:
    """A pending job's forecast start and its 80 % interval (core/sched/forecast.py)."""
    start = job.get("start_forecast")
    if start is None:
        return "unknown: no dry run of the queue starts it (its pending_reason says why it waits)"
    high = job.get("start_high")
    until = local_time(high) if high is not None else "unknown"
    return f"{local_time(start)} (80 %: {local_time(job.get('start_low'))} to {until})"


def start_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """`ls --start`: each pending job's forecast start and 80 % interval, as squeue --start."""
    header = ("JOBID", "USER", "NAME", "START", "80% FROM", "80% TO")
    rows = [header] + [
        (
            str(job["id"]),
            printable(job["user"]),
            printable(job["name"])[:30],
            local_time(job.get("start_forecast")) if job.get("start_forecast") else "unknown",
            local_time(job.get("start_low")),
            local_time(job.get("start_high")) if job.get("start_high") else "-",
        )
        for job in jobs
    ]
    widths = [max(len(row[n]) for row in rows) for n in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _signal(signum: int | None) -> str:
    return signal_name(signum) if signum else "-"


def _or_dash(value: Any, human: Callable[[Any], str] = str) -> str:
    return "-" if value is None or value == "" or value == [] else human(value)


def _joined(values: list[Any]) -> str:
    return ",".join(str(v) for v in values) or "-"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _constraints(found: dict[str, Any]) -> list[str]:
    """The GPU constraints a job was given, as key=value pairs (none: nothing)."""
    pairs = [
        ("gpu_ids", _joined(found.get("gpu_ids") or [])),
        ("exclude_gpus", _joined(found.get("exclude_gpus") or [])),
        ("gpu_type", found.get("gpu_type") or "-"),
        ("min_gpu_total_mem", _or_dash(found.get("min_gpu_total_mem_bytes") or None, size_human)),
        (
            "min_compute_capability",
            ".".join(map(str, found.get("min_compute_capability") or [])) or "-",
        ),
        ("topology", found.get("topology") or "-"),
    ]
    return [f"{key}={value}" for key, value in pairs if value != "-"]


def _run_time(job: dict[str, Any], now: float) -> str:
    if job["started_at"] is None:
        return "-"
    return duration_human((job["ended_at"] or now) - job["started_at"])


def _pairs(job: dict[str, Any], now: float) -> list[list[str]]:
    """The key=value pairs, a line's worth per group; empty groups are not printed."""
    array = (
        "-"
        if job["array_id"] is None
        else f"{job['array_id']}_{job['array_index']}"
        + (f" (at most {job['array_throttle']} at once)" if job["array_throttle"] else "")
    )
    return [
        [
            f"id={job['id']}",
            f"name={job['name'] or '-'}",
            f"user={job['user']}",
            f"uid={job['uid']}",
            f"state={shown_state(job)}",
        ],
        [
            f"priority={job['priority']}",
            f"held={_yes(job['held'])}",
            f"attempt={job['attempt']}",
            f"retries={job['retries']}",
            f"exit_code={_or_dash(job['exit_code'])}",
            f"signal={_signal(job['signal'])}",
        ],
        [
            f"dependencies={_joined(job['dependencies'])}",
            f"array={array}",
            f"policy={job['policy'] or 'default'}",
        ],
        [
            f"gpus_requested={job['gpus_requested']}",
            f"gpu_mem={_or_dash(job['gpu_mem_bytes'], size_human)}",
            f"cpus={job['cpus']}",
            f"mem={_or_dash(job['mem_bytes'], size_human)}",
        ],
        _constraints(job["constraints"]),
        [
            f"gpu_indices={_joined(job['gpu_indices'])}",
            f"cpu_ids={_joined(job['cpu_ids'])}",
            f"master_port={_or_dash(job['master_port'])}",
        ],
        [
            f"submitted_at={local_time(job['submitted_at'])}",
            *([f"begin_time={local_time(job['begin_time'])}"] if job.get("begin_time") else []),
            *([f"reservation={job['reservation']}"] if job.get("reservation") else []),
            f"started_at={local_time(job['started_at'])}",
        ],
        [
            f"ended_at={local_time(job['ended_at'])}",
            f"run_time={_run_time(job, now)}",
            f"time_limit={_or_dash(job['time_limit_s'], duration_human)}",
            *(
                [f"predicted_time={duration_human(job['predicted_s'])}"]
                if job.get("predicted_s") is not None
                else []
            ),
        ],
        [
            f"warn_signal={_signal(job['warn_signal'])}",
            f"warn_before={duration_human(job['warn_before_s'])}",
        ]
        if job["warn_signal"]
        else [],
        [
            f"mem_peak={_or_dash(job['mem_peak_bytes'], size_human)}",
            f"gpu_mem_peak={_or_dash(job['gpu_mem_peak_bytes'], size_human)}",
            f"mem_over={_yes(job['mem_over'])}",
            *([f"gpu_mem_over={job['gpu_mem_over']}"] if job.get("gpu_mem_over") else []),
        ],
        _preemption_pairs(job),
    ]


def _preemption_pairs(job: dict[str, Any]) -> list[str]:
    """Only for a job that may be preempted or was requeued: the rest never are."""
    if not job.get("preemptible") and not job.get("restarts"):
        return []
    return [
        f"preemptible={_yes(job['preemptible'])}",
        f"preempt_grace={duration_human(job['preempt_grace_s'])}",
        f"restarts={job['restarts']}",
        f"preemptions={job['preemptions']}",
    ]


def _preemption_text(job: dict[str, Any]) -> list[tuple[str, str] | None]:
    """Who preempted whom and when, on both jobs; why it was requeued."""
    by, victims = job.get("preempted_by"), job.get("preempted_jobs")
    return [
        ("preempted_by", f"job {by} at {local_time(job['preempted_at'])}") if by else None,
        (
            "preempted",
            f"job{'s' if len(victims) > 1 else ''} {_joined(victims)} at "
            f"{local_time(job['preempted_jobs_at'])}",
        )
        if victims
        else None,
        ("requeue_reason", job["requeue_reason"]) if job.get("requeue_reason") else None,
    ]


def _free_text(job: dict[str, Any], now: float) -> list[tuple[str, str]]:
    """Values that may hold spaces, each on a line of its own, as scontrol puts Command=."""
    found = [
        ("gpus", _joined(job["gpus"])) if job["gpus"] else None,
        ("cluster", cluster_human(job["cluster"], now)) if job.get("cluster") else None,
        ("progress", progress_human(job.get("progress"), with_message=True, now=now))
        if job.get("progress")
        else None,
        ("pending_reason", job["pending_reason"]) if job["state"] == "pending" else None,
        ("end_reason", job["end_reason"] + _unstored(job)) if job["end_reason"] else None,
        ("start_forecast", start_human(job)) if "start_forecast" in job else None,
        ("gpu_mem_reason", job["gpu_mem_reason"]) if job.get("gpu_mem_reason") else None,
        ("runtime_reason", job["runtime_reason"]) if job.get("runtime_reason") else None,
        ("idle", idle_human(job, now)) if job.get("gpu_idle_since") else None,
        ("gpu_mem_over_by", job["gpu_mem_over_by"]) if job.get("gpu_mem_over_by") else None,
        *_preemption_text(job),
        ("command", command_human(job["command"], COMMAND_MAX_CHARS)),
        (
            "container",
            command_human(
                [job["container"]["image"], *job["container"]["options"]], COMMAND_MAX_CHARS
            ),
        )
        if job.get("container")
        else None,
        ("cwd", job["cwd"]),
        ("stdout_path", job["stdout_path"]),
        ("stderr_path", job["stderr_path"]),
    ]
    return [item for item in found if item is not None]


def _unstored(job: dict[str, Any]) -> str:
    return (
        " (not yet stored: the queue cannot be written; `gpusched daemon status` says why)"
        if job.get("end_unstored")
        else ""
    )


def job_lines(job: dict[str, Any], now: float | None = None) -> list[str]:
    """`show ID`: key=value pairs grouped on lines, free text (reasons, the command, paths)
    on lines of their own. The keys are `show --json`'s names without their unit suffix."""
    now = time.time() if now is None else now
    lines = [" ".join(group) for group in _pairs(job, now) if group]
    lines += [f"{key}={value}" for key, value in _free_text(job, now)]
    return [printable(lines[0])] + [INDENT + printable(line) for line in lines[1:]]
