"""Send a `submit` and turn the daemon's replies into output and exit statuses (the
request itself is built by client/submit/jobrequest.py)."""

from __future__ import annotations

import itertools
import os
import sys

from gpusched.client.connection import Client
from gpusched.client.submit.jobrequest import build_request, check_limits
from gpusched.client.submit.options import RESUBMIT_FIELDS, SubmitOptions
from gpusched.core.errors import GpuschedError, ProtocolError, UsageError, detach_stdout

# typing is imported only by type checkers: the submit fast path imports this module, and
# typing would cost every submit several ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any


def exit_status(job: dict[str, Any]) -> int:
    """An ended job as a shell exit status: 0 only if it succeeded; else its own non-zero
    code, 128+signal, or 1. A job cancelled or timed out that caught its SIGTERM and exited
    0 did not succeed, and a cron script must not read it as success."""
    if job.get("state") == "succeeded":
        return 0
    if job.get("exit_code"):
        return int(job["exit_code"])
    if job.get("signal"):
        return 128 + int(job["signal"])
    return 1


def wait_for_jobs(
    client: Any, ids: Sequence[int | str], keep_waiting: bool = False
) -> list[dict[str, Any]]:
    """Block until every job ended; the daemon answers in slices, so ask again until done.
    A job that can never start (its dependency failed) ends the wait at once with an
    error saying why, unless keep_waiting."""
    args: dict[str, Any] = {"ids": ids, "keep_waiting": True} if keep_waiting else {"ids": ids}
    while True:
        result = client.call_paged("wait", timeout_s=None, **args)
        if result.get("never"):
            job_id, why = result["never"]["id"], result["never"]["reason"]
            raise GpuschedError(
                f"job {job_id} can never start ({why}); `gpusched cancel "
                f"{job_id}` removes it, `gpusched wait --keep-waiting` waits on"
            )
        if result["done"]:
            jobs: list[dict[str, Any]] = result["jobs"]
            return jobs


def wait_or_explain(
    client: Any, ids: Sequence[int | str], keep_waiting: bool = False
) -> list[dict[str, Any]]:
    """wait_for_jobs; on Ctrl-C, say on stderr that the jobs go on and how to cancel them,
    then let KeyboardInterrupt end the command (status 130)."""
    try:
        return wait_for_jobs(client, ids, keep_waiting)
    except KeyboardInterrupt:
        sys.stderr.write(_interrupted_note(client, ids) + "\n")
        raise


_NOTE_TIMEOUT_S = 2.0  # leaving a daemon that hangs must not take a second Ctrl-C


def _interrupted_note(client: Any, ids: Sequence[int | str]) -> str:
    """What became of the jobs a wait was interrupted on: they go on, and how to cancel them."""
    try:
        jobs = client.call_paged("show", timeout_s=_NOTE_TIMEOUT_S, ids=ids)["jobs"]
    except GpuschedError:  # no answer: say what is sure
        jobs = [{"id": i, "state": "unknown"} for i in ids]
    live = [j for j in jobs if j["state"] not in _ENDED]
    if not live:
        return "Interrupted: stopped waiting."
    groups = []
    for state, one, many in _GOING_ON:
        found = [j["id"] for j in live if j["state"] == state]
        if found:
            groups.append(f"{_jobs_named(found)} {one if len(found) == 1 else many}")
    return (
        f"Interrupted: stopped waiting; {' and '.join(groups)}. "
        f"`{_cancel_command(live, ids)}` cancels "
        f"{'it' if len(live) == 1 else 'them'}."
    )


_ENDED = ("succeeded", "failed", "cancelled", "timeout", "oom", "lost", "gpu_oom")
_GOING_ON = (
    ("running", "keeps running", "keep running"),
    ("pending", "stays queued", "stay queued"),
    ("unknown", "is still queued or running", "are still queued or running"),
)


def _cancel_command(jobs: list[dict[str, Any]], waited_ids: Sequence[int | str]) -> str:
    """`gpusched cancel ...` for these jobs: by the array's id when they are of one array
    whose first element was waited for (`submit --wait --array`)."""
    arrays = {j.get("array_id") for j in jobs}
    if len(jobs) > 1 and len(arrays) == 1 and (array_id := arrays.pop()) in waited_ids:
        return f"gpusched cancel {array_id}"
    return "gpusched cancel " + " ".join(str(j["id"]) for j in jobs)


def _jobs_named(ids: list[int]) -> str:
    if len(ids) == 1:
        return f"job {ids[0]}"
    listed = ", ".join(map(str, ids)) if len(ids) <= 5 else f"{ids[0]} to {ids[-1]}"
    return f"jobs {listed}"


def _id_words(ids: list[int]) -> str:
    """Ids as the shell gives them to a command: a few listed, evenly spaced ones (a
    sweep's) as `$(seq FIRST STEP LAST)`."""
    steps = {b - a for a, b in itertools.pairwise(ids)}
    if len(ids) <= 5 or len(steps) != 1:
        return " ".join(map(str, ids))
    step = steps.pop()
    return f"$(seq {ids[0]} {ids[-1]})" if step == 1 else f"$(seq {ids[0]} {step} {ids[-1]})"


def submit_json(ids: list[int], array_ids: list[int]) -> dict[str, Any]:
    """`submit --json`: {"id": N} for one job, {"ids": [...]} for several, and the id of
    the array ("array_id", or "array_ids" when --from-file made one array per line)."""
    out: dict[str, Any] = {"id": ids[0]} if len(ids) == 1 else {"ids": ids}
    if len(array_ids) == 1:
        out["array_id"] = array_ids[0]
    elif array_ids:
        out["array_ids"] = array_ids
    return out


