"""`#SBATCH` lines at the top of a submitted script, read as sbatch reads them: options that
the command line's own override.

Standard library only, and cheap when there is no script: the submit fast path calls it
for every submit (one stat, and two bytes read from a script that is a file).
"""

from __future__ import annotations

import os

from gpusched.client.submit.options import SubmitOptions
from gpusched.core.errors import UsageError

# A script run by one of these (`submit -- bash train.sh`) is read as if run directly.
SHELLS = ("sh", "bash", "dash", "zsh", "ksh")
_MAX_HEAD_BYTES = 64 * 1024  # sbatch stops at the first command; so do we, within this


def script_path(command: list[str], cwd: str) -> str | None:
    """The script the command runs, if it is a file here that starts with `#`."""
    words = command[1:2] if command and os.path.basename(command[0]) in SHELLS else command[:1]
    if not words or words[0].startswith("-"):
        return None
    path = os.path.join(cwd, words[0])
    try:
        with open(path, "rb") as script:
            return path if script.read(1) == b"#" else None
    except OSError:  # not a file here: a program on the PATH, a directory, unreadable
        return None


def sbatch_words(path: str) -> list[tuple[str, list[str]]]:
    """Each `#SBATCH` line before the script's first command: (the line, its words)."""
    with open(path, "rb") as script:
        head = script.read(_MAX_HEAD_BYTES).decode("utf-8", "replace")
    found = []
    for line in head.splitlines()[1:] if head.startswith("#!") else head.splitlines():
        text = line.strip()
        if text.startswith("#SBATCH"):
            import shlex  # noqa: PLC0415 - 6 ms (re) of every submit; only for #SBATCH lines

            try:
                found.append((text, shlex.split(text[len("#SBATCH") :], comments=True)))
            except ValueError as exc:
                raise UsageError(f"{text!r} in {path}: {exc}. Fix the line") from None
        elif text and not text.startswith("#"):
            break  # the first command ends the options, as in sbatch
    return found


def with_script_options(opts: SubmitOptions, cwd: str) -> SubmitOptions:
    """opts with the options of its script's `#SBATCH` lines where the command line gave
    none (the command line wins, as in sbatch). A line gpusched cannot read is refused,
    naming it: an option silently dropped would run the job in a way nobody asked for."""
    path = None if opts.from_file is not None else script_path(opts.command, cwd)
    lines = sbatch_words(path) if path else []
    if not lines:
        return opts
    # a cycle: fastsubmit imports submitting, which imports this module
    from gpusched.client.submit.fastsubmit import parse  # noqa: PLC0415

    merged = SubmitOptions(**opts.as_dict())
    for line, words in lines:
        try:
            found = parse(words + ["--"])
        except UsageError as exc:
            raise UsageError(f"{line!r} in {path}: {exc.message}") from None
        if found is None:
            raise UsageError(
                f"{line!r} in {path} is not an option gpusched reads. Remove "
                "the line, or see `gpusched submit --help`"
            )
        for name, default in SubmitOptions.DEFAULTS.items():
            value = getattr(found, name)
            if name != "command" and value != default and getattr(opts, name) == default:
                setattr(merged, name, value)  # later #SBATCH lines win over earlier ones
    return merged
