"""`gpusched gpus` and `top`: what the GPUs and their processes are doing."""

from __future__ import annotations

from typing import Any

import typer

from gpusched.cli import jobviews
from gpusched.cli.cmdoptions import GPUS
from gpusched.cli.commands.submit_cmds import with_options
from gpusched.cli.helpformat import App

app = App()


@app.command()
@with_options(GPUS)
def gpus(**options: Any) -> None:
    """The GPUs: memory used and reserved, utilization, jobs.

    \b
    Examples:
      gpusched gpus
      gpusched gpus --query index,memory.used --format csv,noheader
    """
    raise typer.Exit(jobviews.gpus(**options))


@app.command()
def top(
    interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
) -> None:
    """A live view of GPUs, processes and the queue.

    Keys: q quits, p pauses, u shows only your jobs, s changes the sort, ? helps.

    Example: gpusched top --once
    """
    # 8 ms (gpus) and 49 ms (tui, rich's Live) of every typer command: only for top
    from gpusched.gpus import open_backend  # noqa: PLC0415
    from gpusched.tui.app import run_top  # noqa: PLC0415

    raise typer.Exit(run_top(interval=interval, once=once, open_backend=open_backend))
