"""`--output`/`--error` file name patterns, expanded as Slurm's sbatch expands them.

Measured on Slurm 22.05 (tests/test_outpattern.py lists the cases): `%j` the job id, `%A`
the array's id (the job's own id outside an array), `%a` the array index (4294967294,
Slurm's NO_VAL, outside an array), `%x` the job name, `%u` the user, `%N` the short host
name, `%J` the job id (the batch step has no step number), `%s` "batch", `%t` and `%n` 0,
`%%` a percent sign. A number after the `%` zero-pads a numeric field to that width (at
most 10); it is ignored for names. Anything else after a `%` stays as typed, and a pattern
with a backslash is not expanded at all: its backslashes are dropped. Pure and stdlib only:
the daemon expands a job's patterns as it queues the job, when its id is known.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing: 12 ms of `submit -o` (client/submit/outputs.py)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

# Slurm's NO_VAL: what %a gives for a job that is not an array element.
NO_ARRAY_INDEX = 4294967294
MAX_WIDTH = 10  # Slurm caps the zero-padding width here
# --open-mode's values; the first is the default, as in Slurm (JobFileAppend=0).
OPEN_MODES = ("truncate", "append")
# The fields that depend on the job's id, unknown until the daemon queues it.
ID_LETTERS = "jJAa"


def _tokens(pattern: str) -> Iterator[tuple[str, str, int]]:
    """(text, letter, width) for each piece of a pattern: letter "" for text kept as it
    is, else the field `%WIDTHletter` that text is."""
    i = 0
    while i < len(pattern):
        if pattern[i] != "%" or i + 1 >= len(pattern):
            yield pattern[i], "", 0
            i += 1
        elif pattern[i + 1] == "%":
            yield "%", "", 0
            i += 2
        else:
            end = i + 1
            while end < len(pattern) and pattern[end].isdigit():
                end += 1
            letter = pattern[end] if end < len(pattern) else ""
            yield pattern[i : end + 1], letter, min(int(pattern[i + 1 : end] or 0), MAX_WIDTH)
            i = end + 1


def expand(
    pattern: str,
    job_id: int,
    name: str,
    user: str,
    host: str,
    array_id: int | None = None,
    array_index: int | None = None,
) -> str:
    """The file name `pattern` gives for this job (not yet joined to its directory)."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    numbers = {
        "j": job_id,
        "J": job_id,
        "A": job_id if array_id is None else array_id,
        "a": NO_ARRAY_INDEX if array_index is None else array_index,
        "t": 0,
        "n": 0,
    }
    names = {"x": name, "u": user, "N": host.split(".", 1)[0], "s": "batch"}
    out = []
    for text, letter, width in _tokens(pattern):
        if letter in numbers:
            out.append(f"{numbers[letter]:0{width}d}")
        elif letter in names:
            out.append(names[letter])
        else:
            out.append(text)  # plain text, or not a field: kept as typed
    return "".join(out)


def expand_path(pattern: str, cwd: str, **fields: Any) -> str:
    """expand(), made absolute: a relative pattern is relative to the job's working
    directory, as in Slurm."""
    return os.path.join(cwd, expand(pattern, **fields))


def known_dir(pattern: str, cwd: str, name: str, user: str, host: str) -> str | None:
    """The directory a pattern's file will be in, when that does not depend on the job's
    id (else None): what `submit` can check before the job is queued."""
    folder = os.path.dirname(pattern)
    if "\\" not in pattern and any(
        letter and letter in ID_LETTERS for _, letter, _ in _tokens(folder)
    ):
        return None
    return os.path.dirname(expand_path(pattern, cwd, job_id=0, name=name, user=user, host=host))