def ended_status(jobs: list[dict[str, Any]]) -> int:
    """`wait`'s exit status: the first job's that did not succeed (0 if all did). Jobs that
    could not start are named on stderr with the reason, which their 127 cannot tell."""
    unstarted: dict[str, list[int]] = {}
    for job in jobs:
        reason = job.get("end_reason") or ""
        if job.get("state") == "failed" and reason.startswith("cannot start"):
            unstarted.setdefault(reason, []).append(job["id"])
    for reason, ids in unstarted.items():  # "cannot start: why" -> "could not start: why"
        sys.stderr.write(f"Error: {_jobs_named(ids)} could not{reason[len('cannot') :]}\n")
    return next((s for s in map(exit_status, jobs) if s != 0), 0)


def print_json(data: object) -> None:
    import json  # noqa: PLC0415 - 16 ms (re) of every command: only for --json

    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def submit_and_report(opts: SubmitOptions) -> int:
    """`gpusched submit`, for the typer command and the fast path alike: one round trip."""
    # 0.1 ms of every `wait`, which imports this module too
    from gpusched.client.submit.sbatchlines import with_script_options  # noqa: PLC0415

    try:
        opts = with_script_options(opts, os.getcwd())
    except FileNotFoundError:
        pass  # no current directory: build_request says so
    try:
        request = build_request(opts)
    except KeyboardInterrupt:  # reading --from-file's first lines (a pipe, say)
        if opts.from_file is not None:
            sys.stderr.write(_NOTHING_QUEUED)
        raise
    client = Client()
    lines = request.pop("lines", None)
    if lines is not None:
        return report_queued(client, submit_streamed(client, request, lines, opts), opts)
    try:
        result = client.call("submit", **request)
    except ProtocolError:  # too big to send (or a NaN): which limit it is over, if one
        check_limits(request)
        raise
    return report_queued(client, result, opts)


_NOTHING_QUEUED = "Interrupted: nothing of this submit was queued.\n"


def submit_streamed(
    client: Any, request: dict[str, Any], lines: Iterable[str | None], opts: SubmitOptions
) -> dict[str, Any]:
    """A --from-file submit, its lines streamed. Ctrl-C asks the daemon to drop it; the
    daemon then says whether it did (nothing queued) or had already queued every job,
    and so does stderr, before the command ends with status 130."""
    # 1 ms of every submit; --from-file only
    from gpusched.client import streamedrequest  # noqa: PLC0415

    try:
        queued: dict[str, Any] = streamedrequest.call_streamed(
            client, "submit", "lines", lines, **request
        )
        return queued
    except streamedrequest.Interrupted as stop:
        if stop.reply is not None and stop.reply.get("ok"):
            result = stop.reply["result"]
            report_queued(
                client, result, SubmitOptions(**{**opts.as_dict(), "wait": False, "notify": False})
            )
            ids = result["ids"]
            sys.stderr.write(
                f"Interrupted too late: {_jobs_named(ids)} "
                f"{'was' if len(ids) == 1 else 'were'} queued already; "
                f"`gpusched cancel {_id_words(result['array_ids'] or ids)}` "
                f"cancels {'it' if len(ids) == 1 else 'them'}.\n"
            )
        elif stop.reply is not None or not stop.sent_all:
            sys.stderr.write(_NOTHING_QUEUED)
        else:
            sys.stderr.write(
                "Interrupted: the daemon did not say whether it queued the "
                "jobs; see `gpusched ls`.\n"
            )
        raise KeyboardInterrupt from None


def report_queued(client: Any, result: dict[str, Any], opts: SubmitOptions) -> int:
    """Print the ids of jobs just queued (as JSON with --json); with --wait, wait for them
    and return the exit status that `submit --wait` gives. An array is named by its id
    alone, as `sbatch --parsable` prints it, so that `jid=$(gpusched submit --array ...)`
    can be given to --dependency, wait or cancel."""
    ids, array_ids = result["ids"], result.get("array_ids", [])
    try:
        if opts.json:
            print_json(submit_json(ids, array_ids))
        else:
            sys.stdout.write("\n".join(str(i) for i in array_ids or ids) + "\n")
        sys.stdout.flush()
    except (OSError, AttributeError, ValueError):  # no stdout (closed), or a closed pipe
        detach_stdout()
        # The jobs are queued whatever became of the output: name them where it can be read.
        raise GpuschedError(
            f"queued {_jobs_named(ids)}, but could not print "
            f"{'its id' if len(ids) == 1 else 'their ids'}: standard output "
            "is closed"
        ) from None
    if opts.notify and not opts.wait:
        # desktop: 19 ms (subprocess) of every submit; only for --notify
        from gpusched.client.desktop import watch_in_background  # noqa: PLC0415

        watch_in_background(ids)
    if not opts.wait:
        return 0
    jobs = wait_or_explain(client, ids)
    if opts.notify:
        from gpusched.client.desktop import tell_ended  # noqa: PLC0415 - as above

        tell_ended(jobs)
    return ended_status(jobs)


def resubmit_and_report(job_id: str, opts: SubmitOptions, given: Iterable[str]) -> int:
    """`gpusched resubmit`: the daemon queues the job again from the spec it keeps, with
    the given options changed, read exactly as `submit` reads them."""
    probe = SubmitOptions(**{**opts.as_dict(), "command": ["resubmit"], "cwd": "/", "env": []})
    spec = build_request(probe)["jobs"][0]
    if spec.get("gpu_mem_auto") and "gpu_mem" in given:
        raise UsageError(
            "resubmit --gpu-mem takes a size such as 20G; auto is for submit, "
            "which estimates from the job's history"
        )
    changes = {RESUBMIT_FIELDS[option]: spec[RESUBMIT_FIELDS[option]] for option in given}
    client = Client()
    return report_queued(client, client.call("resubmit", id=job_id, changes=changes), opts)
