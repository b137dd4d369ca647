"""Parse and format sizes and durations the way people write them (stdlib only)."""

from __future__ import annotations

import math
import re

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
# Bare K/M/G/T mean binary units, as GPU memory is always sized (nvidia-smi's MiB).
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 10**3, "kib": 2**10,
    "m": 2**20, "mb": 10**6, "mib": 2**20,
    "g": 2**30, "gb": 10**9, "gib": 2**30,
    "t": 2**40, "tb": 10**12, "tib": 2**40,
}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_size(text: str | int) -> int:
    """'20G', '20GiB', '512MiB', '1.5T', 1024 -> bytes. Raises ValueError with the value."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(
            f"not a size: {text!r} (use a number with B, K/KiB, M/MiB, G/GiB, T/TiB, "
            "or KB/MB/GB/TB for powers of ten)"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(text: str | int | float) -> float:
    """'90', '1.5', '2h30m', '45s', '1d' -> seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not 0 <= text < math.inf:  # also refuses nan: a limit that never comes is no limit
            raise ValueError(f"duration must be a finite number of seconds, not {text}")
        return float(text)
    raw = str(text).strip().lower()
    try:
        seconds = float(raw)
    except ValueError:
        parts = _DURATION_RE.findall(raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise ValueError(f"not a duration: {text!r} (use seconds, or e.g. 2h30m, 45s, 1d)")
        return float(sum(float(n) * _DURATION_UNITS[u] for n, u in parts))
    if not 0 <= seconds < math.inf:
        raise ValueError(f"duration must be a finite number of seconds, not {text!r}")
    return seconds


def size_human(num_bytes: int | None) -> str:
    """Binary units with one decimal: 21474836480 -> '20.0 GiB'; None -> 'N/A'."""
    if num_bytes is None:
        return "N/A"
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def duration_human(seconds: float | None) -> str:
    """62 -> '1m02s', 3725 -> '1h02m', 90061 -> '1d01h'."""
    if seconds is None:
        return "-"
    total = int(max(0, seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
