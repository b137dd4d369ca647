"""The requests that only look: status, ls, show, logs, attach, env, wait, gpus, snapshot."""

from __future__ import annotations

import builtins
import os
from typing import Any

import psutil

from gpusched import __version__
from gpusched.client.protocol import LEAN_JOB_FIELDS
from gpusched.core import jobfilter
from gpusched.core.models import GpuInfo, Job, JobState, inventory_to_dict, job_to_dict
from gpusched.core.sched import dependencies, placement
from gpusched.core.spec.values import HIDDEN
from gpusched.daemon.jobs import forecasts, idlegpus
from gpusched.daemon.jobs.progress import progress_of
from gpusched.daemon.jobs.retention import removed_summary
from gpusched.daemon.requests import lsqueue, pagedreplies
from gpusched.daemon.requests.request import WAIT_SLICE_S, Request, Waiter, named, named_each
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc import runfile

# How long a forecast of the queue is kept while its jobs stay the same.
FORECAST_KEPT_S = 5.0


class Queries:
    def __init__(self, state: DaemonState, setup: Setup):
        self.state, self.setup = state, setup
        # The last forecast: (the jobs it was made for, when, what it gave).
        self._forecast: tuple[Any, float, dict[int, Any]] | None = None

    def status(self, req: Request) -> dict[str, Any]:
        state, setup = self.state, self.setup
        now = setup.clock.time()
        return {
            "pid": os.getpid(),
            "uptime_s": now - setup.started_at,
            "version": __version__,
            "backend": state.inventory.backend,
            "gpu_count": len(state.inventory.gpus),
            "gpu_problem": state.inventory.problem,
            "state_dir": str(setup.paths.state_dir),
            "socket": str(setup.paths.socket),
            "running": len(state.running()),
            "pending": state.pending_count(),
            "draining": state.draining,
            "policy": setup.rules.policy,
            "discipline": setup.queue_rules(state.draining).discipline,
            "host": self.host_usage(),
            "mem_enforcement": setup.mem_enforcement(),
            "fairshare_usage": state.usage.until(state.running(), now),
            "fairshare_half_life_s": setup.settings.fairshare_half_life_s,
            "removed_jobs": removed_summary(state.store),
            "write_problem": state.writes.to_dict(),
            "metrics": state.metrics_status,
            "mps": {**state.mps.to_dict(), "gpus": sorted(self._mps_gpus())},
            "damaged_jobs": [
                {"id": i, "reason": r} for i, r in sorted(state.store.damaged.items())
            ],
        }

    def host_usage(self) -> dict[str, Any]:
        """Cores and memory: usable, reserved by running jobs, and used by the whole host."""
        host, running = self.setup.host, self.state.running()
        mem = psutil.virtual_memory()
        return {
            "cpus": host.cpus,
            "cpus_reserved": sum(j.request.cpus for j in running),
            "mem_bytes": host.mem_bytes,
            "mem_reserved_bytes": sum(j.request.mem_bytes or 0 for j in running),
            "mem_used_bytes": mem.total - mem.available,
            "cpu_used_pct": psutil.cpu_percent(interval=None),
        }

    def list(self, req: Request) -> dict[str, Any]:
        """One page of the jobs the caller may see that pass the filters, in id order
        (pagedreplies.py): all of them, pending, running and (with all, or a finished state
        asked for) finished, however many; or with "last" only the newest that many."""
        state = self.state
        with_finished = bool(
            req.args.get("all") or set(req.args.get("states") or ()) & jobfilter.FINAL
        )
        viewer = self.setup.authz.viewer(req.creds[1])

        def matching(some: list[Job]) -> list[dict[str, Any]]:
            # Filtered as the caller sees them: a hidden name must not be found by its pattern.
            return jobfilter.select(viewer.jobs(self._as_known(some)), req.args)

        after, last = pagedreplies.start(req.args), pagedreplies.last(req.args)
        found = self._forecasts() if req.args.get("start") else None
        rows_of = lambda some: self.with_progress(matching(some), found)  # noqa: E731
        if req.args.get("pending_rows") is not None and not with_finished and last is None:
            return self._head(req, viewer, after, rows_of)
        if last is None:
            jobs, horizon = pagedreplies.list_candidates(
                state.jobs, state.store.finished if with_finished else None, after
            )
        else:  # each page finds the newest `last` again: pages stay stateless
            jobs, horizon = pagedreplies.last_candidates(
                state.jobs,
                state.store.finished_down_from if with_finished else None,
                matching,
                last,
                after,
            )
        page = pagedreplies.list_page(jobs, horizon, rows_of, pagedreplies.budget(req.args))
        return {**page, "write_problem": state.writes.to_dict()}

    def _head(self, req: Request, viewer: Any, after: int, rows_of: Any) -> dict[str, Any]:
        """A plain `ls`: the running jobs and the first pending ones, in pages like any
        list (each page works out the same head again), and the rest as a summary."""
        jobs, more = lsqueue.head(self.state, viewer, req.args, req.args["pending_rows"])
        page = pagedreplies.list_page(
            [job for job in jobs if job.id > after], None, rows_of, pagedreplies.budget(req.args)
        )
        return {**page, "more_pending": more, "write_problem": self.state.writes.to_dict()}

    def show(self, req: Request) -> dict[str, Any]:
        jobs = named_each(self.state, req.args["ids"], whole_arrays=False)
        viewer = self.setup.authz.viewer(req.creds[1])
        found = self._forecasts() if any(job.state is JobState.PENDING for job in jobs) else None
        return pagedreplies.by_position(
            jobs,
            req.args,
            lambda some: self.with_progress(viewer.jobs(self._as_known(some)), found),
        )

    def _forecasts(self) -> dict[int, Any]:
        """The pending jobs' forecast starts: a dry run of the queue (a third of a second
        with 500 pending), kept while no job is queued, started or ended, for at most
        FORECAST_KEPT_S: a client polling `show` (a watch of `gpusched mcp`, a script's
        loop) would otherwise cost the loop one each time."""
        jobs = (self.state.pending_version, frozenset(job.id for job in self.state.running()))
        now = self.setup.clock.monotonic()
        kept = self._forecast
        if kept is None or kept[0] != jobs or now - kept[1] > FORECAST_KEPT_S:
            kept = self._forecast = (jobs, now, forecasts.start_forecasts(self.state, self.setup))
        return kept[2]

    # `list` in a signature below is the method above: builtins.list is the type.
    def _as_known(self, jobs: builtins.list[Job]) -> builtins.list[Job]:
        """The jobs with the ends the daemon knows but could not store yet (a full disk)."""
        unstored = self.state.unstored_ends
        return [unstored.get(job.id, job) for job in jobs] if unstored else jobs

    def with_progress(
        self, rows: builtins.list[dict[str, Any]], found: dict[int, Any] | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Each running job's last gpusched.job.progress() report; None for the others.

        One small file read per running job; a report from an earlier attempt is ignored,
        and so is the message when the caller may not see the job's command.
        """
        now, settings = self.setup.clock.time(), self.setup.settings
        mig_labels: dict[str, str] | None = None
        for row in rows:
            if any(uuid.startswith("MIG-") for uuid in row["gpus"]):
                # A MIG device is GPU 0/2, not GPU 0: ls names it as gpus and top do.
                mig_labels = mig_labels or {
                    device.uuid: device.label
                    for gpu in self.state.inventory.gpus
                    for device in gpu.mig_devices
                }
                row["gpu_labels"] = [mig_labels.get(uuid, "?") for uuid in row["gpus"]]
            row["gpu_idle_since"] = idlegpus.flagged_since(self.state, settings, row["id"], now)
            row["end_unstored"] = row["id"] in self.state.unstored_ends
            job = self.state.jobs.get(row["id"])
            row["progress"] = report = progress_of(job, self.setup.paths)
            if job is not None and job.state is JobState.PENDING:  # a bounded pass's, maybe
                row["pending_reason"] = self.state.reason_of(job)
            if row["id"] in self.state.remote_ids:  # where Slurm has it
                row["cluster"] = self.state.clusters.describe(row["id"])
            if report is not None and row["command"] == [HIDDEN]:
                report["message"] = ""
        if found is not None:  # ls --start, show
            forecasts.add_forecasts(rows, found)
        return rows

    def logs(self, req: Request) -> dict[str, Any]:
        """The job, for its owner or an admin, whose client then reads the log files."""
        job = named(self.state, req.args["id"], whole_arrays=False)[0]
        self.setup.authz.require_owner([job], req.creds, "read its logs", "logs")
        return {"job": job_to_dict(job)}

    def attach(self, req: Request) -> dict[str, Any]:
        """For its owner or an admin: the job and where its shim serves its terminal if it
        has one (--pty, proc/ptyhost.py), which the client then connects to itself."""
        job = named(self.state, req.args["id"], whole_arrays=False)[0]
        self.setup.authz.require_owner([job], req.creds, "attach to it", "attach")
        if not job.pty:
            return {"job": job_to_dict(job), "socket": None}
        paths = self.setup.paths
        own_logs = runfile.own_log_paths(paths.jobs_dir, paths.log_root, job.user, job.id)
        return {"job": job_to_dict(job), "socket": runfile.pty_socket_path(own_logs[0], job.id)}

    def env(self, req: Request) -> dict[str, Any]:
        """The environment the job was submitted with (its owner's or an admin's to see)."""
        job = named(self.state, req.args["id"], whole_arrays=False)[0]
        self.setup.authz.require_owner([job], req.creds, "read its environment", "env")
        return {"id": job.id, "env": dict(job.env)}

    def wait(self, req: Request) -> dict[str, Any] | Waiter:
        """The jobs named, once all have ended: now, or through a Waiter the loop answers.
        The jobs come a page at a time (pagedreplies.py); the client asks for the next page."""
        # Ids become job ids now (an array's id all its elements, in order), so that
        # unknown ids fail now, not after the wait, and each later look is a lookup.
        ids = [job.id for job in named_each(self.state, req.args["ids"], whole_arrays=True)]
        # A finite number of 0 or more (protocol.ARGUMENTS): a NaN deadline would never come.
        timeout = req.args.get("timeout_s")
        deadline = self.setup.clock.monotonic() + min(timeout or WAIT_SLICE_S, WAIT_SLICE_S)
        never = None if req.args.get("keep_waiting") else self._never_starts
        waiter = Waiter(ids, lambda: self._waited(ids, req, waiter), deadline, never)
        return waiter.result() if waiter.ready(self.state.jobs) else waiter

    def _never_starts(self, job_id: int) -> str | None:
        job = self.state.jobs.get(job_id)
        if job is None or job.state is not JobState.PENDING:
            return None
        reason = self.state.reason_of(job)
        return reason if dependencies.NEVER_MET in reason else None

    def _waited(self, ids: builtins.list[int], req: Request, waiter: Waiter) -> dict[str, Any]:
        state = self.state
        viewer = self.setup.authz.viewer(req.creds[1])

        def rows_of(some: list[int]) -> list[dict[str, Any]]:
            stored = state.store.many([i for i in some if i not in state.jobs])  # one query
            return self.with_progress(
                viewer.jobs([job for i in some if (job := state.jobs.get(i) or stored.get(i))])
            )

        # An ended job has left the active ones: done once none named is still there.
        # Until then the jobs are not sent: the client only asks again.
        if any(i in state.jobs for i in ids):
            stuck = waiter.stuck()
            never = {} if stuck is None else {"never": {"id": stuck[0], "reason": stuck[1]}}
            return {"jobs": [], "next": None, "done": False, **never}
        return {**pagedreplies.by_position(ids, req.args, rows_of), "done": True}

    def gpus(self, req: Request) -> dict[str, Any]:
        state = self.state
        loads = {gpu.uuid: load for gpu, load in self._loads()}
        mps = self._mps_gpus()
        # Each whole GPU, then its MIG devices: a GPU in MIG mode is a row of its own
        # (its UUID, temperature and power), never given jobs itself.
        rows = [
            {
                **self._gpu_row(device, loads.get(device.uuid)),
                "mps": device.parent_index is None and device.index in mps,
            }
            for gpu in state.inventory.gpus
            for device in (gpu, *gpu.mig_devices)
        ]
        rows = self.setup.authz.viewer(req.creds[1]).gpus(rows)
        return {
            "backend": state.inventory.backend,
            "problem": state.inventory.problem,
            "gpus": rows,
            "host": self.host_usage(),
            "links": [list(row) for row in state.inventory.links],
        }

    def _mps_gpus(self) -> set[int]:
        """The GPUs under gpusched's MPS: those a running job shares while it runs."""
        if self.state.mps.state != "running":
            return set()
        return {
            index
            for job in self.state.running()
            if not job.request.is_exclusive and not job.container
            for index in job.gpu_indices
        }

    def _gpu_row(self, gpu: GpuInfo, load: Any) -> dict[str, Any]:
        return {
            "index": gpu.index,
            "label": gpu.label,
            "uuid": gpu.uuid,
            "name": gpu.name,
            "healthy": gpu.is_healthy,
            "health_reason": gpu.health_reason,
            "bus_id": gpu.bus_id,
            "mem_total_bytes": gpu.mem_total_bytes,
            "mem_used_bytes": gpu.mem_used_bytes,
            "mem_reserved_bytes": load.promised_bytes if load else 0,
            "util_pct": gpu.util_pct,
            "temperature_c": gpu.temperature_c,
            "power_w": gpu.power_w,
            "power_limit_w": gpu.power_limit_w,
            "compute_capability": gpu.compute_capability,
            "mig_mode": gpu.is_mig_mode,
            "parent_uuid": gpu.parent_uuid,
            "gpu_instance_id": gpu.gpu_instance_id,
            "compute_instance_id": gpu.compute_instance_id,
            "mig_profile": gpu.mig_profile,
            "numa_node": gpu.numa_node,
            "cpu_affinity": list(gpu.cpu_ids),
            "jobs": list(load.job_ids) if load else [],
            "processes": [
                {
                    "pid": p.pid,
                    "user": p.user,
                    "command": p.command,
                    "used_mem_bytes": p.used_mem_bytes,
                    "job": self.state.pid_jobs.get(p.pid),
                    "visible": p.is_visible,
                }
                for p in gpu.processes
            ],
        }

    def _loads(self) -> builtins.list[tuple[GpuInfo, placement.GpuLoad]]:
        """(GPU, its load: jobs on it and memory promised to them) for each schedulable GPU."""
        state = self.state
        loads = placement.gpu_loads(
            state.inventory,
            state.running(),
            state.pid_jobs,
            self.setup.rules,
            state.idle_since,
            self.setup.clock.time(),
            state.outside_peaks,
        )
        return [(gpu, loads[gpu.uuid]) for gpu in state.inventory.schedulable()]

    def snapshot(self, req: Request) -> dict[str, Any]:
        state = self.state
        viewer = self.setup.authz.viewer(req.creds[1])
        inventory = inventory_to_dict(state.inventory)
        inventory["gpus"] = viewer.gpus(inventory["gpus"])
        # Running jobs first, then the first pending ones (lsqueue.TOP_PENDING_ROWS, as
        # many as fit in a page, and their counts): top draws a screenful, and a queue of
        # 100,000 must not make its frame too large to send, or slow to make and read.
        # The pending ones only when they changed since the caller's last snapshot: top
        # asks every second, and sending (and reading) a thousand rows is most of a frame.
        version = state.pending_version
        same = req.args.get("pending_version") == version
        remote = [job for i in state.remote_ids if (job := state.jobs.get(i))]
        active = sorted(state.running() + remote, key=lambda j: (not j.is_running, j.id))
        if not same:
            active += lsqueue.pending_top(state, lsqueue.TOP_PENDING_ROWS)
        else:
            active = [job for job in active if job.is_running]
        lean = req.args.get("lean")

        def rows_of(some: list[Job]) -> list[dict[str, Any]]:
            rows = self.with_progress(viewer.jobs(some))
            return (
                [{key: row[key] for key in LEAN_JOB_FIELDS if key in row} for row in rows]
                if lean
                else rows
            )

        jobs, _ = pagedreplies.fill(pagedreplies.lazy(active, rows_of), pagedreplies.MAX_PAGE_BYTES)
        return {
            "daemon": self.status(req),
            "inventory": inventory,
            "reserved_bytes": {gpu.uuid: load.promised_bytes for gpu, load in self._loads()},
            # GPU reservations not yet ended (name, GPU indices, start, end): top marks their GPUs.
            "gpu_reservations": [
                [r.name, list(r.gpus), r.start, r.end]
                for r in state.reservations.values()
                if r.end > self.setup.clock.time()
            ],
            "pid_jobs": {str(pid): job for pid, job in state.pid_jobs.items()},
            "jobs": jobs,
            "jobs_left_out": len(active) - len(jobs),
            "pending_version": version,
            # What the pending rows stand for: top counts them, not the rows it got.
            "pending_total": lsqueue.pending_count(state)
            + sum(1 for job in remote if job.state is JobState.PENDING),
            "pending_mine": lsqueue.pending_count(state, req.creds[1])
            + sum(1 for job in remote if job.state is JobState.PENDING and job.uid == req.creds[1]),
            "pending_same": same,
            "services": [
                {
                    k: f[k]
                    for k in ("name", "wanted", "ready", "requests_per_s", "p95_ms", "in_flight")
                }
                for f in state.service_figures
            ],
        }
