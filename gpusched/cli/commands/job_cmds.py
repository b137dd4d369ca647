"""The commands on jobs and the queue: ls, show, cancel, hold, release, update, drain,
resume, wait, logs, attach, env. What the fast command path also runs lives in jobviews.py, and
those commands' options in cmdoptions.py."""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from gpusched.cli import jobviews
from gpusched.cli.cmdoptions import LOGS, LS, SHOW, WAIT
from gpusched.cli.commands.submit_cmds import with_options
from gpusched.cli.common import JOB_ID_HELP, JOB_IDS, JOB_IDS_HELP, JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.client.connection import Client
from gpusched.client.submit.submitting import print_json
from gpusched.core.spec import begintime, syntax

app = App()


@app.command("ls")
@with_options(LS)
def list_jobs(**options: Any) -> None:
    """List pending and running jobs (finished ones too with --all).

    Arrays fold into one line. Of a long queue, the first 50 pending jobs and one line
    counting the rest; --all, --last and --format list every job. States: pending, running, succeeded, failed, cancelled,
    timeout, oom, lost (Slurm's PD, R, CD, F, CA, TO, OOM, NF too).

    \b
    Examples:
      gpusched ls --me --state running
      gpusched ls --all --name 'sweep-*' --format jobid,state,exitcode --noheader
      gpusched ls --all --last 20
    """
    raise typer.Exit(jobviews.list_jobs(**options))


@app.command()
@with_options(SHOW)
def show(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP), **options: Any
) -> None:
    """Everything about one job.

    Example: gpusched show 12
    """
    raise typer.Exit(jobviews.show(job_id, **options))


@app.command()
def cancel(job_ids: list[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Cancel jobs: pending ones never start, running ones stop.

    A running job gets SIGTERM, then SIGKILL after the daemon's cancel_grace.

    Example: gpusched cancel 12 13_4
    """
    raise typer.Exit(jobviews.cancel(job_ids))


@app.command()
def hold(job_ids: list[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Keep pending jobs from starting until `release`.

    Example: gpusched hold 12
    """
    raise typer.Exit(jobviews.hold(job_ids))


@app.command()
def release(job_ids: list[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Let held jobs start.

    Example: gpusched release 12
    """
    raise typer.Exit(jobviews.release(job_ids))


@app.command()
def update(
    job_ids: list[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP),
    priority: int | None = typer.Option(None, "--priority", help="The new priority."),
    begin: str | None = typer.Option(
        None,
        "--begin",
        metavar="TIME",
        help="Start pending jobs no sooner than TIME, in submit --begin's forms; now lets "
        "them start at once.",
    ),
    gpu_mem_over: str | None = typer.Option(
        None,
        "--gpu-mem-over",
        help="When the job uses more than its --gpu-mem on a shared GPU: report, stop or "
        "requeue (a running job already reported over it is stopped or requeued now).",
    ),
) -> None:
    """Change queued jobs.

    Example: gpusched update 12 --priority 10; gpusched update 12 --begin now
    """
    begin_time = None if begin is None else begintime.parse_begin(begin, time.time())
    raise typer.Exit(
        jobviews.change(
            "update", job_ids, priority=priority, begin_time=begin_time, gpu_mem_over=gpu_mem_over
        )
    )


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
@with_options(WAIT)
def wait(
    job_ids: list[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP), **options: Any
) -> None:
    """Wait for jobs to end; exit with the first failure's status.

    An array's id waits for all its elements. The exit status is the first non-zero
    status among the jobs, 0 if all succeeded. With --notify, notify-send tells the
    desktop when they end (where a session bus is), else the terminal's bell rings.

    Example: gpusched wait 12 13; echo $?
    """
    raise typer.Exit(jobviews.wait(job_ids, **options))


@app.command()
@with_options(LOGS)
def logs(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP), **options: Any
) -> None:
    """Print a job's output.

    Example: gpusched logs -f 12
    """
    raise typer.Exit(jobviews.logs(job_id, **options))


@app.command()
def attach(
    job_id: str = typer.Argument(..., metavar="JOBID", help=JOB_ID_HELP),
    detach_keys: str | None = typer.Option(
        None,
        "--detach-keys",
        metavar="KEYS",
        help="Keys that leave the job running: ctrl-X or a character, comma-separated for a "
        'sequence ("ctrl-p,ctrl-q"). Default: the config\'s [attach] detach_keys, ctrl-].',
    ),
) -> None:
    """Connect this terminal to a job submitted with --pty.

    Its recent output comes first, then what it writes; keys go to the job and window
    resizes reach it. Ctrl-] (--detach-keys) leaves it running. Several people may attach
    at once, and any of them may type. When the job ends, attach exits with its status.

    Example: gpusched attach 12
    """
    from gpusched.cli.attach import attach as attach_to  # noqa: PLC0415 - attach only

    raise typer.Exit(attach_to(syntax.job_id_text(job_id), detach_keys))


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
