"""The commands on jobs and the queue: ls, show, cancel, hold, release, update, drain,
resume, wait, logs, env."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from gpusched.cli import render
from gpusched.cli.common import JOB_ID_HELP, JOB_IDS, JOB_IDS_HELP, JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.client.connection import Client
from gpusched.client.submitting import ended_status, print_json, wait_or_explain
from gpusched.core import syntax
from gpusched.core.errors import UsageError

app = App()


@app.command("ls")
def list_jobs(
    all_jobs: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    expand: bool = typer.Option(False, "--expand", "-r", help="One line per array element."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    users: Optional[str] = typer.Option(None, "--user", "-u", help="Only these users' jobs."),
    me: bool = typer.Option(False, "--me", help="Only your own jobs."),
    states: Optional[str] = typer.Option(None, "--state", "-t", help="Only jobs in these "
                                         "states; a finished state implies --all."),
    names: Optional[str] = typer.Option(None, "--name", "-n", metavar="NAME[,NAME]",
                                        help="Only jobs of these names; wildcards like 'sweep-*'."),
    fields: Optional[str] = typer.Option(None, "--format", "-O", metavar="FIELDS",
                                         help="Plain columns for scripts, one line per job: "
                                         "jobid,user,state,reason,... (README lists the fields)."),
    noheader: bool = typer.Option(False, "--noheader", help="With --format: no header line."),
    last: Optional[int] = typer.Option(None, "--last", metavar="N", help="Only the N most "
                                       "recent matching jobs (the highest ids), oldest first."),
) -> None:
    """List pending and running jobs (finished ones too with --all).

    Arrays fold into one line. States: pending, running, succeeded, failed, cancelled,
    timeout, oom, lost (Slurm's PD, R, CD, F, CA, TO, OOM, NF too).

    \b
    Examples:
      gpusched ls --me --state running
      gpusched ls --all --name 'sweep-*' --format jobid,state,exitcode --noheader
      gpusched ls --all --last 20
    """
    from gpusched.cli import listing

    if as_json and fields is not None:
        raise UsageError("choose one of --json and --format")
    columns = listing.parse_fields(fields) if fields is not None else None
    filters = listing.request_filters(users, me, states, names)
    # Sent only when given: a daemon older than --last refuses arguments it does not know.
    only = {"last": last} if last is not None else {}
    # However many: the daemon sends them a page at a time, gathered here.
    reply = Client().call_paged("list", all=all_jobs, **only, **filters)
    jobs, writes = reply["jobs"], render.write_problem_line(reply.get("write_problem"))
    if writes:  # on stderr: --json and --format output stay what scripts read
        sys.stderr.write(f"Warning: {writes}\n")
    if as_json:
        print_json(jobs)
    elif columns is not None:
        sys.stdout.write(listing.format_rows(jobs, columns, header=not noheader))
    elif jobs:
        out.print(render.jobs_table(jobs if expand else render.fold_arrays(jobs), out.width))
    elif filters:
        out.print("no jobs match" + ("" if all_jobs or "states" in filters else
                                     " (--all looks at finished ones too)"))
    else:
        out.print("no jobs" if all_jobs else "no pending or running jobs (--all shows finished ones)")

@app.command()
def show(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Everything about one job.

    Example: gpusched show 12
    """
    from gpusched.cli.show import job_lines

    job = Client().call("show", ids=[syntax.job_id_text(job_id)])["jobs"][0]
    if as_json:
        print_json(job)
    else:
        sys.stdout.write("".join(line + "\n" for line in job_lines(job)))


def _change(command: str, job_ids: List[str], **args: object) -> None:
    """Print what happened to each job; a job that could not be changed is an error line
    on stderr and makes the exit status 1, the others are changed all the same."""
    ids = [syntax.job_id_text(i) for i in job_ids]  # a bad id is refused before any change
    reply = Client().call(command, ids=ids, **args)
    for job_id, outcome in reply["results"].items():
        out.print(f"job {job_id}: {outcome}", markup=False)
    refused = reply.get("refused") or {}
    for job_id, why in refused.items():
        sys.stderr.write(f"Error: job {job_id}: {why}\n")
    if refused:
        raise typer.Exit(1)


@app.command()
def cancel(job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Cancel jobs: pending ones never start, running ones stop.

    A running job gets SIGTERM, then SIGKILL after the daemon's cancel_grace.

    Example: gpusched cancel 12 13_4
    """
    _change("cancel", job_ids)


@app.command()
def hold(job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Keep pending jobs from starting until `release`.

    Example: gpusched hold 12
    """
    _change("hold", job_ids)


@app.command()
def release(job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Let held jobs start.

    Example: gpusched release 12
    """
    _change("release", job_ids)


@app.command()
def update(
    job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP),
    priority: Optional[int] = typer.Option(None, "--priority", help="The new priority."),
) -> None:
    """Change queued jobs.

    Example: gpusched update 12 --priority 10
    """
    _change("update", job_ids, priority=priority)


@app.command()
def drain() -> None:
    """Start nothing new; running jobs finish. `gpusched resume` undoes it.

    Example: gpusched drain
    """
    result = Client().call("drain")
    out.print(f"draining: nothing new starts; {result['running']} job(s) still running")


@app.command()
def resume() -> None:
    """Start jobs again after `drain`.

    Example: gpusched resume
    """
    Client().call("resume")
    out.print("resumed: jobs start again")


@app.command()
def wait(job_ids: List[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Wait for jobs to end; exit with the first failure's status.

    An array's id waits for all its elements. The exit status is the first non-zero
    status among the jobs, 0 if all succeeded.

    Example: gpusched wait 12 13; echo $?
    """
    jobs = wait_or_explain(Client(), [syntax.job_id_text(i) for i in job_ids])
    raise typer.Exit(ended_status(jobs))


@app.command()
def logs(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    stderr: bool = typer.Option(False, "--stderr", help="Show standard error instead of output."),
) -> None:
    """Print a job's output.

    Example: gpusched logs -f 12
    """
    from gpusched.client.logs import print_log

    print_log(Client(), syntax.job_id_text(job_id), stderr=stderr, follow=follow)


@app.command("env")
def job_env(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The environment a job was submitted with.

    The variables gpusched sets for the job itself are added when it starts.

    Example: gpusched env 12
    """
    env = Client().call("env", id=syntax.job_id_text(job_id))["env"]
    if as_json:
        print_json(env)
    else:
        sys.stdout.write("".join(f"{k}={v}\n" for k, v in sorted(env.items())))

