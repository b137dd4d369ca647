"""The fast path's one command-line parser, read from a command's table of options.

Every command's options are declared once, as rows of a table (cli/cmdoptions.py;
client/submit/options.py for submit): the typer commands are built from those rows, and
this parser reads a command line from the same rows. It accepts only what it reads
exactly as click does; anything else (help, a typo, a missing or bad value, a cluster of
short options such as -ar) returns None and the typer command reads the command line,
so help and usage errors read the same on both paths. Standard library only: the fast
path imports it on every call.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from typing import Any

    from gpusched.client.submit.options import FlagRow

# What a command takes besides its options -> the field its words go to: "" nothing,
# "one" a job id, "many" job ids, "command" the words from the first that is not an
# option on (submit: its options end where the command starts).
ARGUMENT_FIELDS = {"": "", "one": "job_id", "many": "job_ids", "command": "command"}


def flags_of(rows: tuple[FlagRow, ...]) -> dict[str, tuple[str, str]]:
    """Each flag of the rows -> (its field, its kind)."""
    return {flag: (field, kind) for field, flags, kind, *_ in rows for flag in flags}


def parse(argv: list[str], rows: tuple[FlagRow, ...], arguments: str) -> dict[str, Any] | None:
    """Each row's field -> its value in argv (its default when not given), and the
    arguments' field (ARGUMENT_FIELDS) -> the words; None when typer should decide."""
    flags = flags_of(rows)
    values: dict[str, Any] = {
        field: list(default) if kind == "list" else default for field, _, kind, default, *_ in rows
    }
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            words += argv[i:]
            break
        if arg == "-" or not arg.startswith("-"):
            if arguments == "command":
                words += argv[i - 1 :]
                break
            words.append(arg)
            continue
        name, has_inline, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in flags:
            return None
        field, kind = flags[name]
        if kind in ("flag", "yesno"):
            if not has_inline:
                values[field] = True
            elif kind == "yesno" and inline.strip().lower() in ("yes", "no"):
                values[field] = inline.strip().lower() == "yes"  # Slurm's =yes, =no
            else:
                return None
            continue
        if has_inline:
            value = inline
        elif i < len(argv):  # the next word, even one that looks like an option, as click
            value, i = argv[i], i + 1
        else:
            return None
        if kind == "list":
            values[field].append(value)
        elif kind == "int":
            try:  # click reads an int as int() does; a bad one is its usage error
                values[field] = int(value)
            except ValueError:
                return None
        else:
            values[field] = value
    return _with_arguments(values, words, arguments)


def _with_arguments(
    values: dict[str, Any], words: list[str], arguments: str
) -> dict[str, Any] | None:
    """values with the words in their field, or None when there are too few or too many."""
    wanted = {"": not words, "one": len(words) == 1, "many": bool(words), "command": True}
    if not wanted[arguments]:
        return None
    if arguments:
        values[ARGUMENT_FIELDS[arguments]] = words[0] if arguments == "one" else words
    return values
