"""Human output of `ls` and `gpus` as plain lines of styled pieces, without rich.

render.py draws these with rich (the typer commands); cli/plainout.py writes the same
lines with SGR codes (the fast command path), so both print the same bytes.
"""

from __future__ import annotations

import time

from gpusched.cli.columns import Column, Plan, fit_line, fit_widths
from gpusched.client.clusterview import cluster_human
from gpusched.client.textcells import (Cell, Line, Seg, command_human, printable,
                                       request_human)
from gpusched.core.units import duration_human, size_human

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STATE_STYLE = {"pending": "yellow", "running": "green", "succeeded": "bold green",
                "failed": "red", "cancelled": "magenta", "timeout": "red", "oom": "red",
                "lost": "red", "cancelling": "magenta", "preempting": "magenta", "gpu_oom": "red"}


def mem_human(job: dict[str, Any]) -> str:
    """Declared host memory, after the peak seen when there is one; '!' when over."""
    declared, peak = job.get("mem_bytes"), job.get("mem_peak_bytes")
    if declared is None:
        return size_human(peak) if peak else "-"
    text = size_human(declared) if not peak else f"{size_human(peak)}/{size_human(declared)}"
    return f"{text}!" if job.get("mem_over") else text


def host_line(host: dict[str, Any]) -> str:
    # GPU jobs that do not wait for cores may hold more than the box has: none are free.
    cpus_free = max(host["cpus"] - host["cpus_reserved"], 0)
    return (f"host: {cpus_free} of {host['cpus']} CPUs free "
            f"({host['cpus_reserved']} reserved by jobs, {host['cpu_used_pct']:.0f}% busy); "
            f"memory {size_human(host['mem_bytes'] - host['mem_reserved_bytes'])} of "
            f"{size_human(host['mem_bytes'])} free for jobs "
            f"({size_human(host['mem_reserved_bytes'])} reserved, "
            f"{size_human(host['mem_used_bytes'])} used on the host)")


def shown_state(job: dict[str, Any]) -> str:
    """The state people read: `cancelling` for a running job that was cancelled and has
    not ended yet (it may ignore SIGTERM until the grace period's SIGKILL); `preempting`
    for one being stopped to go back to the queue (preempted, or requeued)."""
    if job["state"] == "running" and job.get("cancelling"):
        return "cancelling"
    return "preempting" if job["state"] == "running" and job.get("preempting") else job["state"]


def idle_human(job: dict[str, Any], now: float) -> str:
    """Since when a running job's GPUs have all been 0% busy ([idle] after), in words."""
    idle_s = max(0.0, now - job["gpu_idle_since"])
    return f"its GPUs have all been 0% busy for {duration_human(idle_s)}"


def state_human(job: dict[str, Any]) -> str:
    """`ls`'s state: `failed (2)`, `cancelled (signal 15)`, `cancelling`, `running (idle)`."""
    state = shown_state(job)
    if state == "running" and job.get("gpu_idle_since"):
        return "running (idle)"
    if state == "failed" and job["exit_code"] is not None:
        return f"{state} ({job['exit_code']})"
    if job["signal"]:
        return f"{state} (signal {job['signal']})"
    return state


def _state_cell(job: dict[str, Any]) -> Cell:
    if "folded" in job:
        return [(printable(job["folded"]), "")]
    return [(state_human(job), STATE_STYLE.get(shown_state(job), ""))]


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


# How `ls` gives way on a narrow terminal: free text is cut first and the state last;
# CPUS, MEM and PROG go before anything is cut hard; the reason is never dropped.
LS_PLAN = Plan(
    columns=(Column("ID"), Column("USER", 8, 4, 1), Column("NAME", 12, 6, 1),
             Column("STATE", 12, 10, 4), Column("REQUEST", 10, 7, 3), Column("GPUS", 7, 4, 2),
             Column("CPUS", default="1"), Column("MEM", 8, 7, 3, "-"), Column("TIME"),
             Column("PROG", default="-"), Column("REASON / COMMAND")),
    secondary=("PROG", "CPUS", "MEM"), last_resort=("GPUS", "TIME", "REQUEST", "USER", "NAME"),
    last_wanted=20, last_least=8)


