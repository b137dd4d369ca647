"""`gpusched usage`: GPU time, observed GPU memory over time, jobs by final state, the
mean queue wait and GPU memory asked for against used, per user (or job name), from the store, read over several turns of the
loop; jobs retention removed come from its summary (daemon/jobs/retention.py), which has no
time breakdown."""

from __future__ import annotations

import json
import time
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.sched import quotas
from gpusched.core.sched.passcounts import job_gpu_mem
from gpusched.core.sched.placement import GpuLoad
from gpusched.core.sched.rightsize import Sizing, asked_bytes, gpu_mem_totals
from gpusched.core.spec.jobname import program_name_of_json
from gpusched.core.users import unix_groups, user_name
from gpusched.daemon.jobs.retention import removed_summary
from gpusched.daemon.requests.batches import TURN_BUDGET_S, Batched
from gpusched.daemon.state import DaemonState, Setup
from gpusched.store.rowusage import row_usage

GROUPINGS = ("user", "name")


# Ids one query reads: a window of the primary key, so that a turn of the loop stays short
# however many jobs the store holds (a report over 100,000 read at once took a second).
WINDOW_IDS = 2000


def usage_request(state: DaemonState, setup: Setup, req: Any) -> UsageReport:
    """The report for the request's since_s (seconds back; None: everything) and by, as
    the caller may see it (authz.Viewer: other users' job names are theirs)."""
    by = req.args.get("by") or "user"
    if by not in GROUPINGS:
        raise UsageError(f"cannot group usage by {by!r}; use one of: {', '.join(GROUPINGS)}")
    return UsageReport(state, setup, by, req.args.get("since_s"), setup.authz.viewer(req.creds[1]))


class UsageReport(Batched):
    """Sums the store a window of ids at a time, for about TURN_BUDGET_S a turn: the loop
    answers other requests between windows. Answered with the report once all are read."""

    def __init__(self, state: DaemonState, setup: Setup, by: str, since_s: Any, viewer: Any):
        self.state, self.by, self.viewer = state, by, viewer
        self.now = setup.clock.time()
        self.gpu_mem_totals = gpu_mem_totals(state.inventory)
        self.quotas = quota_use(state, setup, user_name(viewer.uid), self.now)
        self.since = None if since_s is None else self.now - float(since_s)
        self.groups: dict[str, dict[str, Any]] = {}
        self._next_id, self._last_id = 1, state.store.finished_extent()[1]

    def step(self) -> dict[str, Any] | None:
        deadline = time.monotonic() + TURN_BUDGET_S  # real time, as batches.py: a turn's length
        while self._next_id <= self._last_id:  # at least one window a turn, however slow
            last = self._next_id + WINDOW_IDS - 1
            rows = self.state.store.used_between(
                self._next_id,
                last,
                0.0 if self.since is None else self.since,
                by_name=self.by == "name",
            )
            self._next_id = last + 1
            for row in rows:
                self._add_row(row)
            if time.monotonic() >= deadline:
                break
        return self._report() if self._next_id > self._last_id else None

    def _add_row(self, row: Any) -> None:
        if row["started_at"] is None and row["ended_at"] is None:
            return  # pending: nothing used yet
        # A job's name is the one `ls` shows: its --name, else its program (core/spec/jobname.py).
        key = (
            row["user"]
            if self.by == "user"
            else row["name"] or program_name_of_json(row["command"])
        )
        key = self.viewer.usage_key(key, row["uid"], self.by)
        sums = self.groups.setdefault(key, _empty())
        used = row_usage(row, self.since, self.now)
        sums["jobs"] += 1
        sums["states"][row["state"]] = sums["states"].get(row["state"], 0) + 1
        if row["gpu_mem_peak_bytes"]:  # else not counted: skip reading its GPUs
            uuids = () if row["gpu_mem_bytes"] else json.loads(row["gpu_uuids"] or "[]")
            asked = asked_bytes(row["gpu_mem_bytes"], uuids, self.gpu_mem_totals)
            sums["sizing"].add(asked, row["gpu_mem_peak_bytes"])
        _add(
            sums,
            used["gpu_s"],
            used["mem_byte_s"],
            *((1, used["wait_s"]) if used["wait_s"] >= 0 else (0, 0.0)),
        )

    def _report(self) -> dict[str, Any]:
        groups = self.groups
        removed = removed_summary(self.state.store)
        # Removed jobs have sums per user and state, and no times: they belong to a report
        # of all time by user, and to no other.
        included = self.since is None and self.by == "user"
        if included:
            _add_removed(groups, removed)
        return {
            "since": self.since,
            "until": self.now,
            "by": self.by,
            "groups": [_finish(key, sums) for key, sums in sorted(groups.items())],
            "total": _finish("", _total(groups.values())),
            "removed_jobs": {"jobs": removed.get("jobs", 0), "included": included},
            "quotas": self.quotas,
        }


