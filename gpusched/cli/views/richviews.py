"""Human output of the listing commands (`ls`, `gpus`, `daemon status`) with rich.

The lines and cells themselves come from lsview.py (the `gpus` tables' from plainout.py),
which the fast command path draws without rich; the names it defines are imported back here for the modules that use them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpusched.cli.common import out
from gpusched.cli.views.lsview import (  # noqa: F401
    fold_arrays,
    host_line,
    ls_lines,
    mem_human,
    progress_human,
    shown_state,
    state_human,
    write_problem_line,
)
from gpusched.cli.views.plainout import GPU_COLUMNS, PROCESS_COLUMNS, gpu_row, process_rows
from gpusched.client.textcells import Line
from gpusched.core.units import duration_human
from gpusched.tui.draw import Frame


def _plain(text: str) -> Text:
    """A cell of text from elsewhere (GPU names, commands), already printable: never read
    as markup, so `[red]` stays text."""
    return Text(text)


class RichOutput:
    """Output of the commands that the fast path also runs (cli/jobviews.py), with rich:
    the typer commands print through it, and plainout.Screen hands it what it cannot draw
    exactly."""

    def __init__(self, console: Console | None = None):
        self.console = out if console is None else console

    @property
    def width(self) -> int:
        return self.console.width

    def text(self, line: str) -> None:
        self.console.print(line, markup=False)

    def blank(self) -> None:
        self.console.print()

    def lines(self, lines: list[Line]) -> None:
        self.console.print(Frame(lines))

    def gpus(self, result: dict[str, Any]) -> None:
        self.console.print(gpus_table(result))

    def processes(self, result: dict[str, Any]) -> bool:
        """The table of processes, after a blank line; False when there are none."""
        table = processes_table(result)
        if table is None:
            return False
        self.console.print()
        self.console.print(table)
        return True


def jobs_table(jobs: list[dict[str, Any]], width: int = 1000, now: float | None = None) -> Frame:
    """`ls`: one line per job within `width` columns (a pipe gets 1000: one job a line)."""
    return Frame(ls_lines(jobs, width, now))


def gpus_table(result: dict[str, Any]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in GPU_COLUMNS:
        table.add_column(column)
    for gpu in result["gpus"]:
        label, (name, _), memory, util, (health, style), jobs = gpu_row(gpu)
        table.add_row(
            label[0], _plain(name), memory[0], util[0], Text(health, style=style), jobs[0]
        )
    return table


def processes_table(result: dict[str, Any]) -> Table | None:
    rows = process_rows(result)
    if not rows:
        return None
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in PROCESS_COLUMNS:
        table.add_column(column, overflow="ellipsis", no_wrap=True)
    for label, pid, user, job, mem, command in rows:
        table.add_row(label, pid, _plain(user), job, mem, _plain(command))
    return table


def usage_line(usage: dict[str, float], half_life_s: float | None, shown: int = 5) -> str:
    """Fair share's count of GPU time per user, most first: "ada 2h10m, bob 4m05s"."""
    users = sorted(usage, key=lambda user: (-usage[user], user))
    listed = ", ".join(f"{user} {duration_human(usage[user])}" for user in users[:shown])
    if len(users) > shown:
        listed += f" and {len(users) - shown} more"
    return (
        f"GPU time used (fair share, halving every {duration_human(half_life_s)}): "
        f"{listed or 'none yet'}"
    )


def status_lines(status: dict[str, Any]) -> list[str]:
    gpus = f"{status['gpu_count']} GPU(s) via {status['backend']}"
    if status.get("gpu_problem"):
        gpus += f" ({status['gpu_problem']})"
    writes = write_problem_line(status.get("write_problem"))
    return [
        f"gpusched daemon {status['version']} running, pid {status['pid']}, "
        f"up {duration_human(status['uptime_s'])}",
        f"GPUs: {gpus}",
        f"jobs: {status['running']} running, {status['pending']} pending"
        + (" (draining)" if status.get("draining") else ""),
        *([f"writes: FAILING: {writes}"] if writes else []),
        f"scheduling: policy {status.get('policy')}, discipline {status.get('discipline')}",
        host_line(status["host"]),
        usage_line(status.get("fairshare_usage") or {}, status.get("fairshare_half_life_s")),
        f"host memory limits: {status.get('mem_enforcement')}",
        f"state: {status['state_dir']}",
        f"socket: {status['socket']}",
        f"metrics: {status.get('metrics', 'off')}",
    ] + damaged_lines(status.get("damaged_jobs") or [])


def damaged_lines(damaged: list[dict[str, Any]]) -> list[str]:
    """Quarantined rows: skipped, never run; what is wrong with each."""
    if not damaged:
        return []
    lines = [f"damaged jobs: {len(damaged)} skipped and never run (`gpusched doctor` tells more)"]
    return lines + [f"  job {d['id']}: {d['reason']}" for d in damaged]
