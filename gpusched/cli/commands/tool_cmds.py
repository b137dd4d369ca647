"""The tools around the queue: simulate, demo, completions, man and the completion helper
`_job-ids`."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpusched.cli import completions as shell_completions
from gpusched.cli import manpage
from gpusched.cli.commands.demo import run_demo
from gpusched.cli.common import JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.client.jobids import print_job_ids
from gpusched.core.errors import UsageError
from gpusched.core.models import DISCIPLINES

app = App()


@app.command()
def simulate(
    trace: Path = typer.Argument(
        ..., metavar="TRACE.csv", help="A job trace CSV (docs/scheduling.md has the format)."
    ),
    gpus: int = typer.Option(8, "--gpus", help="GPUs of the simulated box."),
    # The daemon's defaults (Settings'): the policy is written out, since importing the
    # placement code for it would slow every command; a test keeps it in step.
    policy: str = typer.Option("pack", "--policy", help="Placement policy."),
    discipline: str = typer.Option(
        DISCIPLINES[0], "--discipline", help=f"{', '.join(DISCIPLINES[:-1])} or {DISCIPLINES[-1]}."
    ),
    load: float | None = typer.Option(None, "--load", help="Scale arrivals to this load (0-1)."),
    arrivals: str = typer.Option(
        "trace", "--arrivals", help="trace (original spacing) or poisson."
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed for --arrivals poisson."),
    cpus: int | None = typer.Option(
        None, "--cpus", help="Cores of the simulated host (count the trace's cpus column)."
    ),
    mem: str | None = typer.Option(
        None, "--mem", help="Memory of the simulated host (count the trace's mem_bytes column)."
    ),
    preemption: bool = typer.Option(
        False,
        "--preemption",
        help="Urgent jobs preempt "
        "others, as the daemon does (checkpoint after a 60 s "
        "grace, 60 s to restart).",
    ),
    high_priority_share: float | None = typer.Option(
        None,
        "--high-priority-share",
        help="Share of jobs made urgent (priority 10), chosen with --seed; 0.1 with --preemption.",
    ),
    estimates: bool = typer.Option(
        False,
        "--estimates",
        help="Give each job --gpu-mem auto "
        "(GPU memory peaks from a seeded model) and count the jobs "
        "that shared a GPU and those that would have run out of it.",
    ),
    runtimes: str = typer.Option(
        "true",
        "--runtimes",
        help="true: each job's --time is its true runtime; predicted: no --time, and the "
        "runtime predicted from the runs ended before its submission orders the queue.",
    ),
    forecast: bool = typer.Option(
        False,
        "--forecast",
        help="At each submission, forecast the job's start (as `ls --start`); print the "
        "median error as a share of the real wait, and how often the real start fell in "
        "the 80 % interval.",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        metavar="FILE",
        help="Apply the [quotas] of this gpusched.toml to the trace's users (time 0 is a "
        "midnight; groups from its [simulate.groups], else the group database).",
    ),
    reservations: Path | None = typer.Option(
        None,
        "--reservations",
        metavar="FILE",
        help="GPU reservations, a TOML list of [[reservation]] (docs/calendar.md): other "
        "jobs stay off their GPUs, as in the daemon.",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Replay a job trace in simulated time.

    The trace goes through the very placement and queue code the daemon uses.

    \b
    Examples:
      gpusched simulate trace.csv --gpus 8 --discipline backfill
      gpusched simulate trace.csv --gpus 8 --load 0.5 --preemption
      gpusched simulate trace.csv --runtimes predicted --forecast
      gpusched simulate trace.csv --gpus 8 --config /etc/gpusched/gpusched.toml
      gpusched simulate trace.csv --gpus 8 --reservations calendar.toml
    """
    # the simulator: 43 ms of every typer command
    from gpusched.cli.commands.simruntimes import simulate as simulate_command  # noqa: PLC0415
    from gpusched.sim.traces import load_reservations  # noqa: PLC0415

    reserved = tuple(load_reservations(reservations)) if reservations else ()
    if reserved and (preemption or high_priority_share is not None or discipline == "las"):
        raise UsageError(
            "--reservations replay without preemption; leave out --preemption, "
            "--high-priority-share and --discipline las"
        )

    raise typer.Exit(
        simulate_command(
            trace,
            gpus=gpus,
            policy=policy,
            discipline=discipline,
            load=load,
            arrivals=arrivals,
            seed=seed,
            as_json=as_json,
            cpus=cpus,
            mem=mem,
            preemption=preemption,
            high_priority_share=high_priority_share,
            estimates=estimates,
            runtimes=runtimes,
            forecast=forecast,
            config=config,
            reserved=reserved,
        )
    )


@app.command()
def demo() -> None:
    """Try gpusched on 4 simulated GPUs; cleans up after itself.

    The demo runs its own daemon in a temporary home, never yours.

    Example: gpusched demo
    """
    raise typer.Exit(run_demo(out))


@app.command()
def completions(
    ctx: typer.Context, shell: str = typer.Argument(..., metavar="SHELL", help="bash, zsh or fish.")
) -> None:
    """Print the completion script for a shell.

    The README says where to put it for each shell.

    Example: gpusched completions zsh > ~/.zfunc/_gpusched
    """
    if shell not in shell_completions.SHELLS:
        raise UsageError(
            f"no completions for {shell!r}; choose one of: {', '.join(shell_completions.SHELLS)}"
        )
    sys.stdout.write(shell_completions.generate(shell, ctx.find_root().command))


@app.command()
def man(ctx: typer.Context) -> None:
    """Print the gpusched(1) man page (roff).

    It is generated from this command line.

    Example: gpusched man | man -l -
    """
    sys.stdout.write(manpage.generate(ctx.find_root().command))


@app.command("_job-ids", hidden=True)
def job_ids_for_completion(scope: str = typer.Argument("all", metavar="active|all")) -> None:
    """Job ids for shell completion (the console script answers it without typer).

    Example: gpusched _job-ids active
    """
    raise typer.Exit(print_job_ids([scope]))
