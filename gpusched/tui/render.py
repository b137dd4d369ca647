"""Pure rendering for `gpusched top`: render(snapshot, view, width, height) -> a rich renderable."""

from __future__ import annotations

import io
import textwrap
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console

from gpusched.client.clusterview import cluster_human
from gpusched.client.textcells import job_label
from gpusched.core.units import duration_human, size_human
from gpusched.tui import draw
from gpusched.tui.draw import Cell, Column, Frame, Line, Row, printable

if TYPE_CHECKING:
    from gpusched.core.models import GpuInfo, GpuProcess
    from gpusched.tui.model import Snapshot, TopJob, ViewState

FULL_MIN_COLS = 140
COMPACT_MIN_COLS = 80
SORT_KEYS = ("gpu", "gpu-mem", "cpu", "time")
_BAR_CELLS = {"full": 10, "compact": 6, "minimal": 5}
_GIB = 2**30
COMMAND_MAX_CHARS = 500  # wider than any terminal: the cell is cut to its column anyway


def layout_for(width: int) -> str:
    if width >= FULL_MIN_COLS:
        return "full"
    return "compact" if width >= COMPACT_MIN_COLS else "minimal"


# -- header, host line, footer -----------------------------------------------------------
def _load_style(pct: float | None, view: ViewState) -> str:
    if pct is None:
        return "dim"
    return "green" if pct < view.warn_pct else "yellow" if pct < view.crit_pct else "red"


