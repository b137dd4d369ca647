"""Human output of `ls` and `gpus` as plain lines of styled pieces, without rich.

cli/views/plainout.py writes these lines with SGR codes, for the typer commands and the
fast command path alike.
"""

from __future__ import annotations

import time

from gpusched.cli.views.columns import Column, Plan, fit_line, fit_widths
from gpusched.client.clusterview import cluster_human
from gpusched.client.textcells import Cell, Line, command_human, job_label, printable, request_human
from gpusched.core.units import duration_human, size_human

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from typing import Any

STATE_STYLE = {
    "pending": "yellow",
    "running": "green",
    "succeeded": "bold green",
    "failed": "red",
    "cancelled": "magenta",
    "timeout": "red",
    "oom": "red",
    "lost": "red",
    "cancelling": "magenta",
    "preempting": "magenta",
    "gpu_oom": "red",
}


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
    return (
        f"host: {cpus_free} of {host['cpus']} CPUs free "
        f"({host['cpus_reserved']} reserved by jobs, {host['cpu_used_pct']:.0f}% busy); "
        f"memory {size_human(host['mem_bytes'] - host['mem_reserved_bytes'])} of "
        f"{size_human(host['mem_bytes'])} free for jobs "
        f"({size_human(host['mem_reserved_bytes'])} reserved, "
        f"{size_human(host['mem_used_bytes'])} used on the host)"
    )


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
    if state == "running" and job.get("gpu_mem_over_by"):  # over its --gpu-mem (gpu_over)
        return "running (over GPU mem)"
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
    folder = ArrayFolder()
    return folder.feed(jobs) + folder.finish()


