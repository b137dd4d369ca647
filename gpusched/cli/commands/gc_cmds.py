"""`gpusched gc`: remove finished jobs past [jobs] keep_finished now, or see what would go."""

from __future__ import annotations

import time
from typing import Any

import typer

from gpusched.cli.common import JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.client.connection import Client
from gpusched.client.submit.submitting import print_json
from gpusched.core.units import duration_human, size_human

app = App()


@app.command()
def gc(
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        "-n",
        help="Only say what would be removed: counts, bytes, oldest and newest.",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Remove old finished jobs now, with their files.

    Those that [jobs] keep_finished or keep_finished_count no longer keeps, with their
    logs and run files.

    The daemon does this by itself at start and every 10 minutes, a little at a time;
    their usage stays in a summary (`gpusched daemon status`). A finished job that a
    pending job depends on, and the elements of an array with elements still active,
    stay. Admins only in system mode.

    \b
    Examples:
      gpusched gc --dry-run
      gpusched gc
    """
    # No timeout: a large removal is done a batch per turn, and answered once done.
    report = Client().call("gc", timeout_s=None, dry_run=dry_run)
    if as_json:
        print_json(report)
        return
    out.print(gc_lines(report))


def gc_lines(report: dict[str, Any]) -> str:
    """The report in words: what went (or would go), and what the settings keep."""
    verb = "would remove" if report["dry_run"] else "removed"
    text = (
        f"{verb} {report['jobs']} finished job(s) and {size_human(report['bytes'])} of their files"
    )
    if report["jobs"]:
        text += (
            f"; they ended between {_when(report['oldest_ended_at'])} and "
            f"{_when(report['newest_ended_at'])}"
        )
    if report["kept_for_dependents"]:
        text += (
            f"\nkept {report['kept_for_dependents']} old job(s) that active jobs depend "
            "on, or whose arrays are still active"
        )
    removed = report.get("removed_so_far") or {}
    if removed.get("jobs"):
        gpu_s = sum(
            sums["gpu_s"] for states in removed["by_user"].values() for sums in states.values()
        )
        text += (
            f"\nusage of the {removed['jobs']} job(s) removed so far is kept: "
            f"{duration_human(gpu_s)} of GPU time (by user and state in `gpusched "
            "daemon status --json`, removed_jobs)"
        )
    keep_s, count = report["keep_finished_s"], report["keep_finished_count"]
    kept = [
        f"for {duration_human(keep_s)}" if keep_s is not None else "",
        f"the newest {count}" if count else "",
    ]
    text += "\nfinished jobs are kept " + (
        " and at most ".join(filter(None, kept)) or "for good ([jobs] keep_finished is off)"
    )
    return text


def _when(epoch_s: float | None) -> str:
    return "?" if epoch_s is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch_s))
