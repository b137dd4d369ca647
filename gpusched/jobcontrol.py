"""The daemon's hands on jobs: adopt after a restart, notice ends, enforce limits, start."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from gpusched import host, lifecycle, placement, runner, scheduling
from gpusched.models import GpuInfo, Job, JobState, transition

if TYPE_CHECKING:
    from gpusched.daemon import Daemon

log = logging.getLogger("gpusched.jobs")


class JobControl:
    def __init__(self, daemon: Daemon):
        self.d = daemon
        self.placements: dict[int, int] = {}  # GPU index -> jobs placed (round-robin)
        self.usage: dict[str, float] = {}  # fair share: decayed GPU-seconds per user
        self._usage_at = time.monotonic()

    # -- after a restart ----------------------------------------------------------------
    def adopt(self) -> None:
        """Keep running jobs that still run, settle the rest."""
        d = self.d
        d.load_active(d.store.active())
        with d.store.write():
            for job in list(d.jobs.values()):
                if job.state is JobState.PENDING and runner.was_started(d.paths.jobs_dir, job.id):
                    self._recover_unrecorded_start(job)
        self.reconcile_running(check_liveness=True)
        log.info("adopted %d running jobs", len(d.running()))

    def _recover_unrecorded_start(self, job: Job) -> None:
        """A previous daemon started this job's shim but died before recording it."""
        found = runner.find_shim(self.d.paths.jobs_dir, job.id)
        pid, started = found if found else (None, None)
        self.d.save(transition(job, JobState.RUNNING, shim_pid=pid, shim_start_time=started,
                               boot_id=self.d.boot_id, started_at=time.time()))

    # -- ends -----------------------------------------------------------------------------
    def reconcile_running(self, check_liveness: bool = False) -> None:
        """Record runs that ended: from their exit record, or as lost if their shim vanished."""
        d = self.d
        if not d.running():
            return
        with d.store.write():
            for job in d.running():
                record = runner.read_exit_record(d.paths.jobs_dir, job.id)
                if record is None and check_liveness and not runner.is_alive(job):
                    # Read again: the shim may have written its record and exited since.
                    record = runner.read_exit_record(d.paths.jobs_dir, job.id)
                    if record is None:
                        self.end(job, JobState.LOST, time.time(), end_reason=(
                            "the job's shim vanished without an exit record "
                            "(killed, or the machine rebooted)"))
                        continue
                if record is not None:
                    if d.cgroups and d.cgroups.oom_killed(job.id):
                        job = replace(job, oom_killed=True)
                    state = lifecycle.end_state(job, record.exit_code, record.error)
                    self.end(job, state, record.ended_at, exit_code=record.exit_code,
                             signal=record.signal, end_reason=record.error)

    def end(self, job: Job, state: JobState, when: float, **record) -> None:
        ended = lifecycle.finish(job, state, when, **record)
        if self.d.cgroups:
            self.d.cgroups.remove(job.id)
        if ended.state is JobState.PENDING:
            runner.clear_run(self.d.paths.jobs_dir, job.id)  # the next attempt starts clean
            log.info("job %d re-queued (attempt %d)", job.id, ended.attempt)
        self.d.save(ended)

    # -- what running jobs use -------------------------------------------------------------
    def check_memory(self) -> None:
        """Record each job's host-memory peak; report (and with enforce_mem, stop) overuse."""
        d = self.d
        changed = []
        for job in d.running():
            rss = runner.tree_rss_bytes(job)
            if rss is None:
                continue
            update = {}
            if rss > (job.mem_peak_bytes or 0):
                update["mem_peak_bytes"] = rss
            limit = lifecycle.mem_limit_bytes(job, d.settings.mem_margin_pct)
            if limit is not None and rss > limit and not job.mem_over:
                update["mem_over"] = True
                runner.append_to_log(job.stderr_path, lifecycle.mem_warning(job, rss, limit))
            if limit is not None and rss > limit and d.settings.enforce_mem and not job.oom_killed:
                update["oom_killed"] = True
                runner.kill_job_now(job)  # the shim records the kill; end_state says oom
            if update:
                changed.append(replace(job, **update))
        self._save_all(changed)

    def record_gpu_peaks(self, observed: dict[int, int]) -> None:
        """Keep each job's largest GPU memory seen on one of its GPUs (from NVML processes)."""
        self._save_all([replace(job, gpu_mem_peak_bytes=observed[job.id])
                        for job in self.d.running()
                        if observed.get(job.id, 0) > (job.gpu_mem_peak_bytes or 0)])

    def _save_all(self, jobs: list[Job]) -> None:
        if jobs:
            with self.d.store.write():
                for job in jobs:
                    self.d.save(job)

    # -- time limits ----------------------------------------------------------------------
    def enforce_limits(self, now: float) -> None:
        due = []
        for job in self.d.running():
            step = lifecycle.next_limit_action(job)
            if step is not None and step[0] <= now:
                due.append((job, step[1]))
        if not due:
            return
        with self.d.store.write():
            for job, action in due:
                changed, signum = lifecycle.apply_limit_action(job, action)
                self.d.save(changed)
                runner.signal_job(changed, signum)

    def next_deadline(self) -> float | None:
        """When the next time-limit action is due (epoch seconds)."""
        times = [step[0] for job in self.d.running()
                 if (step := lifecycle.next_limit_action(job))]
        return min(times, default=None)

    # -- starts ---------------------------------------------------------------------------
    def start_ready(self) -> None:
        d = self.d
        pending = d.pending()
        if not pending:
            return
        now = time.time()
        running = d.running()
        self._decay_usage(running)
        loads = placement.gpu_loads(d.inventory, running, d.pid_jobs, d.rules,
                                    d.idle_since, now)
        plan = scheduling.schedule(pending, running, loads, d.inventory, d.rules,
                                   d.queue_rules(), now, self._dependency_states(pending),
                                   self.usage, self.placements)
        with d.store.write():
            for job_id, gpus in plan.starts:
                self.start(d.jobs[job_id], gpus)
            for job_id, reason in plan.cancels.items():
                d.save(transition(d.jobs[job_id], JobState.CANCELLED, ended_at=now,
                                  end_reason=reason))
            for job_id, reason in plan.reasons.items():
                if d.jobs[job_id].pending_reason != reason:
                    d.save(replace(d.jobs[job_id], pending_reason=reason))

    def _dependency_states(self, pending: list[Job]) -> dict[int, JobState]:
        wanted = {dep for job in pending for _, dep in job.dependencies}
        states = {i: self.d.jobs[i].state for i in wanted if i in self.d.jobs}
        states.update(self.d.store.states(wanted - states.keys()))
        for array_id in wanted:
            elements = self.d.store.array(array_id)
            if len(elements) > 1:
                states[array_id] = _array_state(
                    [self.d.jobs.get(j.id, j).state for j in elements])
        return states

    def _decay_usage(self, running: list[Job]) -> None:
        now = time.monotonic()
        self.usage = scheduling.decay_usage(self.usage, running, now - self._usage_at,
                                            self.d.settings.fairshare_half_life_s)
        self._usage_at = now

    def start(self, job: Job, gpus: tuple[GpuInfo, ...]) -> None:
        d = self.d
        for gpu in gpus:
            self.placements[gpu.index] = self.placements.get(gpu.index, 0) + 1
        taken = [j.master_port for j in d.running() if j.master_port]
        port = runner.pick_master_port(d.settings.master_port_min, d.settings.master_port_max, taken)
        if d.settings.cpu_binding:
            busy = [c for j in d.running() for c in j.cpu_ids]
            job = replace(job, cpu_ids=host.pick_cpus(d.host, job.request.cpus, busy))
        cgroup = None
        limit = lifecycle.mem_limit_bytes(job, d.settings.mem_margin_pct)
        if d.cgroups and d.settings.enforce_mem and limit is not None:
            cgroup = d.cgroups.create(job.id, limit)
        started_at = time.time()
        env = runner.job_environment(job, gpus, port, d.settings.visible_devices, started_at,
                                     dict(d.settings.job_env))
        try:
            pid, pid_started = runner.start_shim(job, env, d.paths.jobs_dir, d.paths.wake_socket,
                                                 d.settings.cancel_grace_s, d.launcher, cgroup,
                                                 run_as=job.uid if d.paths.is_system else None)
        except OSError as exc:  # no shim (the job dir, the launcher): the job, not the daemon, fails
            log.exception("cannot start job %d", job.id)
            pid, pid_started, failure = None, None, f"cannot start its shim: {exc}"
        else:
            failure = ""
        # No GPU read is needed now: until the next one, the new job's whole declared
        # memory counts as promised (placement.gpu_loads).
        started = transition(
            job, JobState.RUNNING, started_at=started_at, gpu_uuids=tuple(g.uuid for g in gpus),
            gpu_indices=tuple(g.index for g in gpus), master_port=port, pending_reason="",
            shim_pid=pid, shim_start_time=pid_started, boot_id=d.boot_id)
        d.save(transition(started, JobState.FAILED, ended_at=time.time(), end_reason=failure)
               if failure else started)


def _array_state(states: list[JobState]) -> JobState:
    """A dependency on an array means on all of it, as in Slurm: it has ended when every
    element has, and it succeeded only if every element did."""
    if not all(s.is_final for s in states):
        return JobState.RUNNING
    return JobState.SUCCEEDED if all(s is JobState.SUCCEEDED for s in states) else JobState.FAILED
