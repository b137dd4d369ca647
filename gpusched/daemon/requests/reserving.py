"""The reservation requests (reserve, reservations, unreserve): who may reserve which GPUs
when, checked and stored; the placement rule itself is core/sched/reservations.py's."""

from __future__ import annotations

from typing import Any

from gpusched.core.errors import GpuschedError, NotFound, PermissionDenied, UsageError
from gpusched.core.sched import reservations
from gpusched.core.sched.reservations import Reservation
from gpusched.core.users import user_name
from gpusched.daemon.state import DaemonState, Setup


class Reserving:
    def __init__(self, state: DaemonState, setup: Setup):
        self.state, self.setup = state, setup

    def list(self, args: dict[str, Any]) -> dict[str, Any]:
        """The reservations not yet ended, by start; those named only (each must exist)."""
        now = self.setup.clock.time()
        found = sorted(
            (r for r in self.state.reservations.values() if r.end > now),
            key=lambda r: (r.start, r.name),
        )
        names = args.get("names")
        if names:
            for name in names:
                self.find(name)
            found = [r for r in found if r.name in names]
        return {"reservations": [reservations.to_dict(r) for r in found], "now": now}

    def find(self, name: str) -> Reservation:
        found = self.state.reservations.get(name)
        if found is None or found.end <= self.setup.clock.time():
            known = ", ".join(sorted(self.state.reservations)) or "none"
            raise NotFound(
                f"no reservation {name!r} (reservations: {known}); `gpusched reserve ls` lists them"
            )
        return found

    def create(self, args: dict[str, Any], creds: tuple[int, int, int]) -> dict[str, Any]:
        now, me = self.setup.clock.time(), user_name(creds[1])
        self._drop_ended(now)
        gpus = tuple(sorted(set(args["gpus"])))
        users = tuple(dict.fromkeys(args.get("users") or [me]))
        start = max(args.get("start_time") or now, now)
        end = args["end_time"]
        if end <= start:
            raise UsageError("a reservation must end after it starts (and after now)")
        known = sorted(gpu.index for gpu in self.state.inventory.gpus)
        unknown = [index for index in gpus if index not in known]
        if unknown:
            raise UsageError(
                f"no GPU {unknown[0]} to reserve; this machine has GPUs "
                f"{reservations.gpus_text(known) or 'none'} (`gpusched gpus`)"
            )
        name = reservations.check_name(args.get("name") or self._free_name(users[0]))
        if name in self.state.reservations:  # as Slurm's refusals of a reservation: exit 1
            raise GpuschedError(
                f"reservation {name} exists already; `gpusched reserve delete {name}` removes it"
            )
        new = Reservation(name, gpus, users, start, end, me, now)
        self._check_allowed(new, creds)
        other = reservations.clash(new, self.state.reservations.values())
        if other is not None:
            raise GpuschedError(
                f"GPUs {reservations.gpus_text(other.gpus)} are reserved by {other.name} from "
                f"{reservations.clock_text(other.start)} to {reservations.clock_text(other.end)}; "
                "pick other GPUs or another time"
            )
        with self.state.write():
            self.state.store.put_reservation(new)
        self.state.note_reservation(name, new)
        return reservations.to_dict(new)

    def delete(self, name: str, creds: tuple[int, int, int]) -> dict[str, Any]:
        found = self.find(name)
        uid = creds[1]
        if found.created_by != user_name(uid) and not self.setup.authz.is_admin(uid):
            self.setup.authz.audit(creds, "unreserve", None, f"not the maker of {name}")
            raise PermissionDenied(
                f"reservation {name} was made by {found.created_by}; only they or an admin "
                "may delete it"
            )
        with self.state.write():
            self.state.store.delete_reservation(name)
        self.state.note_reservation(name, None)
        return {"deleted": name}

    def _check_allowed(self, new: Reservation, creds: tuple[int, int, int]) -> None:
        """An admin reserves for anyone; another user for themself alone, within
        [reservations] user_max_gpu_hours over all their reservations not yet ended."""
        uid = creds[1]
        if self.setup.authz.is_admin(uid):
            return
        limit = self.setup.settings.reservation_user_max_gpu_hours
        if not limit:
            self.setup.authz.audit(creds, "reserve", None, "not an admin")
            raise PermissionDenied(
                "only an admin may reserve GPUs here ([reservations] user_max_gpu_hours = 0)"
            )
        if new.users != (new.created_by,):
            self.setup.authz.audit(creds, "reserve", None, "for another user")
            raise PermissionDenied(
                f"you may reserve GPUs for yourself ({new.created_by}) only; an admin "
                f"may for {', '.join(new.users)}"
            )
        held = sum(
            r.gpu_hours for r in self.state.reservations.values() if r.created_by == new.created_by
        )
        if held + new.gpu_hours > limit:
            self.setup.authz.audit(creds, "reserve", None, "over user_max_gpu_hours")
            raise PermissionDenied(
                f"{new.gpu_hours:g} GPU-hours more would put {new.created_by} over "
                f"{limit:g} ([reservations] user_max_gpu_hours; holds {held:g}); "
                "reserve fewer GPUs or less time"
            )

    def _free_name(self, user: str) -> str:
        """As Slurm names one: the user and a number."""
        number = 1
        while f"{user}_{number}" in self.state.reservations:
            number += 1
        return f"{user}_{number}"

    def _drop_ended(self, now: float) -> None:
        ended = [name for name, r in self.state.reservations.items() if r.end <= now]
        if ended:
            with self.state.write():
                for name in ended:
                    self.state.store.delete_reservation(name)
            for name in ended:
                self.state.note_reservation(name, None)
