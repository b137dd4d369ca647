"""Checked values from a request: one reader per kind of value, each refusing the rest.

A request is JSON from any client, so a value may be of any JSON type: a bool where a
number is wanted (Python counts True as 1), an integer of thousands of digits, text with
NUL characters or lone surrogates that SQLite and exec() cannot take, a list where an
object is wanted. Each reader returns the value or raises UsageError naming it; the
daemon reads every argument and every job field through one of them.
(stdlib only: the submit fast path imports the protocol table, which imports this.)
"""

from __future__ import annotations

import math

from gpusched.core.errors import UsageError

HIDDEN = "(hidden)"  # stands in for another user's command line in what a caller sees

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from typing import Any, TypeGuard

SHOWN_CHARS = 60  # of a refused value, in its error message: a request may carry megabytes


def shown(value: Any) -> str:
    """A refused value as an error message quotes it: its repr (one line, whatever it
    holds), cut short."""
    if isinstance(value, (str, list, dict)) and len(value) > SHOWN_CHARS:
        value = (
            value[:SHOWN_CHARS]
            if not isinstance(value, dict)
            else dict(list(value.items())[:SHOWN_CHARS])
        )
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int over Python's 4300-digit limit; deep nesting
        text = f"a {type(value).__name__} too large to show"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def is_whole(value: Any, low: int, high: int) -> TypeGuard[int]:
    """Whether value is an int from low to high (JSON's true is not 1 here)."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def whole_number(value: Any, what: str, low: int, high: int) -> int:
    """An int from low to high; never a bool, a float or a huge integer."""
    if is_whole(value, low, high):
        return value
    raise UsageError(f"{what} must be a whole number from {low} to {high}, not {shown(value)}")


def number(value: Any, what: str, low: float, high: float) -> float:
    """A finite number (int or float) from low to high; never a bool, NaN or infinity."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise UsageError(
            f"{what} must be a number of at least {low:g} and at most {high:g}, not {shown(value)}"
        )
    return float(value)


def flag(value: Any, what: str) -> bool:
    """true or false (JSON's), not a string or number that Python would count as one."""
    if not isinstance(value, bool):
        raise UsageError(f"{what} must be true or false, not {shown(value)}")
    return value


def is_text(value: Any, os_text: bool = False) -> TypeGuard[str]:
    """Whether value is a string without NUL characters that can be stored and shown:
    valid UTF-8, or with os_text, what os.fsdecode makes of any bytes (a command's
    arguments, its environment: a file name in another encoding still names its file)."""
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        value.encode("utf-8", "surrogateescape" if os_text else "strict")
    except UnicodeEncodeError:  # a lone surrogate: SQLite and exec() cannot take it
        return False
    return True


# C0 controls, DEL and C1: a newline or carriage return in a name splits a line of a log
# that others read line by line (Slurm's job-completion log, sacct's output).
_CONTROLS = dict.fromkeys((*range(32), *range(127, 160)), "?")


def has_controls(value: str) -> bool:
    return value != value.translate(_CONTROLS)


def without_controls(value: str) -> str:
    """The text with each control character as '?': a name taken from a file name."""
    return value.translate(_CONTROLS)


def text(value: Any, what: str, os_text: bool = False) -> str:
    """A string as is_text says."""
    if is_text(value, os_text):
        return value
    raise UsageError(
        f"{what} must be a string without NUL characters or lone surrogates, not {shown(value)}"
    )


def list_of(value: Any, what: str, read: Callable[[Any], Any], nonempty: bool = False) -> list[Any]:
    """A JSON list, each item checked by read (which raises for a bad one)."""
    if not isinstance(value, list) or (nonempty and not value):
        raise UsageError(
            f"{what} must be a {'non-empty ' if nonempty else ''}list, not {shown(value)}"
        )
    return [read(item) for item in value]


def mapping(value: Any, what: str, keys: Collection[str] | None = None) -> dict[str, Any]:
    """A JSON object; with keys, one with no keys but these (a typo must not be ignored
    in silence)."""
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object, not {shown(value)}")
    unknown = sorted(set(value) - set(keys)) if keys is not None else []
    if unknown:
        raise UsageError(
            f"{what}: unknown field {shown(unknown[0])}; {_known(unknown[0], keys or ())}"
        )
    return value


def _known(field: str, keys: Collection[str]) -> str:
    """The fields meant, in a line: the closest names, else all (when the list is short)."""
    import difflib  # noqa: PLC0415 - 1.2 ms, for a typo's error only, not every submit

    close = difflib.get_close_matches(field, sorted(keys), n=3)
    if close:
        return "did you mean " + " or ".join(shown(name) for name in close) + "?"
    known = ", ".join(sorted(keys))
    return f"known: {known}" if len(known) <= 200 else "docs/protocol.md lists the fields"


def environment(value: Any, what: str = "env") -> dict[str, str]:
    """Names and values exec() can take: a name not empty, without '=' (or NUL); every
    environment a job may get (a submit's, a service's) is read by this one reader."""
    env: dict[str, str] = mapping(value, what)  # checked item by item below
    for name, setting in env.items():
        if not name or "=" in name:
            raise UsageError(
                f"{what}: {shown(name)} is not an environment variable name (empty, or with '=')"
            )
        text(name, "an environment variable's name", os_text=True)
        if not is_text(setting, os_text=True):  # the message is built only then
            text(setting, f"the environment variable {shown(name)}", os_text=True)
    return env


def choice(value: Any, what: str, choices: tuple[str, ...] | list[str]) -> str:
    """One of the choices; a wrong one lists them."""
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"unknown {what} {shown(value)}; choose one of: {', '.join(choices)}")
    return value