class ArrayFolder:
    """fold_arrays() a page at a time (`ls --all` streams its rows): an array's elements
    come one after another in id order, so only the array being read is kept, as counts."""

    def __init__(self) -> None:
        self._open: _Fold | None = None

    def feed(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows these jobs complete: single jobs, and arrays whose last element is read."""
        out: list[dict[str, Any]] = []
        for job in jobs:
            array_id = job.get("array_id")
            if self._open is not None and array_id == self._open.first["array_id"]:
                self._open.add(job)
                continue
            out += self.finish()
            if array_id is None:
                out.append(job)
            else:
                self._open = _Fold(job)
        return out

    def finish(self) -> list[dict[str, Any]]:
        """The array still being read, as its row (when the rows end)."""
        fold, self._open = self._open, None
        return [fold.row()] if fold is not None else []


class _Fold:
    """An array's elements as one row: its index range, a count per state, their GPUs."""

    def __init__(self, first: dict[str, Any]):
        self.first, self.low, self.high = first, first["array_index"], first["array_index"]
        self.counts: dict[str, int] = {}
        self.gpus: set[int] = set()
        self.pending_reason: str | None = None
        self.add(first)

    def add(self, element: dict[str, Any]) -> None:
        self.low, self.high = (
            min(self.low, element["array_index"]),
            max(self.high, element["array_index"]),
        )
        self.counts[element["state"]] = self.counts.get(element["state"], 0) + 1
        if element["state"] == "running":
            self.gpus.update(element["gpu_indices"])
        elif element["state"] == "pending" and self.pending_reason is None:
            self.pending_reason = element["pending_reason"]

    def row(self) -> dict[str, Any]:
        first = self.first
        throttle = f"%{first['array_throttle']}" if first.get("array_throttle") else ""
        return {
            **first,
            "id": f"{first['array_id']}_[{self.low}-{self.high}{throttle}]",
            "folded": ", ".join(f"{n} {state}" for state, n in self.counts.items()),
            "gpu_indices": sorted(self.gpus),
            "pending_reason": self.pending_reason or "",
        }


# How `ls` gives way on a narrow terminal: free text is cut first and the state last;
# CPUS, MEM and PROG go before anything is cut hard; the reason is never dropped. A size
# (REQUEST, MEM) is shown whole or not at all: `1x30.0…` would lose its unit.
LS_PLAN = Plan(
    columns=(
        Column("ID"),
        Column("USER", 8, 4, 1),
        Column("NAME", 12, 6, 1),
        Column("STATE", 12, 10, 4),
        Column("REQUEST"),
        Column("GPUS", 7, 4, 2),
        Column("CPUS", default="1"),
        Column("MEM", default="-"),
        Column("TIME"),
        Column("PROG", default="-"),
        Column("REASON / COMMAND"),
    ),
    secondary=("PROG", "CPUS", "MEM"),
    last_resort=("GPUS", "TIME", "REQUEST", "USER", "NAME"),
    last_wanted=20,
    last_least=12,
)


def _ls_cells(job: dict[str, Any], now: float, max_chars: int) -> list[Cell]:
    if job["state"] == "pending":
        elapsed, detail = now - job["submitted_at"], job["pending_reason"]
    else:
        end = job["ended_at"] or now
        elapsed = end - (job["started_at"] or end)
        # A job whose shim died says what is being done instead: its processes stopped.
        detail = (
            job["end_reason"] if job.get("shim_lost") else command_human(job["command"], max_chars)
        )
    if job.get("cluster"):  # handed to Slurm: where it is there, and how fresh that is
        detail = f"{cluster_human(job['cluster'], now)} · {detail}"
    mem = mem_human(job)
    # A group of an array is named 6_[0-2] already; a job by itself 12, or 51_0.
    texts = [
        job["id"] if isinstance(job["id"], str) else job_label(job),
        job["user"],
        job["name"],
        None,
        request_human(job["gpus_requested"], job["gpu_mem_bytes"]),
        ",".join(job.get("gpu_labels") or map(str, job["gpu_indices"])) or "-",
        str(job.get("cpus", 1)),
        None,
        duration_human(elapsed),
        progress_human(job.get("progress")),
        detail,
    ]
    # Cut before escaping: a field of 100,000 characters costs no more than the width.
    cells = [[(printable(text[:max_chars]), "")] if text is not None else [] for text in texts]
    cells[3] = _state_cell(job)
    cells[7] = [(mem, "red" if job.get("mem_over") else "")]
    return cells


def ls_lines(
    jobs: list[dict[str, Any]], width: int = 1000, now: float | None = None, header: bool = True
) -> list[Line]:
    """`ls`: one line per job within `width` columns (a pipe gets 1000: one job a line),
    under the header line unless told (the later pages of `ls --all`)."""
    now = time.time() if now is None else now
    rows = [_ls_cells(job, now, width) for job in jobs]
    widths, gap = fit_widths(LS_PLAN, rows, width)
    titles = [[(column.header, "bold")] for column in LS_PLAN.columns]
    return [fit_line(line, widths, gap) for line in ([titles] if header else []) + rows]


# A plain `ls` lists at most this many pending jobs (a screenful) and counts the rest
# (daemon/requests/lsqueue.py): a queue of 100,000 lists as fast as a short one. --all lists all.
LS_PENDING_ROWS = 50
_GROUPS_NAMED = 3  # the largest groups the summary line names


def more_pending_line(more: dict[str, Any]) -> str:
    """The pending jobs `ls` left out, in one line: `and 99,880 more pending: 99,880 of
    array 12 (--all lists every job)`."""
    parts = []
    for group in more["groups"][:_GROUPS_NAMED]:
        count = f"{group['count']:,}"
        if group["array_id"] is not None:
            parts.append(f"{count} of array {group['array_id']}")
        elif group["name"]:
            parts.append(f"{count} named {printable(group['name'])} ({printable(group['user'])})")
        else:  # another user's, its name hidden from this caller
            parts.append(f"{count} of {printable(group['user'])}'s jobs")
    others = more["count"] - sum(g["count"] for g in more["groups"][:_GROUPS_NAMED])
    if others:
        parts.append(f"{others:,} others")
    return f"and {more['count']:,} more pending: {', '.join(parts)} (--all lists every job)"


def progress_human(
    progress: dict[str, Any] | None, with_message: bool = False, now: float | None = None
) -> str:
    """A running job's last gpusched.job.progress() report: "42%" ("-" without one)."""
    if not progress:
        return "-"
    parts = [f"{progress['fraction'] * 100:.0f}%"]
    if with_message:
        ago_s = max(0.0, (time.time() if now is None else now) - progress["updated_at"])
        parts += [progress["message"], f"({duration_human(ago_s)} ago)"]
    return printable(" ".join(p for p in parts if p))


def write_problem_line(problem: dict[str, Any] | None) -> str | None:
    """Why the daemon cannot write its queue (from `status` or `ls`), or None."""
    if not problem:
        return None
    since = time.strftime("%H:%M:%S", time.localtime(problem.get("since") or time.time()))
    return (
        f"the queue cannot be written since {since}: {problem['cause']}; submits and "
        f"changes are refused until it can. {problem['remedy']}."
    )