def _pct(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else 100.0 * part / whole


def _gib_pair(used: int | None, total: int | None) -> str:
    return "N/A" if used is None or not total else f"{used / _GIB:.1f}/{total / _GIB:.1f} GiB"


def _title_line(snapshot: Snapshot, layout: str, width: int) -> Line:
    inv, daemon = snapshot.inventory, snapshot.daemon
    clock = time.strftime("%H:%M:%S", time.gmtime(snapshot.now + snapshot.utc_offset_s))
    items = [f"{snapshot.host.hostname}  {clock}"]
    if daemon is None:
        items.append("daemon not running")
    else:
        counts = {s: sum(j.state == s for j in snapshot.jobs) for s in ("running", "pending")}
        if snapshot.pending_total is not None:  # a long queue: only the first ones came
            counts["pending"] = snapshot.pending_total
        pid = "" if layout == "minimal" else f" (pid {daemon.pid})"
        items += [
            f"{counts['running']} running · {counts['pending']} pending",
            f"daemon up {duration_human(daemon.uptime_s)}{pid}",
        ]
    items.append(
        "simulated GPUs"
        if inv.backend == "simulated"
        else f"driver {inv.driver_version or 'N/A'} · CUDA {inv.cuda_version or 'N/A'}"
    )
    items.append(f"gpusched {snapshot.version}")
    line, used = [("gpusched top", "bold")], len("gpusched top")
    for item in map(printable, items):  # most important first; what does not fit is left out
        if used + 3 + cell_len(item) > width:
            break
        line.append((" │ " + item, ""))
        used += 3 + cell_len(item)
    return line


def _host_line(snapshot: Snapshot, view: ViewState, width: int) -> Line:
    host = snapshot.host
    mem_pct = _pct(host.mem_used_bytes, host.mem_total_bytes)
    mem = _gib_pair(host.mem_used_bytes, host.mem_total_bytes)
    mem += "" if mem_pct is None else f" ({mem_pct:.0f}%)"
    load = "N/A" if host.load_avg is None else " ".join(f"{x:.2f}" for x in host.load_avg)
    return draw.clip(
        [
            ("CPU ", "bold"),
            (
                "N/A" if host.cpu_pct is None else f"{host.cpu_pct:.0f}%",
                _load_style(host.cpu_pct, view),
            ),
            ("  MEM ", "bold"),
            (mem, _load_style(mem_pct, view)),
            ("  LOAD ", "bold"),
            (load, ""),
        ],
        width,
    )


def _footer(view: ViewState, layout: str, width: int) -> Line:
    line: Line = [("PAUSED", "bold reverse yellow"), (" ", "")] if view.paused else []
    if view.only_mine:
        line += [("only mine", "bold reverse cyan"), (" ", "")]
    keys = "q quit  p pause  u mine  s sort  ? help" if layout != "minimal" else "q p u s ?"
    line += [
        (f"sort: {SORT_KEYS[view.sort_index % len(SORT_KEYS)]}", "bold"),
        ("  ", ""),
        (keys, "dim"),
    ]
    return draw.clip(line, width)


def _wrapped(text: str, width: int, max_lines: int, style: str) -> list[Line]:
    lines = textwrap.wrap(printable(text), max(10, width), max_lines=max_lines, placeholder=" ...")
    return [[(line, style)] for line in lines]


# -- the panels --------------------------------------------------------------------------
_COLUMNS = {
    ("gpus", "full"): draw.columns(
        "GPU>|NAME<|BUS-ID<|TEMP>|POWER>|MEMORY<|RESERVED>|UTIL<|HEALTH<1"
    ),
    ("gpus", "compact"): draw.columns("GPU>|NAME<|MEMORY<|UTIL<|HEALTH<1"),
    ("gpus", "minimal"): draw.columns("GPU>|MEMORY<|UTIL<|HEALTH<1"),
    ("processes", "full"): draw.columns(
        "GPU>|PID>|USER<|JOB<|GPU MEM>|CPU>|HOST MEM>|TIME>|COMMAND<1"
    ),
    ("processes", "compact"): draw.columns("GPU>|PID>|USER<|JOB<|GPU MEM>|CPU>|TIME>|COMMAND<1"),
    ("processes", "minimal"): draw.columns("GPU>|PID>|USER<|JOB<|GPU MEM>|COMMAND<1"),
    ("pending", "full"): draw.columns("ID>|USER<|NAME<1|REQUEST<|PRIO>|WAITED>|REASON<3"),
    ("pending", "compact"): draw.columns("ID>|USER<|NAME<1|REQUEST<|PRIO>|WAITED>|REASON<3"),
    ("pending", "minimal"): draw.columns("ID>|USER<|NAME<1|REQUEST<|REASON<3"),
}


def _bar(pct: float | None, reserved_pct: float | None, cells: int, style: str) -> Cell:
    """Used, then reserved (promised to jobs still starting), then free; blank if unknown."""
    if pct is None:
        return [(" " * cells, "")]
    used = min(cells, round(pct * cells / 100))
    reserved = min(cells - used, round((reserved_pct or 0.0) * cells / 100))
    free = cells - used - reserved
    return [("█" * used, style), ("▒" * reserved, "magenta"), ("░" * free, "dim")]


def _gpu_items(snapshot: Snapshot, _view: ViewState) -> list[tuple[GpuInfo, bool]]:
    """Every GPU, each followed by its MIG devices: (device, is_mig)."""
    return [
        row
        for gpu in snapshot.inventory.gpus
        for row in [(gpu, False)] + [(mig, True) for mig in gpu.mig_devices]
    ]


def _gpu_row(
    snapshot: Snapshot, view: ViewState, layout: str, item: tuple[GpuInfo, bool]
) -> dict[str, Any]:
    gpu, is_mig = item
    cells, reserved = _BAR_CELLS[layout], snapshot.reserved_bytes.get(gpu.uuid, 0)
    mem_pct = _pct(gpu.mem_used_bytes, gpu.mem_total_bytes)
    util = "N/A" if gpu.util_pct is None else f"{gpu.util_pct:3.0f}%"
    power = "N/A" if gpu.power_w is None else f"{gpu.power_w:.0f}W / {gpu.power_limit_w or 0:.0f}W"
    shared = {  # a MIG device shares these with its parent GPU: shown once, on the parent
        "BUS-ID": (gpu.bus_id or "N/A").removeprefix("00000000:"),
        "POWER": power,
        "TEMP": "N/A" if gpu.temperature_c is None else f"{gpu.temperature_c}C",
    }
    return {
        "GPU": draw.c(f" └ {gpu.label}" if is_mig else gpu.label),
        "NAME": draw.c(gpu.name.removeprefix("NVIDIA ")),
        **{key: draw.c("" if is_mig else value) for key, value in shared.items()},
        "MEMORY": _bar(
            mem_pct, _pct(reserved, gpu.mem_total_bytes), cells, _load_style(mem_pct, view)
        )
        + [(" " + _gib_pair(gpu.mem_used_bytes, gpu.mem_total_bytes), "")],
        "RESERVED": draw.c(size_human(reserved) if reserved else "-"),
        "UTIL": _bar(gpu.util_pct, 0.0, cells, _load_style(gpu.util_pct, view))
        + [(" " + util, "")],
        "HEALTH": (
            draw.c("ok", "green")
            if gpu.is_healthy
            else draw.c(gpu.health_reason or "lost", "bold red")
        )
        + ([] if is_mig else _reserved_mark(snapshot, gpu.index)),
        "": "" if gpu.is_healthy else "red",
    }


def _reserved_mark(snapshot: Snapshot, index: int) -> Cell:
    """The GPU's reservation now, or its next one: ` [demo]`, or ` [demo 14:00]` to come."""
    held = [r for r in snapshot.gpu_reservations if index in r[1]]
    if not held:
        return []
    name, _, start, _ = min(held, key=lambda r: r[2])
    if start <= snapshot.now:
        return [(f" [{name}]", "bold magenta")]
    local = time.gmtime(start + snapshot.utc_offset_s)
    when = time.strftime("%H:%M" if start - snapshot.now < 86400 else "%a %H:%M", local)
    return [(f" [{name} {when}]", "magenta")]


class _NoHost:
    """The host side of a process that could not be read: every field N/A."""

    cpu_pct = rss_bytes = started_at = None


def _proc_items(snapshot: Snapshot, view: ViewState) -> list[tuple[str, GpuProcess]]:
    """(GPU label, process) for every process the view shows, in its sort order."""
    found = [
        (order, gpu.label, proc)
        for order, gpu in enumerate(snapshot.inventory.schedulable())
        for proc in gpu.processes
        if not view.only_mine or proc.user == view.my_user
    ]
    host = snapshot.proc_host
    keys: dict[str, Callable[[tuple[int, str, GpuProcess]], tuple[float, float]]] = {
        "gpu": lambda f: (f[0], f[2].pid),
        "gpu-mem": lambda f: (-(f[2].used_mem_bytes or 0), f[0]),
        "cpu": lambda f: (-(host.get(f[2].pid, _NoHost).cpu_pct or 0.0), f[0]),
        "time": lambda f: (host.get(f[2].pid, _NoHost).started_at or float("inf"), f[0]),
    }
    found.sort(key=keys[SORT_KEYS[view.sort_index % len(SORT_KEYS)]])
    return [(label, proc) for _, label, proc in found]


def _proc_row(
    snapshot: Snapshot, view: ViewState, _layout: str, item: tuple[str, GpuProcess]
) -> dict[str, Any]:
    label, proc = item
    host, job_id = snapshot.proc_host.get(proc.pid, _NoHost), snapshot.pid_jobs.get(proc.pid)
    user, command = proc.user or "?", proc.command or "?"
    if not proc.is_visible:  # NVML gives host pids; one from another namespace still counts
        user, command = "?", "(pid in another namespace)"
    started = host.started_at
    row = {
        "GPU": label,
        "PID": proc.pid,
        "USER": user,
        "JOB": "external" if job_id is None else job_id,
        "GPU MEM": size_human(proc.used_mem_bytes),
        "CPU": "N/A" if host.cpu_pct is None else f"{host.cpu_pct:.0f}%",
        "HOST MEM": size_human(host.rss_bytes),
        "TIME": "N/A" if started is None else duration_human(snapshot.now - started),
        "COMMAND": command,
    }
    return {
        **{k: draw.c(v) for k, v in row.items()},
        "": "" if proc.is_visible and proc.user == view.my_user else "dim",
    }


def _job_items(state: str) -> Callable[[Snapshot, ViewState], list[TopJob]]:
    def items(snapshot: Snapshot, view: ViewState) -> list[TopJob]:
        jobs = [
            j
            for j in snapshot.jobs
            if j.state == state and (not view.only_mine or j.uid == view.my_uid)
        ]
        # Pending in the order placement considers them: priority, then age.
        return sorted(
            jobs, key=(lambda j: (-j.priority, j.id)) if state == "pending" else (lambda j: j.id)
        )

    return items


def _running_columns(jobs: list[TopJob], layout: str) -> tuple[Column, ...]:
    spec = "ID>|USER<|NAME<1" + (
        "|STATE<" if any(j.cancelling or j.preempting or j.gpu_idle_since for j in jobs) else ""
    )
    spec += "|GPUS<|TIME>"
    if layout != "minimal":
        spec += "|GPU MEM USED/ASKED>"
        if layout == "full" or any(j.progress_pct is not None for j in jobs):
            spec += "|PROGRESS<1" if layout == "full" else "|PROGRESS<"
    return draw.columns(spec + ("|COMMAND<2" if layout == "full" else ""))


def _observed_bytes(snapshot: Snapshot, job: TopJob) -> int:
    """GPU memory the job's processes hold now, over all its GPUs (its MIG devices too)."""
    return sum(
        proc.used_mem_bytes or 0
        for gpu in snapshot.inventory.schedulable()
        if gpu.index in job.gpu_indices
        for proc in gpu.processes
        if snapshot.pid_jobs.get(proc.pid) == job.id
    )


def _running_row(snapshot: Snapshot, view: ViewState, _layout: str, job: TopJob) -> dict[str, Any]:
    limit = "" if job.time_limit_s is None else f" / {duration_human(job.time_limit_s)}"
    asked = (
        "whole"
        if job.gpu_mem_bytes is None
        else size_human(job.gpu_mem_bytes * len(job.gpu_indices))
    )
    used = _observed_bytes(snapshot, job) if job.gpu_indices else None
    labels = {gpu.uuid: gpu.label for gpu in snapshot.inventory.schedulable()}  # MIG: 1/2
    gpus = [labels.get(uuid, "?") for uuid in job.gpu_uuids] or list(map(str, job.gpu_indices))
    row = {
        "ID": job_label(job),
        "USER": job.user,
        "NAME": job.name,
        "STATE": _running_state(job),
        "GPUS": ",".join(gpus) or "-",
        "TIME": duration_human(snapshot.now - (job.started_at or snapshot.now)) + limit,
        "GPU MEM USED/ASKED": "-" if used is None else f"{size_human(used)} / {asked}",
        "PROGRESS": "-"
        if job.progress_pct is None
        else f"{job.progress_pct:.0f}% {job.progress_message}".rstrip(),
        "COMMAND": _cluster_prefix(snapshot, job)
        + draw.command_human(job.command, COMMAND_MAX_CHARS),
    }
    cells = {k: draw.c(v) for k, v in row.items()}
    if job.cancelling or job.preempting:
        cells["STATE"] = draw.c(_running_state(job), "magenta")
    elif job.gpu_idle_since is not None:  # GPUs held at 0% busy ([idle] after)
        cells["STATE"] = draw.c("idle", "yellow")
    if job.gpu_mem_over and used is not None:  # more than it asked for ([memory] gpu_over)
        cells["GPU MEM USED/ASKED"] = draw.c(f"{row['GPU MEM USED/ASKED']}!", "red")
    return {**cells, "": _owner_style(job, view)}


def _cluster_prefix(snapshot: Snapshot, job: TopJob) -> str:
    """`hpc 123 RUNNING, as of 4s ago · ` before a cluster job's command or reason."""
    return f"{cluster_human(job.cluster, snapshot.now)} · " if job.cluster else ""


def _running_state(job: TopJob) -> str:
    return "cancelling" if job.cancelling else "preempting" if job.preempting else "running"


def _owner_style(job: TopJob, view: ViewState) -> str:
    return "" if job.uid == view.my_uid else "dim"


def _pending_row(snapshot: Snapshot, view: ViewState, _layout: str, job: TopJob) -> dict[str, Any]:
    row = {
        "ID": job_label(job),
        "USER": job.user,
        "NAME": job.name,
        "REQUEST": draw.request_human(job.gpus_requested, job.gpu_mem_bytes, "no GPU"),
        "PRIO": job.priority,
        "WAITED": duration_human(snapshot.now - job.submitted_at),
        "REASON": _cluster_prefix(snapshot, job) + (job.pending_reason or "-"),
    }
    return {**{k: draw.c(v) for k, v in row.items()}, "": _owner_style(job, view)}


# name -> (title, items of the view, one item's cells by column, "" the row's style)
_PANELS: dict[str, tuple[str, Callable[..., list[Any]], Callable[..., dict[str, Any]]]] = {
    "gpus": ("GPUs", _gpu_items, _gpu_row),
    "processes": ("Processes ({n}) by {sort}", _proc_items, _proc_row),
    "running": ("Running ({n})", _job_items("running"), _running_row),
    "pending": ("Pending ({n})", _job_items("pending"), _pending_row),
}
_HELP = (
    ("q", "quit (Ctrl-C too)"),
    ("p", "pause / resume refreshing"),
    ("u", "only my jobs and processes / everyone's"),
    ("s", f"sort the processes by: {', '.join(SORT_KEYS)}"),
    ("?", "show / hide this help"),
)


def _help(view: ViewState, width: int) -> list[Line]:
    notes = (
        f"Load colours: green below {view.warn_pct:.0f}%, yellow below "
        f"{view.crit_pct:.0f}%, red above. ▒ in a memory bar: reserved for jobs still "
        "starting. Dimmed: other users. JOB 'external': a process that gpusched did not "
        "start."
    )
    rows: list[Row] = [([draw.c(key, "bold"), draw.c(meaning)], "") for key, meaning in _HELP]
    rows += [([draw.c(""), draw.c(line)], "") for line in textwrap.wrap(notes, max(20, width - 9))]
    return draw.panel("Help", draw.columns("KEY<|MEANING<1"), rows, 0, width)


def _services_text(services: tuple[tuple[str, int, int, float, float | None, int], ...]) -> str:
    """One line for the services: replicas ready of wanted, load, p95 through the door."""
    return "Services: " + "; ".join(
        f"{name} {ready}/{wanted} ready, {rps:.1f} req/s, "
        f"p95 {'-' if p95 is None else f'{p95:.0f}ms'}, {in_flight} in flight"
        for name, wanted, ready, rps, p95, in_flight in services
    )


def render(snapshot: Snapshot, view: ViewState, width: int, height: int | None) -> Frame:
    """One frame for a terminal of width x height; height None shows every row (--once)."""
    layout = layout_for(width)
    top = [_title_line(snapshot, layout, width), _host_line(snapshot, view, width)]
    if snapshot.banner:
        top += _wrapped(snapshot.banner, width, 2, "bold black on yellow")
    if snapshot.inventory.problem:
        top += _wrapped(f"No GPUs: {snapshot.inventory.problem}", width, 3, "bold red")
    if snapshot.services:
        top += _wrapped(_services_text(snapshot.services), width, 2, "cyan")
    footer = _footer(view, layout, width)
    if view.show_help:
        return Frame(top + _help(view, width) + [footer])
    items = {name: get(snapshot, view) for name, (_, get, _) in _PANELS.items()}
    wanted = {name: len(found) for name, found in items.items() if found}
    shown = wanted if height is None else draw.fit_rows(wanted, height - len(top) - 1)
    sort, body = SORT_KEYS[view.sort_index % len(SORT_KEYS)], []
    for name in (n for n in _PANELS if n in shown):  # drawn in this order, whatever fitted
        title, _, to_row = _PANELS[name]
        columns = (
            _running_columns(items[name], layout) if name == "running" else _COLUMNS[name, layout]
        )
        rows = [to_row(snapshot, view, layout, item) for item in items[name][: shown[name]]]
        total = _panel_total(snapshot, view, name, len(items[name]))
        body += draw.panel(
            title.format(n=total, sort=sort),
            columns,
            [([row[c[0]] for c in columns], row[""]) for row in rows],
            total - shown[name],
            width,
        )
    return Frame(top + body + [footer])


def _panel_total(snapshot: Snapshot, view: ViewState, name: str, listed: int) -> int:
    """How many jobs a panel stands for: of a long queue, the daemon sends the first
    pending ones and counts the rest."""
    total = snapshot.pending_mine if view.only_mine else snapshot.pending_total
    return listed if name != "pending" or total is None else max(total, listed)


def to_text(renderable: Any, width: int) -> str:
    """A frame as plain text (no colour, no escapes), trailing spaces trimmed: --once, tests."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        color_system=None,
        force_terminal=False,
        legacy_windows=False,
        highlight=False,
        soft_wrap=False,
        _environ={},
    )
    console.print(renderable)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
