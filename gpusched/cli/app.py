"""The `gpusched` command line: the typer app, gathering the commands of the *_cmds.py
modules (thin commands that parse, make one call, and render), and main(), which turns
every error into one line on stderr and an exit status."""

from __future__ import annotations

import sys

import typer

from gpusched.cli.commands import (
    daemon_cmds,
    doctor_cmds,
    gc_cmds,
    gpu_cmds,
    history_cmds,
    job_cmds,
    mcp_cmds,
    requeue_cmds,
    reserve_cmds,
    service_cmds,
    submit_cmds,
    tool_cmds,
    usage_cmds,
)
from gpusched.cli.helpformat import App
from gpusched.cli.version import version_line
from gpusched.core.errors import GpuschedError, detach_stdout, report_error, report_unexpected
from gpusched.core.spec import syntax

app = App(add_completion=False, no_args_is_help=True, rich_markup_mode=None)


def _version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Schedule jobs on the GPUs of a shared machine.

    `gpusched COMMAND -h` tells more about each command.

    \b
    Examples:
      gpusched submit --gpus 1 --gpu-mem 20G -- python train.py
      gpusched ls
    """


# The commands, in the order `gpusched --help` lists them; the daemon's are a group.
for commands in (
    submit_cmds,
    job_cmds,
    requeue_cmds,
    gpu_cmds,
    tool_cmds,
    doctor_cmds,
    gc_cmds,
    usage_cmds,
    history_cmds,
    mcp_cmds,
):
    app.add_typer(commands.app)
app.add_typer(daemon_cmds.app, name="daemon")
app.add_typer(service_cmds.app, name="service")
app.add_typer(reserve_cmds.app, name="reserve")


JOB_ID_COMMANDS = (
    "show",
    "logs",
    "attach",
    "env",
    "wait",
    "cancel",
    "hold",
    "release",
    "update",
    "requeue",
    "preempt",
)


def _is_negative_number(option: object) -> bool:
    return isinstance(option, str) and option[:1] == "-" and option[1:2].isdigit()


def main(argv: list[str] | None = None) -> int:
    """Run a command; errors become one line on stderr and an exit status, never a traceback.

    When standard output is closed or its reader has left (`gpusched ls | head -1`), the
    command stops there with status 1 and says nothing more (submit names the jobs it
    queued, see submitting.py): the same for every command.
    """
    status = _run(sys.argv[1:] if argv is None else list(argv))
    try:
        sys.stdout.flush()  # output still buffered for a pipe: its failure is ours to report
    except (OSError, ValueError):
        detach_stdout()
        return status or 1
    return status


def _run(args: list[str]) -> int:
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="gpusched", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except GpuschedError as exc:
        return report_error(exc)
    except typer.TyperException as exc:  # click's usage errors: one line, status 2
        message = exc.format_message().replace("\n", " ")
        first = next((a for a in args if not a.startswith("-")), "")
        option = getattr(exc, "option_name", None)
        if first in JOB_ID_COMMANDS and _is_negative_number(option):
            # `cancel -1`: to the parser a negative number is an unknown option; say
            # instead what a job id is.
            message = f"{option!r} is not a job id; give {syntax.JOB_ID_FORMS}"
        topic = f"{first} " if first in getattr(command, "commands", {}) else ""
        sys.stderr.write(f"Error: {message} (see `gpusched {topic}--help`)\n")
        return getattr(exc, "exit_code", 2)
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_unexpected(exc)
