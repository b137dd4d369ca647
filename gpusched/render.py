"""Human output of the listing commands (`ls`, `show`, `gpus`, `daemon status`) with rich."""

from __future__ import annotations

import time
from typing import Any

from rich.markup import escape
from rich.table import Table

from gpusched.units import duration_human, size_human

_STATE_STYLE = {"pending": "yellow", "running": "green", "succeeded": "bold green",
                "failed": "red", "cancelled": "magenta", "timeout": "red", "oom": "red",
                "lost": "red"}


def safe(text: str) -> str:
    """Markup-free and control-free: job names and commands come from users."""
    cleaned = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return escape(cleaned)


def request_human(job: dict[str, Any]) -> str:
    n = job["gpus_requested"]
    if n == 0:
        return "-"
    if job["gpu_mem_bytes"] is None:
        return f"{n} GPU" + ("s" if n > 1 else "")
    return f"{n}x{size_human(job['gpu_mem_bytes'])}"


def mem_human(job: dict[str, Any]) -> str:
    """Declared host memory, after the peak seen when there is one; '!' when over."""
    declared, peak = job.get("mem_bytes"), job.get("mem_peak_bytes")
    if declared is None:
        return size_human(peak) if peak else "-"
    text = size_human(declared) if not peak else f"{size_human(peak)}/{size_human(declared)}"
    return f"[red]{text}![/]" if job.get("mem_over") else text


def host_line(host: dict[str, Any]) -> str:
    return (f"host: {host['cpus'] - host['cpus_reserved']} of {host['cpus']} CPUs free "
            f"({host['cpus_reserved']} reserved by jobs, {host['cpu_used_pct']:.0f}% busy); "
            f"memory {size_human(host['mem_bytes'] - host['mem_reserved_bytes'])} of "
            f"{size_human(host['mem_bytes'])} free for jobs "
            f"({size_human(host['mem_reserved_bytes'])} reserved, "
            f"{size_human(host['mem_used_bytes'])} used on the host)")


def _state(job: dict[str, Any]) -> str:
    state = job["state"]
    text = state
    if state in ("failed", "succeeded") and job["exit_code"] is not None:
        text = f"{state} ({job['exit_code']})"
    elif job["signal"]:
        text = f"{state} (signal {job['signal']})"
    style = _STATE_STYLE.get(state)
    return f"[{style}]{text}[/]" if style else text


