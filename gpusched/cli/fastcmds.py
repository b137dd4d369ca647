"""`ls`, `show`, `gpus`, `wait`, `cancel`, `hold`, `release` and `logs` without typer or
rich (about 150 ms of imports): people type these all day, and scripts poll them.

The command line is read from the command's table (cmdoptions.py) by the fast path's
parser (client/cmdline.py); what it does not read exactly (help, a typo, a bad value)
goes to the typer command, so help and usage errors read the same. The commands' bodies
(jobviews.py) and their output (views/plainout.Screen) are the typer commands' own.
GPUSCHED_NO_FAST_PATH=1 turns this path off (entry.py).
"""

from __future__ import annotations

from gpusched.cli import jobviews
from gpusched.cli.cmdoptions import FAST_COMMANDS
from gpusched.client import cmdline
from gpusched.core.errors import GpuschedError, report_error, report_unexpected

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def parse(command: str, argv: list[str]) -> dict[str, Any] | None:
    """The keyword arguments of jobviews' function for `command ARGV`, or None when the
    typer command should read the command line."""
    arguments, rows = FAST_COMMANDS[command]
    return cmdline.parse(argv, rows, arguments)


def try_fast_command(command: str, argv: list[str]) -> int | None:
    """Run `gpusched COMMAND ARGV` and return its exit status, or None when the typer
    command should run it instead. Errors end as cli/app.py ends them."""
    values = parse(command, argv)
    if values is None:
        return None
    run: Callable[..., int] = getattr(jobviews, "list_jobs" if command == "ls" else command)
    try:
        return run(**values)
    except GpuschedError as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_unexpected(exc)
