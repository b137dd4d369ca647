"""Which jobs a listing selects: states by gpusched's or Slurm's names, users, name patterns.

The daemon filters with it (on the rows a caller may see), and `ls` checks its options
with it before asking.
"""

from __future__ import annotations

import fnmatch

from gpusched.core.errors import UsageError
from gpusched.core.models import FINAL_STATES, JobState
from gpusched.core.spec.syntax import items

TYPE_CHECKING = False  # not typing: 12 ms of `ls --state` (cli/listing.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

STATES = tuple(s.value for s in JobState)
FINAL = frozenset(s.value for s in FINAL_STATES)
# Slurm's names and compact codes (squeue -t), for people who type those.
SLURM_STATES = {
    "pd": "pending",
    "r": "running",
    "completed": "succeeded",
    "cd": "succeeded",
    "f": "failed",
    "ca": "cancelled",
    "to": "timeout",
    "node_fail": "lost",
    "nf": "lost",
}
# Out of memory, host or GPU: both show as OOM (COMPACT), so OOM selects both; gpu_oom
# alone selects the GPU's.
OUT_OF_MEMORY = ("oom", "gpu_oom")
COMPACT = {
    "pending": "PD",
    "running": "R",
    "succeeded": "CD",
    "failed": "F",
    "cancelled": "CA",
    "timeout": "TO",
    "oom": "OOM",
    "lost": "NF",
    "gpu_oom": "OOM",
}


def parse_states(text: str) -> list[str]:
    """'running,PD' -> ['running', 'pending']; a wrong one names the valid ones."""
    states: list[str] = []
    for item in items(text):
        if item.lower() in ("oom", "out_of_memory"):
            states += OUT_OF_MEMORY
            continue
        state = SLURM_STATES.get(item.lower(), item.lower())
        if state not in STATES:
            raise UsageError(
                f"--state: no state {item!r}; choose from {', '.join(STATES)} "
                "(or Slurm's PD, R, CD, F, CA, TO, OOM, NF)"
            )
        states.append(state)
    if not states:
        raise UsageError(f"--state wants states like running,pending, not {text!r}")
    return states


def _list_of_strings(args: dict[str, Any], key: str) -> list[str] | None:
    value = args.get(key)
    if value is not None and (
        not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value)
    ):
        raise UsageError(f"list: {key} must be a non-empty list of strings")
    return value


def select(rows: list[dict[str, Any]], args: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows (as the caller sees them) that pass the `list` request's filters."""
    passes = matcher(args)
    return [row for row in rows if passes(row["user"], row["state"], row["name"])]


def matcher(args: dict[str, Any]) -> Callable[[str, str, str], bool]:
    """Whether a job's (user, state, name as the caller sees it) pass the `list` request's
    filters: for rows, and for jobs counted without making rows of them (daemon/requests/lsqueue.py)."""
    users, states = _list_of_strings(args, "users"), _list_of_strings(args, "states")
    names = _list_of_strings(args, "names")
    if states and not set(states) <= set(STATES):
        raise UsageError(f"list: states must be among {', '.join(STATES)}")
    return lambda user, state, name: (
        (users is None or user in users)
        and (states is None or state in states)
        and (names is None or any(fnmatch.fnmatchcase(name, n) for n in names))
    )
