"""GPU reservations in words: `reserve ls` as a timeline that fits 80 columns, `reserve show`
as name=value lines (plain text)."""

from __future__ import annotations

import time
from typing import Any

from gpusched.core.units import duration_human

BAR = 18  # cells of the timeline, from now to the last reservation's end
_WIDTHS = (10, 7, 8, 15, 15)  # NAME GPUS USERS START END: with the bar, 78 columns


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _when(epoch: float) -> str:
    return time.strftime("%a %m-%d %H:%M", time.localtime(epoch))


def _bar(r: dict[str, Any], now: float, horizon: float) -> str:
    """'#' where the reservation holds its GPUs, '.' where not, from now to horizon."""
    cell = (horizon - now) / BAR
    return "".join(
        "#" if r["start"] < now + (i + 1) * cell and r["end"] > now + i * cell else "."
        for i in range(BAR)
    )


def timeline(reservations: list[dict[str, Any]], now: float) -> str:
    horizon = max([now + 3600] + [r["end"] for r in reservations])
    span = f"+{duration_human(horizon - now)}"
    head = ("NAME", "GPUS", "USERS", "START", "END")
    lines = [
        " ".join(h.ljust(w) for h, w in zip(head, _WIDTHS)) + " |now" + span.rjust(BAR - 3) + "|"
    ]
    for r in reservations:
        cells = (
            r["name"],
            ",".join(map(str, r["gpus"])),
            ",".join(r["users"]),
            _when(r["start"]),
            _when(r["end"]),
        )
        row = " ".join(_fit(c, w).ljust(w) for c, w in zip(cells, _WIDTHS))
        lines.append(f"{row} |{_bar(r, now, horizon)}|")
    return "\n".join(lines)


def details(r: dict[str, Any], now: float) -> str:
    state = "active" if r["start"] <= now < r["end"] else "waiting"
    pairs = (
        ("name", r["name"]),
        ("state", state),
        ("gpus", ",".join(map(str, r["gpus"]))),
        ("users", ",".join(r["users"])),
        ("start", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r["start"]))),
        ("end", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r["end"]))),
        ("duration", duration_human(r["end"] - r["start"])),
        ("created_by", r["created_by"]),
    )
    return "\n".join(f"{key}={value}" for key, value in pairs)
