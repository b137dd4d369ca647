"""Quotas per user and per Unix group, with time windows: which limit applies to a user now,
and why a job of theirs waits (the daemon and the simulator both ask here)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpusched.core.units import size_human

# The keys a quota may set: running GPUs, GPU memory held by running jobs, running jobs,
# and active jobs (pending, held or running), refused at submit.
KEYS = ("max_running_gpus", "max_gpu_mem", "max_running_jobs", "max_queued_jobs")
DAY_MIN = 24 * 60

Limits = Mapping[str, int | None]  # key -> limit; None: no limit (overrides a wider quota)


@dataclass(frozen=True)
class Window:
    """Limits that apply between two times of day (start_min <= minute < end_min, or
    across midnight when the end comes first), over the quota's own."""

    name: str
    start_min: int
    end_min: int
    limits: Limits

    def covers(self, minute: float) -> bool:
        if self.start_min < self.end_min:
            return self.start_min <= minute < self.end_min
        return minute >= self.start_min or minute < self.end_min


@dataclass(frozen=True)
class Quota:
    scope: str  # "default", "users.NAME" or "groups.NAME": as the config file spells it
    limits: Limits
    windows: tuple[Window, ...] = ()


@dataclass(frozen=True)
class Quotas:
    default: Quota | None = None
    users: Mapping[str, Quota] = field(default_factory=dict)
    groups: Mapping[str, Quota] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.default is not None or bool(self.users) or bool(self.groups)

    def all(self) -> list[Quota]:
        return [q for q in (self.default,) if q] + [*self.users.values(), *self.groups.values()]


@dataclass(frozen=True)
class Limit:
    """One limit that applies to a user now, and where it comes from."""

    key: str
    value: int
    scope: str
    window: str = ""  # the window it comes from ("": the quota's own limits)
    until_min: int | None = None  # when it stops applying (a window's end or start)

    def label(self) -> str:
        """As a pending reason names it: `quota users.alice max_running_gpus=2 (day, until 18:00)`."""
        value = size_human(self.value) if self.key == "max_gpu_mem" else str(self.value)
        when = ""
        if self.until_min is not None:
            until = f"until {self.until_min // 60:02d}:{self.until_min % 60:02d}"
            when = f" ({self.window}, {until})" if self.window else f" ({until})"
        return f"quota {self.scope} {self.key}={value}{when}"


def local_minute(now: float) -> float:
    """The minute of the day in local time (the daemon's windows)."""
    t = time.localtime(now)
    return t.tm_hour * 60 + t.tm_min + t.tm_sec / 60


def trace_minute(now: float) -> float:
    """The minute of the day in a trace, whose time 0 is a midnight (the simulator's)."""
    return (now / 60) % DAY_MIN


def _own(quota: Quota, minute: float) -> dict[str, tuple[int | None, str, int | None]]:
    """A quota's limits at this minute: key -> (limit, window, until)."""
    out: dict[str, tuple[int | None, str, int | None]] = {}
    active = next((w for w in quota.windows if w.covers(minute)), None)
    for key, value in quota.limits.items():
        # Outside its windows a limit holds until the next window that sets the key.
        starts = [w.start_min for w in quota.windows if key in w.limits and w is not active]
        until = min(starts, key=lambda s: (s - minute) % DAY_MIN) if starts else None
        out[key] = (value, "", until)
    if active is not None:
        for key, value in active.limits.items():
            out[key] = (value, active.name, active.end_min)
    return out


def limits_for(quotas: Quotas, user: str, groups: Sequence[str], minute: float) -> dict[str, Limit]:
    """The limits that apply to a user now, by key: each key from the most specific quota
    that sets it (the user's, then their groups', the most generous of those, then the
    default). A key with no limit is left out."""
    chosen: dict[str, tuple[int | None, str, int | None, str]] = {}
    user_quota = quotas.users.get(user)
    if user_quota is not None:
        for key, (value, window, until) in _own(user_quota, minute).items():
            chosen[key] = (value, window, until, user_quota.scope)
    from_groups: dict[str, tuple[int | None, str, int | None, str]] = {}
    for group in groups:
        quota = quotas.groups.get(group)
        if quota is None:
            continue
        for key, (value, window, until) in _own(quota, minute).items():
            had = from_groups.get(key)
            if had is None or (had[0] is not None and (value is None or value > had[0])):
                from_groups[key] = (value, window, until, quota.scope)
    for key, found in from_groups.items():
        chosen.setdefault(key, found)
    if quotas.default is not None:
        for key, (value, window, until) in _own(quotas.default, minute).items():
            chosen.setdefault(key, (value, window, until, quotas.default.scope))
    return {
        key: Limit(key, value, scope, window, until)
        for key, (value, window, until, scope) in chosen.items()
        if value is not None
    }


def running_reason(
    user: str, limits: Mapping[str, Limit], gpus: int, used: tuple[int, int, int]
) -> str:
    """Why a job of `gpus` GPUs waits for the user's running-job and GPU quotas ("": it
    does not). `used`: the user's running jobs, GPUs and GPU memory (bytes) now."""
    jobs, held_gpus, _ = used
    limit = limits.get("max_running_jobs")
    if limit is not None and jobs + 1 > limit.value:
        return f"{limit.label()}: {user} runs {jobs} job{'s' * (jobs != 1)}"
    limit = limits.get("max_running_gpus")
    if limit is not None and gpus and held_gpus + gpus > limit.value:
        return f"{limit.label()}: {user} holds {held_gpus} GPU{'s' * (held_gpus != 1)}"
    return ""


def mem_reason(user: str, limits: Mapping[str, Limit], mem_bytes: int, held_bytes: int) -> str:
    """Why a job holding mem_bytes of GPU memory waits for the user's max_gpu_mem ("": it does not)."""
    limit = limits.get("max_gpu_mem")
    if limit is not None and mem_bytes and held_bytes + mem_bytes > limit.value:
        return f"{limit.label()}: {user} holds {size_human(held_bytes)}"
    return ""


def next_change(quotas: Quotas, now: float, minute_of: Callable[[float], float]) -> float | None:
    """When a window next opens or closes (epoch s), or None without windows: a pass is due
    then, since limits change."""
    bounds = {b for q in quotas.all() for w in q.windows for b in (w.start_min, w.end_min)}
    if not bounds:
        return None
    minute = minute_of(now)
    ahead = min(((b - minute) % DAY_MIN) or DAY_MIN for b in bounds)
    return now + ahead * 60
