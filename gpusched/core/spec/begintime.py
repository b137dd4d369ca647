"""Slurm's --begin: the forms of a delayed start, read against a given clock (pure), and a
begin time as Slurm shows one."""

from __future__ import annotations

import datetime
import time

from gpusched.core.errors import UsageError
from gpusched.core.spec.syntax import is_digits

MAX_BEGIN_TIME = 253402300799.0  # --begin, epoch s: 9999-12-31, the last a 4-digit year writes
# Slurm's --begin (sbatch(1)): the forms read by parse_begin.
BEGIN_FORMS = (
    "HH:MM[:SS] (today, or tomorrow if past), now+N[seconds|minutes|hours|days|weeks], "
    "today, tomorrow, midnight, noon, teatime, YYYY-MM-DD[THH:MM[:SS]] or MM/DD[/YY]"
)
_BEGIN_UNITS = {
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400),
}
# Slurm's named times of day, next as HH:MM is (today, or tomorrow once past).
_BEGIN_HOURS = {"midnight": 0, "elevenses": 11, "noon": 12, "fika": 15, "teatime": 16}


def parse_begin(text: str, now: float) -> float:
    """Slurm's --begin TIME -> epoch seconds, in local time as of now (the clock is passed
    in). A time of day already past today is tomorrow's; a month and day already past
    this year is next year's, as in Slurm."""
    raw = text.strip().lower()
    today = datetime.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    when: datetime.datetime | None = None
    try:
        if raw.startswith("now"):
            return now + _begin_offset(raw[3:])
        if raw in ("today", "tomorrow"):
            when = today + datetime.timedelta(days=1 if raw == "tomorrow" else 0)
        elif raw in _BEGIN_HOURS or (":" in raw and "-" not in raw):
            clock = _BEGIN_HOURS.get(raw)
            when = _next_time_of_day(today, now, (clock, 0, 0) if clock is not None else _hms(raw))
        elif "-" in raw:
            day_text, _, clock_text = raw.partition("t")
            year, month, day = (int(p) for p in _parts(day_text, "-", 3, 3))
            when = datetime.datetime(year, month, day, *(_hms(clock_text) if clock_text else ()))
        elif "/" in raw:
            month, day, *yy = (int(p) for p in _parts(raw, "/", 2, 3))
            when = datetime.datetime(2000 + yy[0] if yy else today.year, month, day)
            if not yy and when < today:
                when = when.replace(year=today.year + 1)
    except (ValueError, OverflowError):
        when = None
    if when is None:
        raise UsageError(f"--begin {text!r} is not a time; use {BEGIN_FORMS}")
    return when.timestamp()


_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def parse_start(text: str, option: str, now: float) -> float:
    """A reservation's --start: --begin's forms, or a weekday with an optional time of day
    ('thu 14:00', 'friday'): the next such moment still to come."""
    day, _, clock = text.strip().lower().partition(" ")
    weekday = next(
        (i for i, name in enumerate(_WEEKDAYS) if len(day) >= 3 and name.startswith(day)), None
    )
    if weekday is None:
        try:
            return parse_begin(text, now)
        except UsageError:
            raise UsageError(
                f"{option} {text!r} is not a time; use {BEGIN_FORMS}, or a weekday and a "
                "time: thu 14:00"
            ) from None
    try:
        hms = _hms(clock.strip()) if clock.strip() else (0, 0, 0)
    except ValueError:
        raise UsageError(
            f"{option} {text!r}: {clock.strip()!r} is not a time of day (HH:MM)"
        ) from None
    today = datetime.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    for ahead in range(8):
        when = (today + datetime.timedelta(days=ahead)).replace(
            hour=hms[0], minute=hms[1], second=hms[2]
        )
        if when.weekday() == weekday and when.timestamp() > now:
            return when.timestamp()
    raise AssertionError("a weekday comes within 8 days")


def _begin_offset(text: str) -> float:
    """'+2hours' -> 7200.0, '' -> 0.0: now's offset."""
    if not text:
        return 0.0
    end = 1
    while end < len(text) and text[end].isascii() and text[end].isdigit():
        end += 1
    if text[0] != "+" or end == 1 or text[end:] not in _BEGIN_UNITS:
        raise ValueError(text)
    return float(int(text[1:end]) * _BEGIN_UNITS[text[end:]])


def _parts(text: str, sep: str, least: int, most: int) -> list[str]:
    parts = text.split(sep)
    if not least <= len(parts) <= most or not all(map(is_digits, parts)):
        raise ValueError(text)
    return parts


def _hms(text: str) -> tuple[int, int, int]:
    """'14:30' or '2:30pm' or '14:30:15' -> (hour, minute, second)."""
    half = text[-2:] if text.endswith(("am", "pm")) else ""
    hour, minute, *second = (int(p) for p in _parts(text[: len(text) - len(half)], ":", 2, 3))
    if half and not 1 <= hour <= 12:
        raise ValueError(text)
    hour = hour % 12 + (12 if half == "pm" else 0) if half else hour
    return hour, minute, second[0] if second else 0


def _next_time_of_day(
    today: datetime.datetime, now: float, hms: tuple[int, int, int]
) -> datetime.datetime:
    """Today at hms, or tomorrow if that is past."""
    when = today.replace(hour=hms[0], minute=hms[1], second=hms[2])
    return when if when.timestamp() > now else when + datetime.timedelta(days=1)


def begin_text(when: float) -> str:
    """A begin time as Slurm shows one, in local time: 2026-12-24T08:00:00."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))
