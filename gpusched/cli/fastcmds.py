"""`ls`, `show`, `gpus`, `wait`, `cancel`, `hold`, `release` and `logs` without typer or
rich (about 150 ms of imports): people type these all day, and scripts poll them.

The parser reads the same tables as the typer commands (cmdoptions.py) and accepts only
what it reads exactly as click does: anything else (help, a typo, a bad or missing
value, an option cluster such as -ar) returns None and the typer command takes over, so
help and usage errors read the same. The commands' bodies are shared (jobviews.py) and
print through plainout.Screen. GPUSCHED_NO_FAST_PATH=1 turns this path off (entry.py).
"""

from __future__ import annotations

from gpusched.cli import jobviews
from gpusched.cli.cmdoptions import FAST_COMMANDS
from gpusched.cli.views.plainout import Screen
from gpusched.client.submit.options import flags_of
from gpusched.core.errors import GpuschedError, report_error, report_unexpected

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def parse(command: str, argv: list[str]) -> dict[str, Any] | None:
    """The keyword arguments of jobviews' function for `command ARGV`, or None when the
    typer command should read the command line."""
    arguments, rows = FAST_COMMANDS[command]
    flags = flags_of(rows)
    values: dict[str, Any] = {row[0]: row[3] for row in rows}
    positional: list[str] = []
    i, options_done = 0, False
    while i < len(argv):
        arg = argv[i]
        i += 1
        if options_done or arg == "-" or not arg.startswith("-"):
            positional.append(arg)
            continue
        if arg == "--":
            options_done = True
            continue
        name, has_inline, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in flags:
            return None
        field, kind = flags[name]
        if kind == "flag":
            if has_inline:
                return None
            values[field] = True
        else:
            if has_inline:
                value = inline
            elif i < len(argv) and not argv[i].startswith("-"):
                value, i = argv[i], i + 1
            else:
                return None  # no value, or one that looks like an option: click decides
            try:  # click reads an int as int() does; a bad one is its usage error
                values[field] = int(value) if kind == "int" else value
            except ValueError:
                return None
    wanted = {"": len(positional) == 0, "one": len(positional) == 1, "many": len(positional) >= 1}[
        arguments
    ]
    if not wanted:
        return None
    if arguments == "one":
        values["job_id"] = positional[0]
    elif arguments == "many":
        values["job_ids"] = positional
    return values


def try_fast_command(command: str, argv: list[str]) -> int | None:
    """Run `gpusched COMMAND ARGV` and return its exit status, or None when the typer
    command should run it instead. Errors end as cli/app.py ends them."""
    values = parse(command, argv)
    if values is None:
        return None
    run: Callable[..., int] = getattr(jobviews, "list_jobs" if command == "ls" else command)
    try:
        return run(Screen(), **values)
    except GpuschedError as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_unexpected(exc)
