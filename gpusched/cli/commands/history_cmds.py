"""`gpusched history`: the GPU memory peaks of a job's earlier runs, and the estimate
`--gpu-mem auto` makes of them."""

from __future__ import annotations

from typing import Any

import typer

from gpusched.cli.common import JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.cli.views.show import local_time
from gpusched.client.connection import Client
from gpusched.client.submit.submitting import print_json
from gpusched.core.errors import UsageError
from gpusched.core.sched.memestimate import job_key
from gpusched.core.units import duration_human, size_human

app = App()


@app.command()
def history(
    key: list[str] = typer.Argument(
        ..., metavar="NAME", help="The job's name as ls shows it, or its command (after --)."
    ),
    last: int | None = typer.Option(
        None, "--last", metavar="N", help="The newest N runs (default 20)."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Your earlier finished runs of a job, newest first.

    How each ended and the most GPU memory it used against what it asked for (PEAK/ASK;
    a whole GPU asks for all of its memory), how many runs asked for over twice their
    peak, and what `submit --gpu-mem auto` would ask for now.

    NAME is the job's name as ls shows it: its --name, or without one its program
    (train.py for python train.py). After --, a command lists the runs of that very
    command. The estimate is for the newest run's --name, or its command; only
    successful runs count for it.

    \b
    Examples:
      gpusched history train-resnet
      gpusched history train.py
      gpusched history -- python train.py --lr 0.1
      gpusched history train-resnet --json
    """
    # A command is filed with its program's directory left out and spaces collapsed.
    name = (
        job_key("", key if len(key) > 1 else key[0].split())
        if len(key) > 1 or " " in key[0]
        else key[0]
    )
    if last is not None and last < 1:
        raise UsageError(f"--last wants 1 or more runs, not {last}")
    report = Client().call("history", key=name, last=last)
    if as_json:
        print_json(report)
        return
    out.print(history_text(report), markup=False, highlight=False)


def history_text(report: dict[str, Any]) -> str:
    """The runs as a table, then the estimate and why."""
    head = ("ID", "STATE", "ENDED", "RUN", "GPU_MEM", "GPU_MEM_PEAK", "PEAK/ASK")
    rows = [
        (
            str(run["id"]),
            run["state"],
            local_time(run["ended_at"]),
            duration_human(run["ended_at"] - run["started_at"])
            if run["started_at"] is not None and run["ended_at"] is not None
            else "-",
            size_human(run["gpu_mem_bytes"]) if run["gpu_mem_bytes"] else "whole",
            size_human(run["gpu_mem_peak_bytes"]) if run["gpu_mem_peak_bytes"] else "-",
            peak_share(run.get("gpu_mem_asked_bytes"), run["gpu_mem_peak_bytes"]),
        )
        for run in report["runs"]
    ]
    if not rows:
        lines = [
            f"no finished runs of {report['key']!r} (a job's name as ls shows it, or "
            "its command after --)"
        ]
    else:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [head, *rows]
        ]
    if report.get("right_sizing", {}).get("jobs"):
        lines.append(sizing_line(report["right_sizing"]))
    estimate = report["estimate"]
    key = estimate.get("key", report["key"])
    lines.append(
        f"--gpu-mem auto{f' for {key!r}' if key != report['key'] else ''}: {estimate['reason']}"
    )
    return "\n".join(lines)


def peak_share(asked: int | None, peak: int | None) -> str:
    """The peak as a share of the ask, "-" when either is not known."""
    return f"{peak / asked:.0%}" if asked and peak else "-"


def sizing_line(sizing: dict[str, Any]) -> str:
    """The right-sizing summary (core/sched/rightsize.py's `right_sizing` object)."""
    share = sizing["peak_bytes"] / sizing["asked_bytes"]
    return (
        f"{sizing['over_asked']} of {sizing['jobs']} runs asked for over twice their GPU "
        f"memory peak; peaks were {share:.0%} of asks"
    )