def quota_use(state: DaemonState, setup: Setup, caller: str, now: float) -> list[dict[str, Any]]:
    """Each limit that applies now to the caller and to each user with active jobs, with
    what they use of it (running jobs, GPUs and GPU memory; queued: pending, held or running)."""
    table = setup.settings.quotas
    if not table:
        return []
    used: dict[str, dict[str, int]] = {}
    names = {caller} | {user_name(uid) for uid in state.jobs.jobs_of}
    for name in names:
        used[name] = dict.fromkeys(quotas.KEYS, 0)
    for uid, count in state.jobs.jobs_of.items():
        used[user_name(uid)]["max_queued_jobs"] += count
    loads = {gpu.uuid: GpuLoad(gpu) for gpu in state.inventory.gpus}
    for job in state.running():
        mine = used.setdefault(job.user, dict.fromkeys(quotas.KEYS, 0))
        mine["max_running_jobs"] += 1
        mine["max_running_gpus"] += job.request.gpus
        mine["max_gpu_mem"] += job_gpu_mem(job, job.gpu_uuids, loads)
    minute = quotas.local_minute(now)
    rows = []
    for user in sorted(used):
        for key, limit in quotas.limits_for(table, user, unix_groups(user), minute).items():
            until = limit.until_min
            rows.append(
                {
                    "user": user,
                    "key": key,
                    "used": used[user][key],
                    "limit": limit.value,
                    "scope": limit.scope,
                    "window": limit.window or None,
                    "until": None if until is None else f"{until // 60:02d}:{until % 60:02d}",
                    "quota": limit.label(),
                }
            )
    return rows


def _empty() -> dict[str, Any]:
    return {
        "jobs": 0,
        "states": {},
        "gpu_s": 0.0,
        "mem_byte_s": 0.0,
        "waited": 0,
        "wait_s": 0.0,
        "sizing": Sizing(),
    }


def _add(sums: dict[str, Any], gpu_s: float, mem_byte_s: float, waited: int, wait_s: float) -> None:
    sums["gpu_s"] += gpu_s
    sums["mem_byte_s"] += mem_byte_s
    sums["waited"] += waited
    sums["wait_s"] += wait_s


def _add_removed(groups: dict[str, dict[str, Any]], removed: dict[str, Any]) -> None:
    for user, states in removed.get("by_user", {}).items():
        sums = groups.setdefault(user, _empty())
        for state_name, part in states.items():
            sums["jobs"] += part.get("jobs", 0)
            sums["states"][state_name] = sums["states"].get(state_name, 0) + part.get("jobs", 0)
            _add(
                sums,
                part.get("gpu_s", 0.0),
                part.get("mem_byte_s", 0.0),
                part.get("waited", 0),
                part.get("wait_s", 0.0),
            )


def _total(all_sums: Any) -> dict[str, Any]:
    total = _empty()
    for sums in all_sums:
        total["jobs"] += sums["jobs"]
        for name, count in sums["states"].items():
            total["states"][name] = total["states"].get(name, 0) + count
        _add(total, sums["gpu_s"], sums["mem_byte_s"], sums["waited"], sums["wait_s"])
        total["sizing"].merge(sums["sizing"])
    return total


def _finish(key: str, sums: dict[str, Any]) -> dict[str, Any]:
    """One line of the report, in base units (seconds, byte-seconds)."""
    return {
        "key": key,
        "jobs": sums["jobs"],
        "states": dict(sorted(sums["states"].items())),
        "gpu_seconds": sums["gpu_s"],
        "gpu_mem_byte_seconds": sums["mem_byte_s"],
        "mean_wait_s": sums["wait_s"] / sums["waited"] if sums["waited"] else None,
        # Asked-for against peak GPU memory, over the jobs with both (core/sched/rightsize.py).
        "right_sizing": sums["sizing"].to_dict(),
    }