def _ls_cells(job: dict[str, Any], now: float, max_chars: int) -> list[Cell]:
    if job["state"] == "pending":
        elapsed, detail = now - job["submitted_at"], job["pending_reason"]
    else:
        end = job["ended_at"] or now
        elapsed = end - (job["started_at"] or end)
        # A job whose shim died says what is being done instead: its processes stopped.
        detail = job["end_reason"] if job.get("shim_lost") else \
            command_human(job["command"], max_chars)
    if job.get("cluster"):  # handed to Slurm: where it is there, and how fresh that is
        detail = f"{cluster_human(job['cluster'], now)} · {detail}"
    mem = mem_human(job)
    texts = [str(job["id"]), job["user"], job["name"], None,
             request_human(job["gpus_requested"], job["gpu_mem_bytes"]),
             ",".join(str(i) for i in job["gpu_indices"]) or "-", str(job.get("cpus", 1)),
             None, duration_human(elapsed), progress_human(job.get("progress")),
             detail]
    # Cut before escaping: a field of 100,000 characters costs no more than the width.
    cells = [[(printable(text[:max_chars]), "")] if text is not None else [] for text in texts]
    cells[3] = _state_cell(job)
    cells[7] = [(mem, "red" if job.get("mem_over") else "")]
    return cells


def ls_lines(jobs: list[dict[str, Any]], width: int = 1000, now: float | None = None
             ) -> list[Line]:
    """`ls`: one line per job within `width` columns (a pipe gets 1000: one job a line)."""
    now = time.time() if now is None else now
    rows = [_ls_cells(job, now, width) for job in jobs]
    widths, gap = fit_widths(LS_PLAN, rows, width)
    header = [[(column.header, "bold")] for column in LS_PLAN.columns]
    return [fit_line(line, widths, gap) for line in [header, *rows]]


def progress_human(progress: dict[str, Any] | None, with_message: bool = False,
                   now: float | None = None) -> str:
    """A running job's last gpusched.job.progress() report: "42%" ("-" without one)."""
    if not progress:
        return "-"
    parts = [f"{progress['fraction'] * 100:.0f}%"]
    if with_message:
        ago_s = max(0.0, (time.time() if now is None else now) - progress["updated_at"])
        parts += [progress["message"], f"({duration_human(ago_s)} ago)"]
    return printable(" ".join(p for p in parts if p))




# `gpus`: the columns of its two tables, and each row's cells as text (style "red" for a
# GPU's health problem). Both tables print these; render.py with rich, plainout.py without.
GPU_COLUMNS = ("GPU", "NAME", "MEMORY USED / RESERVED / TOTAL", "UTIL", "HEALTH", "JOBS")
PROCESS_COLUMNS = ("GPU", "PID", "USER", "JOB", "GPU MEM", "COMMAND")


def gpu_row(gpu: dict[str, Any]) -> list[Seg]:
    memory = (f"{size_human(gpu['mem_used_bytes'])} / {size_human(gpu['mem_reserved_bytes'])}"
              f" / {size_human(gpu['mem_total_bytes'])}")
    util = "N/A" if gpu["util_pct"] is None else f"{gpu['util_pct']:.0f}%"
    health = ("ok", "") if gpu["healthy"] else (printable(gpu["health_reason"] or "lost"), "red")
    jobs = ",".join(str(j) for j in gpu["jobs"]) or "-"
    label = gpu["label"]
    if gpu.get("mig_mode"):  # given out only as its MIG devices, listed under it
        jobs = "MIG mode"
    elif gpu.get("parent_uuid"):
        label = f"└ {label}"
    return [(label, ""), (printable(gpu["name"]), ""), (memory, ""), (util, ""), health,
            (jobs, "")]


def process_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for gpu in result["gpus"]:
        for proc in gpu["processes"]:
            pid = str(proc["pid"]) if proc["visible"] else f"{proc['pid']} (other namespace)"
            job = str(proc["job"]) if proc["job"] is not None else "external"
            rows.append([gpu["label"], pid, printable(proc["user"] or "?"), job,
                         size_human(proc["used_mem_bytes"]), printable(proc["command"] or "?")])
    return rows


def write_problem_line(problem: dict[str, Any] | None) -> str | None:
    """Why the daemon cannot write its queue (from `status` or `ls`), or None."""
    if not problem:
        return None
    since = time.strftime("%H:%M:%S", time.localtime(problem.get("since") or time.time()))
    return (f"the queue cannot be written since {since}: {problem['cause']}; submits and "
            f"changes are refused until it can. {problem['remedy']}.")
