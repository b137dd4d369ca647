"""`gpusched doctor`: check the home and say what is wrong; --repair saves what can be saved."""

from __future__ import annotations

import typer

from gpusched.cli.common import JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.client.modes import client_paths, daemon_paths
from gpusched.client.paths import Paths
from gpusched.client.submit.submitting import print_json

app = App()

_MARKS = {"ok": "ok     ", "note": "note   ", "problem": "PROBLEM"}


@app.command()
def doctor(
    repair: bool = typer.Option(
        False,
        "--repair",
        help=(
            "Copy every job that can be saved into a new queue, ids carrying on above the "
            "old ones, and keep the old file beside it (renamed with the time). Only while no "
            "daemon runs."
        ),
    ),
    system: bool = typer.Option(False, "--system", help="Check the system daemon's home."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Check the queue and the jobs' files, and explain.

    The queue file, its rows, the jobs' files and their permissions.

    Exit status 0 when all is well, 1 when something is wrong. It only reads: nothing
    changes unless --repair is given.

    \b
    Examples:
      gpusched doctor
      gpusched daemon stop && gpusched doctor --repair
    """
    paths = daemon_paths(True, False) if system else client_paths()
    if paths.mode == "socket":  # GPUSCHED_SOCKET names the socket only: check the home
        paths = daemon_paths(False, True)
    if repair:
        raise typer.Exit(_repair(paths, as_json))
    from gpusched.store.doctor import diagnose  # noqa: PLC0415 - 33 ms of every typer command

    report = diagnose(paths)
    if as_json:
        print_json(report.to_dict())
    else:
        out.print(f"gpusched doctor: {report.state_dir}", markup=False)
        for finding in report.findings:
            out.print(f"  {_MARKS[finding.status]}  {finding.message}", markup=False)
        verdict = (
            "healthy"
            if report.is_healthy
            else "not healthy: see the PROBLEM lines (`gpusched doctor --repair` saves what it can)"
        )
        out.print(verdict, markup=False)
    raise typer.Exit(0 if report.is_healthy else 1)


def _repair(paths: Paths, as_json: bool) -> int:
    from gpusched.store.repair import repair  # noqa: PLC0415 - 45 ms of every typer command

    result = repair(paths)
    if as_json:
        print_json(result.to_dict())
        return 0
    if not result.repaired:
        out.print(
            f"nothing to repair: the queue at {paths.db} is healthy "
            f"({len(result.saved)} job(s)); nothing was changed",
            markup=False,
        )
        return 0
    out.print(f"repaired {paths.db}: {result.problem or 'damaged rows'}", markup=False)
    shown = ", ".join(map(str, result.saved[:10])) + (" ..." if len(result.saved) > 10 else "")
    out.print(
        f"  saved {len(result.saved)} job(s) (ids {shown or 'none'}) into a new queue; "
        f"new jobs get ids from {result.next_id}",
        markup=False,
    )
    for job_id, reason in sorted(result.left_out.items()):
        out.print(f"  could not save job {job_id}: {reason}", markup=False)
    if result.kept_as:
        out.print(f"  the old file is kept as {result.kept_as}", markup=False)
    return 0
