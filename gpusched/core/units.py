"""Parse and format sizes and durations the way people write them (stdlib only).

Read with str methods, not re: every command imports this module, and re costs each
about 4 ms (bench/bench_commands.py).
"""

from __future__ import annotations

# float("inf") rather than math.inf: math is an extension module, a load every submit
# would pay for (limits, on the submit fast path, imports this module).
_INFINITY = float("inf")

# Bare K/M/G/T mean binary units, as GPU memory is always sized (nvidia-smi's MiB).
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}
_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}


def number_end(text: str, start: int = 0, ascii_only: bool = False) -> int:
    """Where a number like 12 or 1.5 that starts at START ends: START when none does.
    Digits are what re's \\d reads (any decimal digit, which float() takes), or with
    ascii_only [0-9]."""

    def digits_end(i: int) -> int:
        while i < len(text) and text[i].isdecimal() and (text[i].isascii() or not ascii_only):
            i += 1
        return i

    end = digits_end(start)
    if end > start and text[end : end + 1] == ".":
        fraction_end = digits_end(end + 1)
        if fraction_end > end + 1:
            return fraction_end
    return end


def duration_parts(text: str, ascii_only: bool = False) -> list[tuple[str, str]] | None:
    """'2h30m' -> [('2', 'h'), ('30', 'm')]: numbers each followed by d, h, m, s or ms
    (200ms, as docs/services.md writes a latency), the whole text and nothing else; None
    for any other text."""
    parts, i = [], 0
    while i < len(text):
        end = number_end(text, i, ascii_only)
        unit = "ms" if text.startswith("ms", end) else text[end : end + 1]
        if end == i or unit not in _DURATION_UNITS:
            return None
        parts.append((text[i:end], unit))
        i = end + len(unit)
    return parts or None


def parse_size(text: str | int) -> int:
    """'20G', '20GiB', '512MiB', '1.5T', 1024 -> bytes. Raises ValueError with the value."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    raw = str(text).strip()
    end = number_end(raw)
    unit = raw[end:].lstrip()
    if (
        end == 0
        or not ((unit.isascii() and unit.isalpha()) or not unit)
        or unit.lower() not in _SIZE_UNITS
    ):
        raise ValueError(
            f"not a size: {text!r} (use a number with B, K/KiB, M/MiB, G/GiB, T/TiB, "
            "or KB/MB/GB/TB for powers of ten)"
        )
    return int(float(raw[:end]) * _SIZE_UNITS[unit.lower()])


def parse_duration(text: str | int | float) -> float:
    """'90', '1.5', '2h30m', '45s', '1d', '200ms' -> seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not 0 <= text < _INFINITY:  # also refuses nan: a limit that never comes is no limit
            raise ValueError(f"duration must be a finite number of seconds, not {text}")
        return float(text)
    raw = str(text).strip().lower()
    try:
        seconds = float(raw)
    except ValueError:
        parts = duration_parts(raw)
        if parts is None:
            raise ValueError(
                f"not a duration: {text!r} (use seconds, or e.g. 2h30m, 45s, 1d, 200ms)"
            ) from None
        return float(sum(float(n) * _DURATION_UNITS[u] for n, u in parts))
    if not 0 <= seconds < _INFINITY:
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
