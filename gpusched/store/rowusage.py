"""What one job row used: GPU time, observed GPU memory over time, and its queue wait;
summed by `gpusched usage` (daemon/observe/usage.py) and by retention's summary of removed jobs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlite3


def row_usage(
    row: Mapping[str, Any] | sqlite3.Row, since_s: float | None = None, now_s: float | None = None
) -> dict[str, float]:
    """run_s, gpu_s, mem_byte_s (peak GPU memory seen on a GPU x its GPUs x the run: an
    upper estimate, as only the peak is kept) and wait_s (-1: not counted) of one row,
    its run clipped to since_s..now_s when given. A retried job counts its last attempt's
    run, and its wait only when it started at the first attempt (a retry's start is later)."""
    started, ended = row["started_at"], row["ended_at"]
    run_s = 0.0
    if started is not None:
        end = ended if ended is not None else (now_s if now_s is not None else started)
        begin = started if since_s is None else max(started, since_s)
        run_s = max(0.0, end - begin)
    gpus = len(json.loads(row["gpu_uuids"] or "[]"))
    wait_s = -1.0
    if started is not None and row["attempt"] == 1 and (since_s is None or started >= since_s):
        wait_s = max(0.0, started - row["submitted_at"])
    return {
        "run_s": run_s,
        "gpu_s": run_s * gpus,
        "mem_byte_s": run_s * gpus * (row["gpu_mem_peak_bytes"] or 0),
        "wait_s": wait_s,
    }
