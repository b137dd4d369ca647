"""What `ls`, `show`, `gpus`, `wait`, `cancel`, `hold`, `release` and `logs` do, for the
typer commands and the fast command path alike: each asks the daemon once and prints
through views/plainout.Screen (the one renderer of both paths), and returns the exit status.

No typer or rich here, and heavy modules only where an option needs them: the fast path
runs these on every call.
"""

from __future__ import annotations

import sys

from gpusched.cli.views.plainout import Screen
from gpusched.client.connection import Client
from gpusched.client.textcells import printable
from gpusched.core.errors import ProtocolError, UsageError
from gpusched.core.spec import syntax

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from typing import Any


def print_json(data: object) -> None:
    from gpusched.client.submit.submitting import print_json as write  # noqa: PLC0415 - 0.5 ms; --json only

    write(data)


def list_jobs(
    all_jobs: bool,
    expand: bool,
    as_json: bool,
    users: str | None,
    me: bool,
    states: str | None,
    names: str | None,
    fields: str | None,
    noheader: bool,
    last: int | None = None,
    start: bool = False,
) -> int:
    if as_json and fields is not None:
        raise UsageError("choose one of --json and --format")
    if start and (fields is not None or all_jobs or last is not None):
        raise UsageError("--start lists pending jobs: leave out --all, --last and --format")
    if last is not None and last < 1:
        raise UsageError(f"--last takes a number of jobs, 1 or more, not {last}")
    output = Screen()
    columns: list[str] | None = None
    filters: dict[str, Any] = {}
    if fields is not None or users is not None or me or states is not None or names is not None:
        from gpusched.cli import listing  # noqa: PLC0415 - 1 ms of a plain `ls`: checks, columns

        columns = listing.parse_fields(fields) if fields is not None else None
        filters = listing.request_filters(users, me, states, names)
    # Sent only when given: a daemon older than --last refuses arguments it does not know.
    only: dict[str, Any] = {"last": last} if last is not None else {}
    if start:
        return _list_starts(as_json, filters)
    finished_too = all_jobs or "states" in filters
    if fields is None and not all_jobs and last is None:
        return _list_head(output, expand, as_json, filters)
    if (
        columns is not None
    ):  # --format: however many: the daemon sends them a page at a time, gathered here
        reply = Client().call_paged("list", all=all_jobs, **only, **filters)
        _warn_writes(reply)
        from gpusched.cli.listing import format_rows  # noqa: PLC0415 - as listing above

        sys.stdout.write(format_rows(reply["jobs"], columns, header=not noheader))
        return 0
    from gpusched.cli.views import lsstream  # noqa: PLC0415 - 1.3 ms of a plain `ls`

    pages = _warning_first(Client().stream("list", all=all_jobs, **only, **filters))
    if as_json:
        lsstream.write_json(pages)
    elif not lsstream.draw(output, pages, expand):
        draw_jobs(output, [], expand, bool(filters), finished_too)
    return 0


def _list_starts(as_json: bool, filters: dict[str, Any]) -> int:
    """`ls --start`: the pending jobs with their forecast starts (one dry run of the queue,
    on the daemon's side: core/sched/forecast.py)."""
    from gpusched.cli.views.show import start_lines  # noqa: PLC0415 - as show's

    reply = Client().call_paged("list", start=True, **{**filters, "states": ["pending"]})
    _warn_writes(reply)
    if as_json:
        print_json(reply["jobs"])
    elif reply["jobs"]:
        sys.stdout.write("".join(line + "\n" for line in start_lines(reply["jobs"])))
    else:
        print("no pending jobs" + (" match" if filters else ""))
    return 0


def _list_head(output: Any, expand: bool, as_json: bool, filters: dict[str, Any]) -> int:
    """A plain `ls`: the running jobs, the first pending ones and a line for the rest."""
    from gpusched.cli.views import lsview  # noqa: PLC0415 - 1.3 ms of cancel, hold, wait, logs

    try:
        reply = Client().call_paged("list", pending_rows=lsview.LS_PENDING_ROWS, **filters)
    except ProtocolError as exc:  # a daemon from before pending_rows: it lists them all
        if "pending_rows" not in exc.message:
            raise
        reply = Client().call_paged("list", **filters)
    jobs, more = reply["jobs"], reply.get("more_pending")
    _warn_writes(reply)
    if as_json:  # a list, as ever, unless some pending jobs were left out (README)
        print_json({"jobs": jobs, "more_pending": more} if more else jobs)
        return 0
    draw_jobs(output, jobs, expand, bool(filters), "states" in filters)
    if more:
        output.text(lsview.more_pending_line(more))
    return 0


