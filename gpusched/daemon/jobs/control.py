"""The daemon's hands on jobs: adopt after a restart, notice ends, enforce limits, start."""

from __future__ import annotations

import logging
import queue
import signal
from dataclasses import replace
from typing import Any

from gpusched.core import lifecycle
from gpusched.core.errors import StoreWriteError
from gpusched.core.models import GpuInfo, Job, JobState, job_with, transition
from gpusched.core.sched import placement, preemption, queuerules, quotas, scheduling
from gpusched.daemon import host
from gpusched.daemon.jobs import containers, endreports, gpumemory, preempt, requeue
from gpusched.daemon.jobs.arrays import ArrayShapes
from gpusched.daemon.jobs.depstates import DependencyLookup
from gpusched.daemon.jobs.lostrunners import ShimLoss
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc import jobenv, runfile
from gpusched.proc.seam import ProcessSeam

log = logging.getLogger("gpusched.jobs")
# A shim is forked within milliseconds of its launch; one whose pid has not appeared in
# its run file after this long never will (the launcher, or the daemon between storing
# the start and sending it, died with the request).
LAUNCH_TIMEOUT_S = 60.0


class JobControl:
    def __init__(self, state: DaemonState, setup: Setup, seam: ProcessSeam):
        self.state, self.setup, self.seam = state, setup, seam
        self.placements: dict[int, int] = {}  # GPU index -> jobs placed (round-robin)
        # The specs of jobs started this pass, for launch_started.
        self.launches: list[dict[str, Any]] = []
        # (job id, why) of starts that failed with no exit record to say so (start_failed):
        # filled by the wake socket's thread and by launch_started, emptied by the passes.
        self.start_failures: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        self.holders: set[int] = set()  # pending jobs with GPUs kept for them (preemption)
        self.shim_loss = ShimLoss(setup, seam)
        self.run_reads = endreports.RunReads()  # ends reported by wake-ups, for the next pass
        self.array_shapes = ArrayShapes(state.store)
        self.quota_change = self._next_quota_change(setup.clock.time())  # a window's edge

    # -- after a restart ----------------------------------------------------------------
    def adopt(self) -> None:
        """Keep running jobs that still run, settle the rest.

        A job is stored as running before its shim is launched (see start), so a pending
        job never has a shim, and a running one's shim is found in its run file.
        """
        state = self.state
        state.usage.load(state.store)
        state.load_active(state.store.each_active())
        self.holders = {job_id for job_id, job in state.pending_alike() if job.preempt_hold}
        try:
            self.reconcile_running(check_liveness=True, adopting=True)
        except StoreWriteError:
            pass  # in the log (WriteHealth); the loop's passes try again
        state.mps.adopt()
        for job in state.running():
            if job.master_port:
                self.seam.hold_port(job.id, job.master_port)
        log.info("adopted %d running jobs", len(state.running()))

    # -- ends -----------------------------------------------------------------------------
    def reconcile_running(self, check_liveness: bool = False, adopting: bool = False) -> None:
        """Learn new shims' pids (from the supervisor's acknowledgements, or the run files);
        record runs that ended, from their exit record (for a start that failed without
        one, the record start_failed stands in for), or as lost if their shim vanished
        (once what it left running is gone) or never started.
        Reads the run files of the jobs daemon/jobs/endreports.py names: with check_liveness,
        every running job's. adopting (after a restart): the seam learns each shim again."""
        state, jobs_dir = self.state, self.setup.paths.jobs_dir
        reported = self.run_reads.take()
        if not state.running():
            self._take_start_failures()
            return
        with state.write():
            state.on_rollback(lambda: self.run_reads.put_back(reported))  # for the next pass
            self._learn_started(self.seam.started())
            told = self._take_start_failures()
            also = set(told).union(self.shim_loss.term_sent_at)
            for job in endreports.to_read(state.running(), reported, check_liveness, also):
                run = runfile.read_run(jobs_dir, job.id, runfile.run_token(job))
                record = run.exit
                if record is None and run.shim is None:  # a run file shows what did start
                    record = told.get(job.id)
                elif record is None and job.runner_pid is None:
                    job = self._found_shim(job, self.seam.identify_shim(*run.shim))
                elif record is None and adopting:
                    # Its pid was stored: the seam learns again whether the supervisor runs
                    # it, so that a stop goes there, which sends the grace's SIGKILL.
                    self.seam.identify_shim(*run.shim)
                looked_at = check_liveness or self.shim_loss.is_stopping(job.id)
                if record is None and looked_at and not self._is_alive(job):
                    # Read again: the shim may have written its record and exited since.
                    record = runfile.read_run(jobs_dir, job.id, runfile.run_token(job)).exit
                    if record is None:
                        self._shim_lost(job, run.shim is not None)
                        continue
                if record is not None:
                    if self.setup.cgroups and self.setup.cgroups.oom_killed(job.id):
                        job = replace(job, oom_killed=True)
                    end_state = lifecycle.end_state(job, record.exit_code, record.error)
                    reason = lifecycle.end_reason(
                        job, end_state, record.exit_code, record.signal, record.error
                    )
                    job, end_state, reason, retry = gpumemory.settle_end(
                        job,
                        end_state,
                        reason,
                        record,
                        self.state.inventory,
                        self.setup.settings.mem_headroom_bytes,
                    )
                    self.end(
                        job,
                        end_state,
                        record.ended_at,
                        retry=retry,
                        exit_code=record.exit_code,
                        signal=record.signal,
                        end_reason=reason,
                    )

    def start_failed(self, job_id: int, why: str) -> None:
        """A start that failed with no exit record to say so: the runner could not make the
        job's run file (its wake-up said why, runfile.launch_failure), or could not be asked
        to start it (launch_started). The next reconcile_running ends the job as if its
        runner had recorded the failure, unless a run file shows that a runner got going."""
        self.start_failures.put((job_id, why))

    def _take_start_failures(self) -> dict[int, runfile.ExitRecord]:
        """The failures start_failed was told of, as the exit records their runners could
        not write: one end for every failed start (reconcile_running)."""
        told: dict[int, str] = {}
        while not self.start_failures.empty():
            job_id, why = self.start_failures.get_nowait()
            told[job_id] = why
        self.state.on_rollback(lambda: self._put_back(told))  # for the next pass
        now = self.setup.clock.time()
        return {
            job_id: runfile.ExitRecord(None, None, now, f"cannot start its shim: {why}")
            for job_id, why in told.items()
        }

    def _put_back(self, told: dict[int, str]) -> None:
        for failure in told.items():
            self.start_failures.put(failure)

    def _learn_started(self, started: dict[str, runfile.ShimRecord]) -> None:
        """The pids the supervisor acknowledged with the starts (seam.started, by run
        token): kept as if read from the run files, which then need not be read for them."""
        for run, shim in started.items():
            job_id, _, _ = run.partition(".")
            job = self.state.jobs.get(int(job_id)) if job_id.isdigit() else None
            if job and job.is_running and not job.runner_pid and runfile.run_token(job) == run:
                self._found_shim(job, self.seam.identify_shim(*shim))

    def _found_shim(self, job: Job, shim: tuple[int, float]) -> Job:
        """A new shim has written its pid into the run file: keep it (in memory: the run
        file is where a restarted daemon finds it again), and pass on a cancel, or a
        checkpoint signal whose grace still runs, that came before it (stored with the
        pid then, so that a restarted daemon does not send it again)."""
        job = replace(job, runner_pid=shim[0], runner_start_time=shim[1])
        if job.cancel_requested:
            self.state.save(job)
            self._signal_after_commit(job, signal.SIGTERM)
        elif (
            requeue.is_being_stopped(job) and (job.requeue_term_at or 0.0) > self.setup.clock.time()
        ):
            self.state.save(job)
            self._signal_after_commit(
                job, requeue.checkpoint_signal(job, self.setup.settings.preempt_signal)
            )
        else:
            self.state.remember(job)
        return job

    def _shim_lost(self, job: Job, got_going: bool) -> None:
        """The job's shim is gone without an exit record: the job is lost, but its GPUs
        stay its own while processes it left run on (daemon/jobs/lostrunners.py).
        got_going: its run file has the shim's record (it writes that before the job)."""
        now = self.setup.clock.time()
        if not got_going:
            self.end(
                job,
                JobState.LOST,
                now,
                end_reason="its shim never started (the shim launcher died?)",
            )
            return
        stopping = self.shim_loss.stop_leftovers(job)
        if stopping is None:
            self.end(job, JobState.LOST, now, end_reason=self.shim_loss.lost_reason(job))
            if job.container:  # its shim would have removed it
                removal = containers.lost_removal(job, self.setup.settings, self.setup.paths)
                self.state.after_commit(lambda: self.seam.remove_container(removal))
        elif stopping.end_reason != job.end_reason:
            self.state.save(stopping)

    def _is_alive(self, job: Job) -> bool:
        if job.runner_pid is None:  # being launched, unless that takes implausibly long
            return self.setup.clock.time() - (job.started_at or 0.0) < LAUNCH_TIMEOUT_S
        return self.seam.is_alive(job)

    def end(
        self, job: Job, end_state: JobState, when: float, retry: bool = True, **record: Any
    ) -> None:
        """Store a run's end (inside a write); its port, cgroup and run file are let go
        once that commits: until then the run file is the only record of the end."""
        self.state.usage.run_ended(job, when)
        if requeue.is_requeued_end(job):
            ended = requeue.end_requeued(self.state, job, when, **record)
        else:
            ended = lifecycle.finish(job, end_state, when, retry, **record)
            self.state.save(ended)
        self.state.after_commit(lambda: self._let_go(ended))
        self.state.on_rollback(lambda: self.state.note_end_unstored(ended))

    def _let_go(self, ended: Job) -> None:
        self.state.note_end_unstored(ended, stored=True)
        self.seam.release_port(ended.id)
        if self.setup.cgroups:
            self.setup.cgroups.remove(ended.id)
        if ended.state is JobState.PENDING:
            runfile.clear_run(self.setup.paths.jobs_dir, ended.id)  # the next attempt starts clean
            log.info("job %d re-queued (attempt %d)", ended.id, ended.attempt)

    # -- what running jobs use -------------------------------------------------------------
    def check_memory(self) -> None:
        """Record each job's host-memory peak; report (and with enforce_mem, stop) overuse."""
        settings = self.setup.settings
        changed = []
        for job in self.state.running():
            rss = self.seam.tree_rss_bytes(job)
            if rss is None:
                continue
            update: dict[str, Any] = {}
            if rss > (job.mem_peak_bytes or 0):
                update["mem_peak_bytes"] = rss
            limit = lifecycle.mem_limit_bytes(job, settings.mem_margin_pct)
            if limit is not None and rss > limit and not job.mem_over:
                update["mem_over"] = True
                self.seam.append_to_log(
                    job.stderr_path, lifecycle.mem_warning(job, rss, limit), job.uid
                )
            if limit is not None and rss > limit and settings.enforce_mem and not job.oom_killed:
                update["oom_killed"] = True
                self.seam.kill_job_now(job)  # the shim records the kill; end_state says oom
            if update:
                changed.append(replace(job, **update))
        self._save_all(changed)

    def record_gpu_peaks(self, observed: dict[int, int]) -> None:
        """Keep each job's largest GPU memory seen on one of its GPUs (from NVML processes)."""
        self._save_all(
            [
                replace(job, gpu_mem_peak_bytes=observed[job.id])
                for job in self.state.running()
                if observed.get(job.id, 0) > (job.gpu_mem_peak_bytes or 0)
            ]
        )

    def _save_all(self, jobs: list[Job]) -> None:
        if jobs:
            with self.state.write():
                for job in jobs:
                    self.state.save(job)

    # -- time limits ----------------------------------------------------------------------
    def enforce_limits(self, now: float) -> None:
        requeue.send_due_terms(self.state, self.seam, now)  # preemption graces run out
        due = []
        for job in self.state.running():
            step = lifecycle.next_limit_action(job)
            if step is not None and step[0] <= now:
                due.append((job, step[1]))
        if not due:
            return
        with self.state.write():
            for job, action in due:
                changed, signum = lifecycle.apply_limit_action(job, action)
                self.state.save(changed)
                if action == lifecycle.WARN:
                    self._warn_after_commit(changed, signum)
                else:
                    self._signal_after_commit(changed, signum)

    def _signal_after_commit(self, job: Job, signum: int) -> None:
        self.state.after_commit(lambda: self.seam.signal_job(job, signum))

    def _warn_after_commit(self, job: Job, signum: int) -> None:
        """The warning before the time limit, delivered as Slurm's --signal (seam.warn_job)."""
        self.state.after_commit(lambda: self.seam.warn_job(job, signum))

    def next_deadline(self) -> float | None:
        """When the next time-limit action is due, or a re-queued or --begin job may start
        (epoch s)."""
        times = [
            step[0] for job in self.state.running() if (step := lifecycle.next_limit_action(job))
        ]
        for when in (
            self.shim_loss.next_deadline(),
            requeue.next_deadline(self.state.running()),
            self.state.start_times.next(),
            self.quota_change,
        ):
            times += [when] if when is not None else []
        return min(times, default=None)

    def retries_due(self, now: float) -> bool:
        """Whether a re-queued job's delay, or a job's --begin time, has run out since the
        last call, or a quota's window opened or closed: it may start."""
        due = self.state.start_times.take_due(now)
        if self.quota_change is not None and now >= self.quota_change:
            self.quota_change = self._next_quota_change(now)
            due = True
        return due

    def _next_quota_change(self, now: float) -> float | None:
        return quotas.next_change(self.setup.settings.quotas, now, quotas.local_minute)

    # -- starts ---------------------------------------------------------------------------
    def start_ready(self) -> None:
        state, rules = self.state, self.setup.rules
        if state.reservations:  # at a reservation's start, whether its jobs wait yet or not
            preempt.preempt_for_reservations(state, self.setup, self.seam, self.setup.clock.time())
        if not state.pending_count():
            state.set_later(None)
            return
        now = self.setup.clock.time()
        running = state.running()
        loads = placement.gpu_loads(
            state.inventory,
            running,
            state.pid_jobs,
            rules,
            state.idle_since,
            now,
            state.outside_peaks,
        )
        dep_states = DependencyLookup(state.jobs, state.store)
        queue_rules = self.setup.queue_rules(state.draining)
        # Jobs that preempted others, and the GPUs kept for them: a few ids, not a walk
        # of a queue that may hold 100,000 jobs.
        holders = [
            job
            for job_id in self.holders
            if (job := state.jobs.get(job_id))
            and job.state is JobState.PENDING
            and job.preempt_hold
        ]
        self.holders = {job.id for job in holders}
        held = preemption.held_gpus(holders)
        # The queue in order, read only as far as the pass goes (docs/scheduling.md).
        ordered = state.pending_in_order(queuerules.fair_share(queue_rules, state.usage.usage))
        las = queue_rules.discipline == "las"  # an order that moves with time: sorted each pass
        plan = scheduling.schedule(
            ordered,
            running,
            loads,
            state.inventory,
            rules,
            queue_rules,
            now,
            dep_states,
            state.usage.usage,
            self.placements,
            held=held,
            line=None if las else state.queue,
            attained=state.attained,
            reserved=state.reservations,
        )
        self.placements = dict(plan.placements)
        with state.write():
            for job_id, gpus in plan.starts:
                self.start(state.jobs[job_id], gpus)
            for job_id, reason in plan.cancels.items():
                state.save(
                    transition(
                        state.jobs[job_id], JobState.CANCELLED, ended_at=now, end_reason=reason
                    )
                )
            for job_id, reason in plan.reasons.items():
                job = state.jobs[job_id]
                if job.pending_reason != reason and not job.preempt_hold:
                    state.remember(job_with(job, pending_reason=reason))
            if holders:
                preempt.release_spent_holds(state, holders, {job_id for job_id, _ in plan.starts})
            if not plan.starts:  # else the GPUs changed: the next pass weighs preemption
                urgent = preempt.preempt_for_waiting(state, self.setup, self.seam, dep_states, now)
                self.holders.update([urgent.id] if urgent else [])
            elif any(job.preemptible for job in state.running()):
                state.note_schedule_needed()
        state.set_later(plan.later)

    def start(self, job: Job, gpus: tuple[GpuInfo, ...]) -> None:
        settings, paths, running = self.setup.settings, self.setup.paths, self.state.running()
        taken = [j.master_port for j in running if j.master_port]
        port = self.seam.pick_master_port(
            job.id, settings.master_port_min, settings.master_port_max, taken
        )
        if settings.cpu_binding:
            busy = [c for j in running for c in j.cpu_ids]
            job = replace(
                job,
                cpu_ids=host.pick_cpus(
                    self.setup.host, job.request.cpus, busy, host.near_cpus(gpus)
                ),
            )
        cgroup = None
        limit = lifecycle.mem_limit_bytes(job, settings.mem_margin_pct)
        if self.setup.cgroups and settings.enforce_mem and limit is not None:
            cgroup = self.setup.cgroups.create(job.id, limit)
        # No GPU read is needed now: until the next one, the new job's whole declared
        # memory counts as promised (placement.gpu_loads). Its shim's pid comes later,
        # with the supervisor's acknowledgement or from the run file (_found_shim).
        now = self.setup.clock.time()
        started = lifecycle.start_run(
            job,
            now,
            gpu_uuids=tuple(g.uuid for g in gpus),
            gpu_indices=tuple(g.index for g in gpus),
            master_port=port,
            pending_reason="",
            eligible_at=None,
            boot_id=self.seam.boot_id,
            preempt_hold=(),
        )
        # The run's token names its run-file records and marks its processes, so that
        # they are found should its shim die.
        own_logs = runfile.own_log_paths(paths.jobs_dir, paths.log_root, job.user, job.id)
        env = jobenv.job_environment(
            started,
            gpus,
            port,
            settings.visible_devices,
            now,  # started_at
            runfile.run_token(started),
            dict(settings.job_env),
            own_logs[0],
            self._mps_for(started),
        )
        env.update(self.array_shapes.environment(started))
        spec = runfile.run_spec(
            started,
            env,
            paths.jobs_dir,
            paths.wake_socket,
            settings.cancel_grace_s,
            cgroup,
            run_as=job.uid if paths.is_system else None,
            max_log_bytes=settings.max_log_size_bytes,
            own_logs=own_logs,
        )
        if started.container:
            spec = containers.in_container(
                spec,
                started,
                settings.container_runtime,
                settings.container_devices,
                paths.state_dir,
            )
        self.state.save(started)
        # Launched only once the start is stored (launch_started); if storing it fails,
        # what was taken for it is given back and a later pass tries again.
        self.state.after_commit(lambda: self.launches.append(spec))
        self.state.on_rollback(lambda: self._take_back(job.id, cgroup))

    def _mps_for(self, job: Job) -> tuple[str, int] | None:
        """memory.mps for the job's environment: the pipe directory for a job that shares
        its GPUs (not in a container: the pipe is not there), "" for the others; None
        with MPS off."""
        if self.state.mps.state == "off":
            return None
        client = job.gpu_uuids and not job.request.is_exclusive and not job.container
        pipe_dir = self.state.mps.pipe_for_job() if client else ""
        return (pipe_dir, self.setup.settings.mps_thread_pct)

    def _take_back(self, job_id: int, cgroup: object) -> None:
        self.seam.release_port(job_id)
        if cgroup is not None and self.setup.cgroups is not None:
            self.setup.cgroups.remove(job_id)

    def launch_started(self) -> None:
        """Launch the shims of the jobs started in a pass, once that pass is committed:
        a job whose shim runs is always stored as running, even if the daemon dies here.
        Nothing waits for the forks."""
        specs, self.launches = self.launches, []
        failed = False
        for spec in specs:
            try:
                self.seam.launch(spec)
            except OSError as exc:
                log.exception("cannot launch job %d", spec["job_id"])
                self.start_failed(spec["job_id"], str(exc))
                failed = True
        if failed:  # ended now, not a pass later: `submit` then `show` says so
            try:
                with self.state.write():
                    self.reconcile_running()
            except StoreWriteError:
                pass  # a later pass ends them (the failures are put back)
