"""`gpusched reserve ...`: GPU reservations, some GPUs kept for some users over a window of
time (docs/calendar.md)."""

from __future__ import annotations

import sys
import time

import typer

from gpusched.cli.common import JSON_HELP
from gpusched.cli.helpformat import App
from gpusched.cli.views.reserveview import details, timeline
from gpusched.client.connection import Client
from gpusched.client.submit.submitting import print_json
from gpusched.core.errors import UsageError
from gpusched.core.spec.begintime import parse_start
from gpusched.core.units import parse_duration

app = App(
    no_args_is_help=True,
    help=(
        "Keep GPUs for some users over a window of time.\n\n"
        "Jobs run in one with `submit --reservation NAME`; other jobs stay off its GPUs "
        "where they would still run when it starts (docs/calendar.md).\n\n"
        "\b\nExamples:\n"
        '  gpusched reserve create --gpus 2,3 --user alice --start "thu 14:00" -d 4h\n'
        "  gpusched reserve ls"
    ),
)
_NAME = typer.Argument(..., metavar="NAME", help="The reservation.")
_JSON = typer.Option(False, "--json", help=JSON_HELP)


def _gpu_indices(text: str) -> list[int]:
    try:
        indices = [int(part) for part in text.split(",")]
    except ValueError:
        indices = []
    if not indices or any(i < 0 or i > 1023 for i in indices):
        raise UsageError(f"--gpus {text!r} is not a list of GPU indices; e.g. --gpus 2,3")
    return indices


@app.command()
def create(
    gpus: str = typer.Option(..., "--gpus", metavar="I,J", help="The GPUs, by index: 2,3."),
    user: list[str] = typer.Option(
        [], "--user", "-u", metavar="USER", help="Who may use it (repeat or USER,USER); you."
    ),
    start: str = typer.Option(
        "now",
        "--start",
        metavar="TIME",
        help="When it starts: submit --begin's forms, or a weekday and a time: thu 14:00.",
    ),
    duration: str = typer.Option(..., "--duration", "-d", metavar="DURATION", help="How long: 4h."),
    name: str | None = typer.Option(
        None, "--name", help="Its name (default: the user's name and a number)."
    ),
    as_json: bool = _JSON,
) -> None:
    """Reserve GPUs for users from a start, for a duration.

    An admin reserves for anyone; another user for themself, within [reservations]
    user_max_gpu_hours.

    \b
    Examples:
      gpusched reserve create --gpus 2,3 -u alice --start "thu 14:00" -d 4h
      gpusched reserve create --gpus 0 --start 2026-12-24T08:00 -d 1d --name xmas
    """
    try:
        length_s = parse_duration(duration)
    except ValueError as exc:
        raise UsageError(f"--duration: {exc}") from None
    if length_s <= 0:
        raise UsageError(f"--duration {duration!r} must be longer than 0")
    begins = parse_start(start, "--start", time.time())
    users = [u for each in user for u in each.split(",") if u] or None
    made = Client().call(
        "reserve",
        gpus=_gpu_indices(gpus),
        users=users,
        start_time=begins,
        end_time=begins + length_s,
        name=name,
    )
    if as_json:
        print_json(made)
    else:
        sys.stdout.write(f"reservation {made['name']}\n")


@app.command("ls")
def list_reservations(as_json: bool = _JSON) -> None:
    """The reservations not yet ended, as a timeline from now.

    \b
    Examples:
      gpusched reserve ls
      gpusched reserve ls --json
    """
    result = Client().call("reservations")
    if as_json:
        print_json(result["reservations"])
    elif not result["reservations"]:
        sys.stdout.write("no reservations; `gpusched reserve create -h` tells how to make one\n")
    else:
        sys.stdout.write(timeline(result["reservations"], result["now"]) + "\n")


@app.command()
def show(name: str = _NAME, as_json: bool = _JSON) -> None:
    """One reservation: its GPUs, users, window and maker.

    \b
    Examples:
      gpusched reserve show demo
    """
    result = Client().call("reservations", names=[name])
    (found,) = result["reservations"]
    if as_json:
        print_json(found)
    else:
        sys.stdout.write(details(found, result["now"]) + "\n")


@app.command()
def delete(name: str = _NAME) -> None:
    """Delete a reservation: its GPUs are everyone's again.

    Its maker or an admin may.

    \b
    Examples:
      gpusched reserve delete demo
    """
    Client().call("unreserve", name=name)
    sys.stdout.write(f"deleted reservation {name}\n")