def fold_arrays(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per array, like squeue: `12_[0-99%8]` with a count per state."""
    out: list[dict[str, Any]] = []
    arrays: dict[int, list[dict[str, Any]]] = {}
    for job in jobs:
        if job.get("array_id") is None:
            out.append(job)
            continue
        if job["array_id"] not in arrays:
            arrays[job["array_id"]] = []
            out.append({"array_rows": arrays[job["array_id"]]})
        arrays[job["array_id"]].append(job)
    return [row if "array_rows" not in row else _folded(row["array_rows"]) for row in out]


def _folded(elements: list[dict[str, Any]]) -> dict[str, Any]:
    first = elements[0]
    indices = [e["array_index"] for e in elements]
    throttle = f"%{first['array_throttle']}" if first.get("array_throttle") else ""
    counts: dict[str, int] = {}
    for e in elements:
        counts[e["state"]] = counts.get(e["state"], 0) + 1
    pending = next((e for e in elements if e["state"] == "pending"), None)
    return {**first, "id": f"{first['array_id']}_[{min(indices)}-{max(indices)}{throttle}]",
            "folded": ", ".join(f"{n} {state}" for state, n in counts.items()),
            "gpu_indices": sorted({i for e in elements if e["state"] == "running"
                                   for i in e["gpu_indices"]}),
            "pending_reason": pending["pending_reason"] if pending else ""}


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    now = time.time()
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("ID", "USER", "NAME", "STATE", "REQUEST", "GPUS", "CPUS", "MEM", "TIME",
                   "PROG", "REASON / COMMAND"):
        table.add_column(column, overflow="fold" if column.startswith("REASON") else "ellipsis",
                         no_wrap=not column.startswith("REASON"))
    for job in jobs:
        if job["state"] == "pending":
            elapsed, detail = now - job["submitted_at"], job["pending_reason"]
        else:
            end = job["ended_at"] or now
            elapsed = end - (job["started_at"] or end)
            detail = " ".join(job["command"])
        gpus = ",".join(str(i) for i in job["gpu_indices"]) or "-"
        state = safe(job["folded"]) if "folded" in job else _state(job)
        table.add_row(str(job["id"]), safe(job["user"]), safe(job["name"]), state,
                      request_human(job), gpus, str(job.get("cpus", 1)), mem_human(job),
                      duration_human(elapsed), progress_human(job.get("progress")), safe(detail))
    return table


def progress_human(progress: dict[str, Any] | None, with_message: bool = False) -> str:
    """A running job's last gpusched.job.progress() report: "42%" ("-" without one)."""
    if not progress:
        return "-"
    parts = [f"{progress['fraction'] * 100:.0f}%"]
    if with_message:
        ago_s = max(0.0, time.time() - progress["updated_at"])
        parts += [progress["message"], f"({duration_human(ago_s)} ago)"]
    return safe(" ".join(p for p in parts if p))


def job_detail(job: dict[str, Any]) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in job.items():
        if key.endswith("_at") and value:
            value = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
        elif key == "progress":
            table.add_row(key, progress_human(value, with_message=True))
            continue
        elif isinstance(value, list):
            value = " ".join(str(v) for v in value)
        table.add_row(key, safe("" if value is None else str(value)))
    return table


def gpus_table(result: dict[str, Any]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("GPU", "NAME", "MEMORY USED / RESERVED / TOTAL", "UTIL", "HEALTH", "JOBS"):
        table.add_column(column)
    for gpu in result["gpus"]:
        memory = (f"{size_human(gpu['mem_used_bytes'])} / {size_human(gpu['mem_reserved_bytes'])}"
                  f" / {size_human(gpu['mem_total_bytes'])}")
        util = "N/A" if gpu["util_pct"] is None else f"{gpu['util_pct']:.0f}%"
        health = "ok" if gpu["healthy"] else f"[red]{safe(gpu['health_reason'] or 'lost')}[/]"
        table.add_row(gpu["label"], safe(gpu["name"]), memory, util, health,
                      ",".join(str(j) for j in gpu["jobs"]) or "-")
    return table


def processes_table(result: dict[str, Any]) -> Table | None:
    rows = [(gpu["label"], p) for gpu in result["gpus"] for p in gpu["processes"]]
    if not rows:
        return None
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("GPU", "PID", "USER", "JOB", "GPU MEM", "COMMAND"):
        table.add_column(column, overflow="ellipsis", no_wrap=True)
    for label, proc in rows:
        pid = str(proc["pid"]) if proc["visible"] else f"{proc['pid']} (other namespace)"
        job = str(proc["job"]) if proc["job"] is not None else "external"
        table.add_row(label, pid, safe(proc["user"] or "?"), job,
                      size_human(proc["used_mem_bytes"]), safe(proc["command"] or "?"))
    return table


def status_lines(status: dict[str, Any]) -> list[str]:
    gpus = f"{status['gpu_count']} GPU(s) via {status['backend']}"
    if status.get("gpu_problem"):
        gpus += f" ({status['gpu_problem']})"
    return [
        f"gpusched daemon {status['version']} running, pid {status['pid']}, "
        f"up {duration_human(status['uptime_s'])}",
        f"GPUs: {gpus}",
        f"jobs: {status['running']} running, {status['pending']} pending"
        + (" (draining)" if status.get("draining") else ""),
        f"scheduling: policy {status.get('policy')}, discipline {status.get('discipline')}",
        host_line(status["host"]),
        f"host memory limits: {status.get('mem_enforcement')}",
        f"state: {status['state_dir']}",
        f"socket: {status['socket']}",
    ]
