"""--gpu-mem auto: a job's GPU memory estimated from the peaks of its earlier runs (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from gpusched.core.sched.gpuoom import round_up
from gpusched.core.units import size_human

# The newest successful runs an estimate reads: enough for a p95, and recent enough to
# follow a job that grew.
HISTORY_RUNS = 50
KEY_MAX_CHARS = 200
PERCENTILE = 95.0
_N = TypeVar("_N", int, float)


def job_key(name: str, command: Sequence[str]) -> str:
    """The key a job's runs are filed under: its --name, else its command with the
    program's directory left out and spaces collapsed (`/usr/bin/python  a.py` and
    `python a.py` are one job)."""
    if name:
        return name[:KEY_MAX_CHARS]
    if not command:
        return ""
    words = [command[0].rsplit("/", 1)[-1], *command[1:]]
    return " ".join(" ".join(words).split())[:KEY_MAX_CHARS]


def percentile(values: Sequence[_N], pct: float = PERCENTILE) -> _N:
    """Nearest rank: the smallest value with at least pct% of the values at or below it
    (the one percentile of the project: estimates, runtimes, the simulator's figures)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def estimate(peaks: Sequence[int], margin_pct: float, usable_bytes: int) -> tuple[int | None, str]:
    """(--gpu-mem in bytes, why) from earlier runs' peaks: their p95 plus the margin,
    rounded up; (None: a whole GPU, why) without history, or when that is as much as
    the largest GPU can give a sharing job (usable_bytes, 0: unknown). The reason never
    names the job: `show` gives it to users who may not see the job's name or command."""
    if not peaks:
        return None, "no earlier successful run of this job recorded a GPU peak: a whole GPU"
    p95 = percentile(peaks)
    wanted = round_up(p95 * (1 + margin_pct / 100))
    runs = f"{len(peaks)} run{'s' if len(peaks) != 1 else ''}"
    if usable_bytes and wanted >= usable_bytes:
        return None, (
            f"estimated from {runs}: {size_human(wanted)}, as large as a whole GPU "
            f"(p95 peak {size_human(p95)} + {margin_pct:g}%)"
        )
    return wanted, (
        f"estimated from {runs}: {size_human(wanted)} (p95 peak "
        f"{size_human(p95)} + {margin_pct:g}%, rounded up)"
    )
