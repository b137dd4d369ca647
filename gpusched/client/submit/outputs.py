"""`submit -o/--output`, `-e/--error` and `--open-mode`, checked as the job is submitted.

The daemon expands the patterns (core/spec/outpattern.py) when it gives the job its id; here
the submitter's own view of the file system is checked: a directory that is missing now
is refused at once, in one line, rather than failing the job when it starts (Slurm's
JobLaunchFailure). Standard library only: the submit fast path imports it.
"""

from __future__ import annotations

import os

from gpusched.core.errors import GpuschedError, UsageError
from gpusched.core.spec import outpattern
from gpusched.core.users import current_user_name

OPEN_MODES = outpattern.OPEN_MODES


def open_mode(text: str) -> str:
    """--open-mode's value, in full; a wrong one names the valid ones."""
    mode = text.strip().lower()
    if mode not in OPEN_MODES:
        raise UsageError(f"--open-mode {text!r} is not a mode; valid: {', '.join(OPEN_MODES)}")
    return mode


def output_fields(
    output: str | None, error: str | None, mode: str | None, cwd: str, name: str
) -> dict[str, str]:
    """The job spec's output fields: the patterns, and the open mode when there is a file
    of the user's to open (gpusched's own logs are new files, appended to); {} for none.
    name: the job's name as %x gives it."""
    mode = None if mode is None else open_mode(mode)
    fields: dict[str, str] = {}
    for option, pattern, key in (("--output", output, "output"), ("--error", error, "error")):
        if pattern is None:
            continue
        if not pattern.strip() or "\0" in pattern:
            raise UsageError(
                f"{option} wants a file name (patterns: %j, %A, %a, %x), not {pattern!r}"
            )
        _check_dir(option, pattern, cwd, name)
        fields[key] = pattern
    if fields:
        fields["open_mode"] = mode or OPEN_MODES[0]
    return fields


def _check_dir(option: str, pattern: str, cwd: str, name: str) -> None:
    folder = outpattern.known_dir(
        pattern, cwd, name=name, user=current_user_name(), host=os.uname().nodename
    )
    if folder is not None and not os.path.isdir(folder):
        raise GpuschedError(
            f"{option} {pattern}: the directory {folder} does not exist. "
            "Create it first (Slurm would fail the job), or give another path"
        )
