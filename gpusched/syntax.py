"""Slurm-style option syntax for `submit` (stdlib only: the submit fast path imports it)."""

from __future__ import annotations

import math
import re
import signal

from gpusched.errors import UsageError

MAX_ARRAY_SIZE = 10_000
DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")
RETRY_ON_CHOICES = ("failed", "timeout", "oom", "cancelled", "lost")
# Warning signals go through the job's shim, which passes on only these (shim.FORWARDED);
# any other would stay with the shim (ALRM is its SIGKILL timer; KILL or STOP stop it).
WARN_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                signal.SIGTERM)
_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_array(text: str) -> tuple[tuple[int, ...], int | None]:
    """'0-99%8', '1,3,5-7', '0-15:4' -> (indices, at-most-at-once)."""
    spec, _, throttle_text = text.partition("%")
    indices: list[int] = []
    for part in spec.split(","):
        match = _RANGE_RE.match(part.strip())
        if not match:
            raise UsageError(f"--array wants ranges like 0-99, 1,3,5-7 or 0-99%8, not {text!r}")
        first = int(match.group(1))
        last = int(match.group(2) or first)
        step = int(match.group(3) or 1)
        if last < first or step < 1:
            raise UsageError(f"--array range {part!r} is empty")
        # Count before building: a typo like 0-1000000000 must not fill the memory.
        if len(indices) + (last - first) // step + 1 > MAX_ARRAY_SIZE:
            raise UsageError(f"--array {text!r} has more than {MAX_ARRAY_SIZE} elements")
        indices.extend(range(first, last + 1, step))
    throttle = None
    if throttle_text:
        if not throttle_text.isdigit() or int(throttle_text) < 1:
            raise UsageError(f"--array: the part after % must be a positive count, not {throttle_text!r}")
        throttle = int(throttle_text)
    return tuple(sorted(set(indices))), throttle


def parse_dependencies(after: list[str], dependency: list[str]) -> list[tuple[str, int]]:
    """--after 3,4 (afterok) and Slurm's --dependency afterok:3:4,afterany:5."""
    deps: list[tuple[str, int]] = []
    for text in after:
        deps += [("afterok", _job_id(i, "--after")) for i in text.split(",") if i.strip()]
    for text in dependency:
        for clause in filter(None, (c.strip() for c in text.split(","))):
            kind, *ids = clause.split(":")
            if kind not in DEPENDENCY_KINDS or not ids:
                raise UsageError(f"--dependency wants KIND:ID[:ID] with KIND one of "
                                 f"{', '.join(DEPENDENCY_KINDS)}, not {clause!r}")
            deps += [(kind, _job_id(i, "--dependency")) for i in ids]
    return deps


def _job_id(text: str, option: str) -> int:
    text = text.strip()
    if not text.isdigit():
        raise UsageError(f"{option}: {text!r} is not a job id")
    return int(text)


def parse_signal_spec(text: str) -> tuple[int, float]:
    """Slurm's --signal: 'USR1@120', 'SIGUSR2@60', '10@30', 'USR1' (60 s) -> (signal, seconds)."""
    name, _, before = text.partition("@")
    name = name.strip().upper()
    if name.startswith("B:"):  # Slurm's "batch shell only" prefix: our shim signals the group
        name = name[2:]
    names = ", ".join(s.name[3:] for s in WARN_SIGNALS)
    bad = ValueError(f"--signal wants SIGNAL[@SECONDS] like USR1@120 with SIGNAL one of {names}, "
                     f"not {text!r}")
    try:
        signum = int(name) if name.isdigit() else int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
        seconds = float(before) if before else 60.0
    except (KeyError, ValueError):
        raise bad from None
    if signum not in WARN_SIGNALS or not math.isfinite(seconds) or seconds < 0:
        raise bad
    return signum, seconds
