"""`gpusched usage`: who used the GPUs, and how much, over a period."""

from __future__ import annotations

import time
from typing import Any

from gpusched.cli import cmdoptions
from gpusched.cli.commands.history_cmds import peak_share
from gpusched.cli.commands.submit_cmds import with_options
from gpusched.cli.common import out
from gpusched.cli.helpformat import App
from gpusched.cli.views.columns import Column, Plan, fit_line, fit_widths
from gpusched.cli.views.plainout import Screen
from gpusched.client.connection import Client
from gpusched.client.submit.submitting import print_json
from gpusched.core.errors import UsageError
from gpusched.core.units import duration_human, parse_duration, size_human

app = App()
GROUPINGS = (
    "user",
    "name",
)  # daemon/observe/usage.py's, written out: the CLI does not import the daemon
GIB = 1024**3


@app.command()
@with_options(cmdoptions.USAGE)
def usage(**options: Any) -> None:
    """Who used the GPUs, and how much.

    GPU time, observed GPU memory over time, jobs by state, the mean queue wait, and GPU
    memory asked for against used, per user (or per job name).

    GPU-h is each job's run times its GPUs, cut to the period; MEM GiB-h is the peak GPU
    memory seen on one of its GPUs times its GPUs times its run (an upper estimate: only
    the peak is kept). A running job counts its run so far. Jobs that [jobs]
    keep_finished removed are counted only in a report of all time by user: their usage
    is kept per user and final state, without the times.

    PEAK/ASK is the jobs' GPU memory peaks as a share of what they asked for per GPU
    (--gpu-mem; a whole GPU asks for all of its memory); ASK>2X counts the jobs that
    asked for more than twice their peak, of those with both known.

    With [quotas] in the daemon's config, a second table shows each limit that applies
    now to you and to each user with jobs in the queue, what they use of it, and the
    quota it comes from.

    \b
    Examples:
      gpusched usage --since 7d
      gpusched usage --by name --json
    """
    since, by, as_json = options["since"], options["by"], options["as_json"]
    if by not in GROUPINGS:
        raise UsageError(f"--by {by!r}: choose one of {', '.join(GROUPINGS)}")
    since_s = None
    if since is not None:
        try:
            since_s = parse_duration(since)
        except ValueError as exc:
            raise UsageError(f"--since {since!r}: {exc}; write e.g. 7d or 12h") from None
    report = Client().call("usage", since_s=since_s, by=by)
    if as_json:
        print_json(report)
        return
    out.print(usage_text(report, Screen().width), markup=False, highlight=False)


def _plan(key_header: str) -> Plan:
    """How the table gives way on a narrow terminal, as `ls` does (cli/views/columns.py): the
    states are cut first, then the names; the memory-hours and the wait go before that."""
    return Plan(
        columns=(
            Column(key_header, 12, 6, 1),
            *(Column(header) for header in ("JOBS", "GPU-H", "MEM GiB-H", "MEAN WAIT")),
            Column("PEAK/ASK"),
            Column("ASK>2X"),
            Column("STATES"),  # every job counted, running ones too: not only ended
        ),
        secondary=("MEM GiB-H", "MEAN WAIT"),
        last_resort=(),
        last_wanted=20,
        last_least=12,
    )


def usage_text(report: dict[str, Any], width: int = 1000) -> str:
    """The report as a table within `width` columns, a total line, and what it leaves out."""
    plan = _plan("USER" if report["by"] == "user" else "NAME")
    rows = [_cells(line) for line in report["groups"]]
    rows.append(_cells({**report["total"], "key": "total"}))
    cells = [[[(str(text), "")] for text in row] for row in rows]
    titles = [[(column.header, "")] for column in plan.columns]
    widths, gap = fit_widths(plan, cells, width)
    lines = ["".join(text for text, _ in fit_line(row, widths, gap)) for row in [titles, *cells]]
    since = report["since"]
    lines.insert(
        0,
        "usage "
        + (
            "of all time"
            if since is None
            else f"since {time.strftime('%Y-%m-%d %H:%M', time.localtime(since))}"
        ),
    )
    removed = report["removed_jobs"]
    if removed["jobs"] and not removed["included"]:
        lines.append(
            f"not counted: {removed['jobs']} job(s) removed by [jobs] keep_finished "
            "(their usage is kept per user, without times: see `gpusched usage` "
            "with no --since)"
        )
    return "\n".join(lines + quota_lines(report.get("quotas") or []))


def quota_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Use against each quota that applies now: a table after the usage's."""
    if not rows:
        return []
    head = ("USER", "QUOTA", "USED", "LIMIT", "FROM")
    cells = [
        (
            r["user"],
            r["key"],
            *(
                (size_human(r["used"]), size_human(r["limit"]))
                if r["key"] == "max_gpu_mem"
                else (str(r["used"]), str(r["limit"]))
            ),
            r["scope"] + _when(r),
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *cells]]
    return ["", "quotas now", *table]


def _when(row: dict[str, Any]) -> str:
    if row["until"] is None:
        return ""
    return (
        f" ({row['window']}, until {row['until']})" if row["window"] else f" (until {row['until']})"
    )


def _cells(line: dict[str, Any]) -> tuple[str, int, str, str, str, str, str, str]:
    sizing = line.get("right_sizing") or {"jobs": 0}
    states = " ".join(f"{state} {count}" for state, count in line["states"].items())
    wait = "-" if line["mean_wait_s"] is None else duration_human(line["mean_wait_s"])
    return (
        line["key"] or "(no name)",
        line["jobs"],
        f"{line['gpu_seconds'] / 3600:.2f}",
        f"{line['gpu_mem_byte_seconds'] / GIB / 3600:.2f}",
        wait,
        peak_share(sizing.get("asked_bytes"), sizing.get("peak_bytes")),
        f"{sizing['over_asked']}/{sizing['jobs']}" if sizing["jobs"] else "-",
        states or "-",
    )
