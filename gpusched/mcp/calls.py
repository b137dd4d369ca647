"""What each tool asks of the daemon: plain functions of a Client and the tool's checked arguments."""

from __future__ import annotations

import os
from typing import Any

from gpusched.client.connection import Client
from gpusched.client.submit.jobrequest import build_request
from gpusched.client.submit.options import RESUBMIT_FIELDS, SubmitOptions
from gpusched.client.submit.submitting import exit_status, submit_json, wait_for_jobs
from gpusched.core import logmark
from gpusched.core.errors import UsageError
from gpusched.core.jobfilter import parse_states
from gpusched.core.spec import syntax
from gpusched.core.units import parse_duration
from gpusched.core.users import current_user_name
from gpusched.proc.privileges import open_as_owner

# The most jobs one list_jobs answer carries: an assistant reads every one of them.
MAX_LISTED = 200
# The most of a log's end read_log reads, whatever the lines asked.
MAX_LOG_BYTES = 256 * 1024


def list_jobs(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """`ls`'s filters, as cli/listing.py reads them."""
    filters: dict[str, Any] = {}
    users = syntax.items(args["users"]) if args.get("users") else []
    if users or args.get("me"):
        filters["users"] = users + ([current_user_name()] if args.get("me") else [])
    if args.get("states"):
        filters["states"] = parse_states(args["states"])
    if args.get("names"):
        filters["names"] = syntax.items(args["names"])
    if args.get("last") is not None:
        filters["last"] = args["last"]
    jobs = client.call_paged("list", all=bool(args.get("all_jobs")), **filters)["jobs"]
    return {"jobs": jobs[-MAX_LISTED:], "left_out": max(0, len(jobs) - MAX_LISTED)}


def show_job(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = client.call("show", ids=[syntax.job_id_text(args["job_id"])])["jobs"][0]
    return job


def why_pending(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Why the job waits, and when it may start where the daemon forecasts it."""
    job = show_job(client, args)
    keys = ("id", "state", "pending_reason", "begin_time")
    answer = {key: job.get(key) for key in keys}
    # The forecast start and its 80 % interval (epoch seconds), as `show` gives them.
    answer |= {k: job[k] for k in ("start_forecast", "start_low", "start_high") if k in job}
    if job["state"] != "pending":
        answer["note"] = f"job {job['id']} is {job['state']}, not pending"
    return answer


def read_log(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """The last lines of a job's output (or errors), read as the CLI reads them: the
    daemon names the file (`logs`: the owner or an admin only), the caller opens it."""
    job = client.call("logs", id=syntax.job_id_text(args["job_id"]))["job"]
    path = job["stderr_path" if args.get("stderr") else "stdout_path"]
    lines = args.get("lines", 100)
    if lines < 1:
        raise UsageError(f"lines must be 1 or more, not {lines}")
    try:
        with os.fdopen(open_as_owner(path, os.O_RDONLY, job["uid"]), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = max(0, size - MAX_LOG_BYTES)
            if start == 0:  # the whole file: skip a trimmed log's mark line (core/logmark.py)
                start = logmark.read_mark(fh.read(logmark.MARK_MAX_BYTES))[1]
            fh.seek(start)
            text = fh.read().decode(errors="replace")
    except FileNotFoundError:
        text = ""  # not started yet: its runner creates the file
    except OSError as exc:
        raise UsageError(f"cannot read the log of job {job['id']} ({path}): {exc}") from None
    kept = text.splitlines()[-lines:]
    return {"id": job["id"], "state": job["state"], "path": path, "lines": kept}


def gpu_status(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    gpus: dict[str, Any] = client.call("gpus")
    return gpus


def submit_options(args: dict[str, Any]) -> SubmitOptions:
    known = SubmitOptions.DEFAULTS.keys()
    return SubmitOptions(**{k: v for k, v in args.items() if k in known and v is not None})


def preview_submit(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Where the job would start now, or why it would wait; nothing is queued."""
    result: dict[str, Any] = client.call(
        "submit", dry_run=True, **build_request(submit_options(args))
    )
    return result


def submit(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Queue the job; with wait, wait for it and give its end and exit status."""
    result = client.call("submit", **build_request(submit_options(args)))
    return _queued(client, result, args)


def resubmit(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """The job queued again as a new one, with the given options changed, as
    `gpusched resubmit` reads them (client/submit/submitting.py)."""
    given = [name for name in RESUBMIT_FIELDS if args.get(name) not in (None, False)]
    probe = submit_options({**args, "command": ["resubmit"], "cwd": "/", "env": []})
    spec = build_request(probe)["jobs"][0]
    changes = {RESUBMIT_FIELDS[name]: spec[RESUBMIT_FIELDS[name]] for name in given}
    result = client.call("resubmit", id=syntax.job_id_text(args["job_id"]), changes=changes)
    return _queued(client, result, args)


def _queued(client: Client, result: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    answer = submit_json(result["ids"], result["array_ids"])
    if args.get("wait"):
        jobs = wait_for_jobs(client, result["ids"])
        answer["ended"] = [
            {
                "id": job["id"],
                "state": job["state"],
                "exit_code": job.get("exit_code"),
                "exit_status": exit_status(job),
            }
            for job in jobs
        ]
    return answer


def change(command: str) -> Any:
    """cancel, hold, release or requeue: each job's outcome, and those refused with why."""

    def call(client: Client, args: dict[str, Any]) -> dict[str, Any]:
        ids = [syntax.job_id_text(i) for i in args["job_ids"]]
        reply = client.call(command, ids=ids)
        return {"results": reply["results"], "refused": reply.get("refused") or {}}

    return call


def usage(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    since_s = None
    if args.get("since") is not None:
        try:
            since_s = parse_duration(args["since"])
        except ValueError as exc:
            raise UsageError(f"since {args['since']!r}: {exc}; write e.g. 7d or 12h") from None
    report: dict[str, Any] = client.call("usage", since_s=since_s, by=args.get("by") or "user")
    return report
