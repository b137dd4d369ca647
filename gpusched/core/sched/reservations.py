"""GPU reservations: some GPUs kept for some users over a window of time, and the placement
filter that keeps every other job off them (pure: the daemon and the simulator share it)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.errors import NotFound, PermissionDenied, UsageError
from gpusched.core.models import Job
from gpusched.core.spec.begintime import begin_text

# A reservation's name: short, and safe in a table, a TOML key and a command line.
MAX_NAME = 40
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@dataclass(frozen=True)
class Reservation:
    name: str
    gpus: tuple[int, ...]  # GPU indices, as `gpusched gpus` numbers them
    users: tuple[str, ...]  # who may run jobs in it (--reservation NAME)
    start: float  # epoch s
    end: float
    created_by: str = ""
    created_at: float = 0.0

    def is_active(self, now: float) -> bool:
        return self.start <= now < self.end

    @property
    def gpu_hours(self) -> float:
        return len(self.gpus) * (self.end - self.start) / 3600


def check_name(name: object) -> str:
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= MAX_NAME
        or not set(name) <= NAME_CHARS
        or name[0] in "-."
    ):
        raise UsageError(
            f"reservation name {name!r} is not valid; use up to {MAX_NAME} letters, digits, "
            "'-', '_' or '.', not starting with '-' or '.'"
        )
    return name


def clash(new: Reservation, others: Iterable[Reservation]) -> Reservation | None:
    """Another reservation that holds one of new's GPUs at a time new does too."""
    for other in others:
        if (
            other.name != new.name
            and set(other.gpus) & set(new.gpus)
            and other.start < new.end
            and new.start < other.end
        ):
            return other
    return None


def check_job(job: Job, reserved: Mapping[str, Reservation], now: float) -> None:
    """Refuse a job --reservation NAME for a reservation that is not there (or has ended),
    is not the job's user's, or has too few GPUs for it (PermissionDenied, UsageError)."""
    found = reserved.get(job.reservation)
    if found is None or found.end <= now:
        known = ", ".join(sorted(r.name for r in reserved.values() if r.end > now)) or "none"
        raise NotFound(
            f"--reservation {job.reservation}: no such reservation (reservations: {known}); "
            "`gpusched reserve ls` lists them"
        )
    if job.user not in found.users:
        raise PermissionDenied(
            f"--reservation {found.name} is for {', '.join(found.users)}, not {job.user}"
        )
    if job.request.gpus > len(found.gpus):
        raise UsageError(
            f"--reservation {found.name} holds {len(found.gpus)} GPUs "
            f"({gpus_text(found.gpus)}); the job asks for {job.request.gpus}"
        )


def wait_reason(job: Job, reservations: Mapping[str, Reservation], now: float) -> str:
    """Why a job in a reservation (--reservation) may not start now: its window is to come
    or past, or the reservation is gone; "" when it may (or the job is in none)."""
    if not job.reservation:
        return ""
    own = reservations.get(job.reservation)
    if own is None or now >= own.end:
        return f"Reservation {job.reservation} has ended or was deleted"
    if now < own.start:
        return f"Reservation {own.name} (starts at {clock_text(own.start)})"
    return ""


def closed_gpus(
    job: Job, reservations: Mapping[str, Reservation], now: float, indices: Iterable[int]
) -> dict[int, Reservation]:
    """The GPUs (index -> the reservation that closes it) a job may not be placed on now.

    A job in a reservation runs on its GPUs only. Any other job stays off a reserved GPU
    where it would still run when the reservation starts, until the reservation ends: its
    --time decides, and a job without one stays off from the moment the reservation exists.
    """
    closed: dict[int, Reservation] = {}
    own = reservations.get(job.reservation) if job.reservation else None
    if own is not None:
        closed.update((index, own) for index in indices if index not in own.gpus)
    runs_until = now + (job.time_limit_s if job.time_limit_s is not None else math.inf)
    for other in reservations.values():
        if other is not own and now < other.end and runs_until > other.start:
            for index in other.gpus:
                closed.setdefault(index, other)
    return closed


def closed_reason(job: Job, closed: Mapping[int, Reservation], now: float) -> str:
    """The pending reason of a job that would fit but for the reservations' GPUs."""
    others = [r for r in closed.values() if r.name != job.reservation]
    if not others:
        own = next(iter(closed.values()))
        return f"Reservation {own.name}'s GPUs ({gpus_text(own.gpus)}) are busy"
    other = min(others, key=lambda r: (r.start, r.name))
    if other.is_active(now):
        return (
            f"GPUs {gpus_text(other.gpus)} are reserved "
            f"(reservation {other.name}, until {clock_text(other.end)})"
        )
    why = "no --time" if job.time_limit_s is None else "its --time runs past that"
    return (
        f"GPUs {gpus_text(other.gpus)} are reserved from {clock_text(other.start)} "
        f"(reservation {other.name}; {why})"
    )


def preempt_for(
    running: Sequence[Job], reservations: Mapping[str, Reservation], now: float
) -> list[tuple[Job, Reservation]]:
    """Preemptible jobs outside a reservation that hold its GPUs once it has started: the
    daemon preempts them (the others run on to their end)."""
    found = []
    for job in running:
        if not job.preemptible or job.requeueing:
            continue
        for r in reservations.values():
            if (
                r.name != job.reservation
                and r.is_active(now)
                and set(job.gpu_indices) & set(r.gpus)
            ):
                found.append((job, r))
                break
    return found


def times(reservations: Iterable[Reservation]) -> list[float]:
    """The moments a pass may decide otherwise: each reservation's start and end."""
    return [when for r in reservations for when in (r.start, r.end)]


def gpus_text(gpus: Sequence[int]) -> str:
    return ",".join(map(str, gpus))


# A reservation's time in local time, as --begin's: 2026-12-24T08:00:00.
clock_text = begin_text


def to_dict(r: Reservation) -> dict[str, object]:
    return {
        "name": r.name,
        "gpus": list(r.gpus),
        "users": list(r.users),
        "start": r.start,
        "end": r.end,
        "created_by": r.created_by,
        "created_at": r.created_at,
    }


def from_dict(data: Mapping[str, object]) -> Reservation:
    """A reservation as to_dict writes it (or a simulator's file reads it), checked."""
    try:
        gpus = tuple(int(g) for g in data["gpus"])  # type: ignore[attr-defined]
        users = tuple(str(u) for u in data.get("users", ()))  # type: ignore[attr-defined]
        start, end = float(data["start"]), float(data["end"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"reservation {data.get('name')!r}: {e}") from None
    if not gpus or end <= start:
        raise UsageError(f"reservation {data.get('name')!r} needs GPUs and an end after its start")
    return Reservation(
        check_name(data.get("name")),
        gpus,
        users,
        start,
        end,
        str(data.get("created_by", "")),
        float(data.get("created_at", 0.0)),  # type: ignore[arg-type]
    )