def _warn_writes(reply: dict[str, Any]) -> None:
    from gpusched.cli.views import lsview  # noqa: PLC0415 - 1.3 ms of cancel, hold, wait, logs

    writes = lsview.write_problem_line(reply.get("write_problem"))
    if writes:  # on stderr: --json and --format output stay what scripts read
        sys.stderr.write(f"Warning: {writes}\n")


def _warning_first(pages: Any) -> Any:
    """The pages, after warning (from the first) when the daemon cannot write its queue."""
    for n, page in enumerate(pages):
        if n == 0:
            _warn_writes(page)
        yield page


def draw_jobs(
    output: Any, jobs: list[dict[str, Any]], expand: bool, filtered: bool, finished_too: bool
) -> None:
    """`ls`'s table, or what it says when no job is listed."""
    from gpusched.cli.views import lsview  # noqa: PLC0415 - 1.3 ms of cancel, hold, wait, logs

    if jobs:
        output.lines(lsview.ls_lines(jobs if expand else lsview.fold_arrays(jobs), output.width))
    elif filtered:
        output.text(
            "no jobs match" + ("" if finished_too else " (--all looks at finished ones too)")
        )
    else:
        output.text(
            "no jobs" if finished_too else "no pending or running jobs (--all shows finished ones)"
        )


def show(job_id: str, as_json: bool) -> int:
    from gpusched.cli.views.show import job_lines  # noqa: PLC0415 - 2 ms of every other command

    job = Client().call("show", ids=[syntax.job_id_text(job_id)])["jobs"][0]
    if as_json:
        print_json(job)
    else:
        sys.stdout.write("".join(line + "\n" for line in job_lines(job)))
    return 0


def change(command: str, job_ids: list[str], **args: Any) -> int:
    """Print what happened to each job; a job that could not be changed is an error line
    on stderr and makes the exit status 1, the others are changed all the same."""
    ids = [syntax.job_id_text(i) for i in job_ids]  # a bad id is refused before any change
    reply = Client().call(command, ids=ids, **args)
    output = Screen()
    for job_id, outcome in reply["results"].items():
        output.text(f"job {job_id}: {outcome}")
    refused = reply.get("refused") or {}
    for job_id, why in refused.items():
        sys.stderr.write(f"Error: job {job_id}: {why}\n")
    return 1 if refused else 0


def wait(job_ids: list[str], notify: bool = False, keep_waiting: bool = False) -> int:
    from gpusched.client.submit.submitting import ended_status, wait_or_explain  # noqa: PLC0415 - 0.5 ms; wait only

    jobs = wait_or_explain(Client(), [syntax.job_id_text(i) for i in job_ids], keep_waiting)
    if notify:
        from gpusched.client.desktop import tell_ended  # noqa: PLC0415 - 17 ms (subprocess); --notify only

        tell_ended(jobs)
    return ended_status(jobs)


def logs(job_id: str, follow: bool, stderr: bool, plain: bool = False) -> int:
    from gpusched.cli.logview import print_log  # noqa: PLC0415 - 0.5 ms; logs only

    print_log(Client(), syntax.job_id_text(job_id), stderr=stderr, follow=follow, plain=plain)
    return 0


def gpus(as_json: bool, query: str | None, fmt: str | None, topology: bool = False) -> int:
    from gpusched.cli.views import gpuquery  # noqa: PLC0415 - 0.3 ms; gpus only

    if query is None and fmt is not None:
        query = gpuquery.DEFAULT_QUERY
    fields = gpuquery.parse_query(query) if query is not None else None
    if topology and fields is not None:
        raise UsageError("--topology prints the link matrix; leave out --query and --format")
    result = Client().call("gpus")
    if topology:
        from gpusched.cli.views import topomatrix  # noqa: PLC0415 - 3 ms; --topo only

        if as_json:
            print_json(topomatrix.matrix(result))
        else:
            sys.stdout.write(topomatrix.render(result))
        return 0
    if fields is not None:
        sys.stdout.write(gpuquery.render(result["gpus"], fields, fmt or "csv"))
        return 0
    if as_json:
        print_json(result)
        return 0
    draw_gpus(Screen(), result)
    return 0


def draw_gpus(output: Any, result: dict[str, Any]) -> None:
    """`gpus`'s tables and host line."""
    from gpusched.cli.views import lsview  # noqa: PLC0415 - 1.3 ms of cancel, hold, wait, logs

    if result["problem"]:
        output.text(f"No GPUs: {printable(result['problem'])}")
    if result["gpus"]:
        output.gpus(result)
    output.text(lsview.host_line(result["host"]))
    output.processes(result)


def cancel(job_ids: list[str]) -> int:
    return change("cancel", job_ids)


def hold(job_ids: list[str]) -> int:
    return change("hold", job_ids)


def release(job_ids: list[str]) -> int:
    return change("release", job_ids)
