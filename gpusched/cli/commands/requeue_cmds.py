"""`gpusched requeue` and `gpusched preempt`: stop a job and put it back in the queue."""

from __future__ import annotations

import typer

from gpusched.cli import jobviews
from gpusched.cli.common import JOB_IDS, JOB_IDS_HELP
from gpusched.cli.helpformat import App

app = App()


@app.command()
def requeue(job_ids: list[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Put jobs back in the queue under their ids.

    As `scontrol requeue` does: a running job is stopped (SIGTERM, then SIGKILL after the daemon's cancel_grace) and
    queued again; an ended job is queued again. Each run after the first has
    GPUSCHED_ATTEMPT one higher and GPUSCHED_RESTARTS counting the requeues; its logs are
    appended to. A pending job is refused (exit status 1). Owner or admin only.

    Example: gpusched requeue 12
    """
    raise typer.Exit(jobviews.change("requeue", job_ids))


@app.command()
def preempt(job_ids: list[str] = typer.Argument(..., metavar=JOB_IDS, help=JOB_IDS_HELP)) -> None:
    """Preempt running jobs now, back to the queue.

    Checkpoint signal, grace, stop, and back to the queue under the same id.

    Each job gets its checkpoint signal (its --signal's, else [preemption] signal, SIGUSR1),
    then SIGTERM once its --preempt-grace has passed (and SIGKILL after the cancel
    grace), and goes back to the queue under the same id, as a preemption by a more
    urgent job would do. A job that is not running is refused (exit status 1). Owner or
    admin only.

    Example: gpusched preempt 12
    """
    raise typer.Exit(jobviews.change("preempt", job_ids))
