"""`gpusched gpus` and `top`: what the GPUs and their processes are doing."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from gpusched.cli import gpuquery, render
from gpusched.cli.common import JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.client.connection import Client
from gpusched.client.submitting import print_json
from gpusched.tui.draw import printable

app = App()


@app.command()
def gpus(
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    query: Optional[str] = typer.Option(None, "--query", help="Fields as nvidia-smi "
                                        "--query-gpu names them: index,name,memory.used,..."),
    fmt: Optional[str] = typer.Option(None, "--format", help="csv[,noheader][,nounits] (the "
                                      "default with --query) or json; without --query, the "
                                      f"fields {gpuquery.DEFAULT_QUERY.replace(',', ', ')}."),
) -> None:
    """The GPUs: memory used and reserved, utilization, jobs.

    \b
    Examples:
      gpusched gpus
      gpusched gpus --query index,memory.used --format csv,noheader
    """
    if query is None and fmt is not None:
        query = gpuquery.DEFAULT_QUERY
    fields = gpuquery.parse_query(query) if query is not None else None
    result = Client().call("gpus")
    if fields is not None:
        sys.stdout.write(gpuquery.render(result["gpus"], fields, fmt or "csv"))
        return
    if as_json:
        print_json(result)
        return
    if result["problem"]:
        out.print(f"No GPUs: {printable(result['problem'])}", markup=False)
    if result["gpus"]:
        out.print(render.gpus_table(result))
    out.print(render.host_line(result["host"]), markup=False)
    procs = render.processes_table(result)
    if procs is not None:
        out.print()
        out.print(procs)


@app.command()
def top(
    interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
) -> None:
    """A live view of GPUs, processes and the queue.

    Keys: q quits, p pauses, u shows only your jobs, s changes the sort, ? helps.

    Example: gpusched top --once
    """
    from gpusched.gpus import open_backend
    from gpusched.tui.app import run_top

    raise typer.Exit(run_top(interval=interval, once=once, open_backend=open_backend))

