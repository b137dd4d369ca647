"""Per-user quotas on queued jobs and the bytes they store: `[limits] queued_jobs`, `queued_bytes`,
and `[quotas.*] max_queued_jobs` (core/sched/quotas.py), with the Unix groups quotas name.

Each job's row stores its command, environment, directory and name in full, so one user
with thousands of held jobs of 1 MiB environments would fill the disk and the daemon's
memory for everyone. The active jobs (pending, held, running) are counted per uid as they
enter and leave the daemon's table, never by a scan per submit; a submit that would take
its user over either limit is refused whole, before anything is queued.
"""

from __future__ import annotations

import time
from typing import Any

from gpusched.core.errors import GpuschedError
from gpusched.core.sched import quotas
from gpusched.core.users import unix_groups
from gpusched.daemon.jobs.jobtable import Distinct, JobTable

_ENV_SIZES_KEPT = 256  # environments whose size is remembered (a submit's jobs share one)


class _EnvSizes:
    """Bytes of an environment, by the dict's identity: a submit's 100,000 jobs share
    one dict, which must not be measured 100,000 times."""

    def __init__(self) -> None:
        self._sizes: dict[int, tuple[object, int]] = {}  # id -> (the dict, kept alive; its size)

    def __call__(self, env: Any) -> int:
        found = self._sizes.get(id(env))
        if found is not None and found[0] is env:
            return found[1]
        size = (
            sum(_text_bytes(k) + 1 + _text_bytes(v) for k, v in env.items())
            if isinstance(env, dict)
            else 0
        )
        if len(self._sizes) >= _ENV_SIZES_KEPT:
            self._sizes.clear()
        self._sizes[id(env)] = (env, size)
        return size


def _text_bytes(text: Any) -> int:
    if not isinstance(text, str):
        return 0
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


env_bytes = _EnvSizes()


def command_bytes(command: Any) -> int:
    """Bytes of a command's words (strings, as a checked job's are) together."""
    joined = "".join(command or ())
    return len(joined) if joined.isascii() else len(joined.encode("utf-8", "surrogatepass"))


def job_bytes(job: Any) -> int:
    """The text a job's row stores that its submitter chose: command, environment, working
    directory and name (a Job, or a table's template or Distinct entry for it)."""
    return (
        command_bytes(job.command)
        + env_bytes(job.env)
        + _text_bytes(job.cwd)
        + _text_bytes(job.name)
    )


class Reservation:
    """Jobs of a submit stored over several turns that the table does not hold yet."""

    def __init__(self, uid: int, jobs: int, size: int):
        self.uid, self.jobs, self.bytes = uid, jobs, size

    def shrink_to(self, jobs: int) -> None:
        """Only `jobs` of them are still not in the table (their share of the bytes)."""
        if self.jobs:
            self.bytes = self.bytes * jobs // self.jobs
        self.jobs = jobs


class CountedTable(JobTable):
    """The active jobs' table (JobTable), which counts each uid's jobs and bytes as they
    come and go, and the reservations of submits still being stored."""

    def __init__(self, kinds: Any):
        super().__init__(kinds)
        self.jobs_of: dict[int, int] = {}
        self.bytes_of: dict[int, int] = {}
        self.reserved: list[Reservation] = []
        # The last template (or whole job) counted: its bytes less its command's, and all.
        self._last: tuple[Any, int, int] = (None, 0, 0)

    def _count(self, entry: Any, sign: int) -> None:
        template = entry.template if type(entry) is Distinct else entry
        last = self._last
        if template is not last[0]:  # a sweep's jobs come in a run of one template
            whole = job_bytes(template)
            last = self._last = (template, whole - command_bytes(template.command), whole)
        uid = template.uid
        size = last[2] if entry is template else last[1] + command_bytes(entry.command)
        jobs = self.jobs_of.get(uid, 0) + sign
        if jobs:
            self.jobs_of[uid] = jobs
            self.bytes_of[uid] = self.bytes_of.get(uid, 0) + sign * size
        else:
            del self.jobs_of[uid], self.bytes_of[uid]

    def put_lean(self, job_id: int, entry: Any) -> None:
        old = self._entries.get(job_id)
        if old is not None:
            self._count(old, -1)
        self._count(entry, 1)
        self._entries[job_id] = entry

    def __setitem__(self, job_id: int, job: Any) -> None:
        self.put_lean(job_id, self.kinds.lean(job))

    def __delitem__(self, job_id: int) -> None:
        self._count(self._entries.pop(job_id), -1)

    def pop(self, job_id: int, *default: Any) -> Any:
        if job_id in self._entries:
            self._count(self._entries[job_id], -1)
        return super().pop(job_id, *default)

    def discard(self, job_id: int) -> None:
        entry = self._entries.pop(job_id, None)
        if entry is not None:
            self._count(entry, -1)

    def clear(self) -> None:
        super().clear()
        self.jobs_of, self.bytes_of = {}, {}

    def used(self, uid: int) -> tuple[int, int]:
        """(jobs, bytes) the uid has queued, with those of its submits being stored."""
        jobs, size = self.jobs_of.get(uid, 0), self.bytes_of.get(uid, 0)
        for held in self.reserved:
            if held.uid == uid:
                jobs, size = jobs + held.jobs, size + held.bytes
        return jobs, size

    def check(
        self,
        uid: int,
        user: str,
        jobs: int,
        size: int,
        settings: Any,
        what: str = "this submit",
        now: float | None = None,
    ) -> None:
        """Refuse a submit of `jobs` jobs storing `size` bytes that takes the uid over
        limits.queued_jobs or limits.queued_bytes, or the user over their max_queued_jobs
        quota at `now` (the daemon's clock; None: the time module's)."""
        has_jobs, has_bytes = self.used(uid)
        for key, has, adds, limit, unit in (
            ("queued_jobs", has_jobs, jobs, settings.limit_queued_jobs, "jobs"),
            ("queued_bytes", has_bytes, size, settings.limit_queued_bytes, "bytes"),
        ):
            if has + adds > limit:
                raise GpuschedError(
                    f"user {user} has {has:,} {unit} queued (pending, held or running) and "
                    f"{what} adds {adds:,}, over the limit of {limit:,} (limits.{key} in the "
                    "daemon's config); nothing was queued. Cancel some jobs (`gpusched "
                    "cancel`) or wait for them to end, or ask the daemon's admin to raise "
                    f"limits.{key}"
                )
        if not settings.quotas:
            return
        minute = quotas.local_minute(time.time() if now is None else now)
        quota = quotas.limits_for(settings.quotas, user, unix_groups(user), minute)
        queued = quota.get("max_queued_jobs")
        if queued is not None and has_jobs + jobs > queued.value:
            raise GpuschedError(
                f"user {user} has {has_jobs:,} jobs queued (pending, held or running) and "
                f"{what} adds {jobs:,}, over {queued.label()}; nothing was queued. Cancel "
                "some jobs (`gpusched cancel`) or wait for them to end (`gpusched usage` "
                "shows each quota)"
            )
