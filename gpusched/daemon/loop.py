"""The daemon's loop: reconcile running jobs, apply requests, read GPUs, place and start jobs.
How a daemon process starts and stops around it is daemon/startup.py."""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Any

from gpusched.client.paths import Paths
from gpusched.core.config import Settings
from gpusched.core.errors import GpuschedError, StoreWriteError
from gpusched.core.models import Inventory
from gpusched.core.sched import placement
from gpusched.core.sched.policies import load_custom_policies, placement_rules
from gpusched.daemon.gcfreeze import CollectorHold
from gpusched.daemon.host import detect_host
from gpusched.daemon.jobs.cgroups import daemon_cgroups
from gpusched.daemon.jobs.control import JobControl
from gpusched.daemon.jobs.endacks import EndReports
from gpusched.daemon.jobs.gpuover import GpuOver
from gpusched.daemon.jobs.idlegpus import IdleGpus
from gpusched.daemon.jobs.retention import Retention
from gpusched.daemon.memtrim import MemoryTrim
from gpusched.daemon.requests.authz import Authz
from gpusched.daemon.requests.batches import CANCELLED, Batched, purge_incomplete, step_oldest
from gpusched.daemon.requests.calls import Call, Calls
from gpusched.daemon.requests.handlers import Handlers
from gpusched.daemon.requests.request import Waiter
from gpusched.daemon.state import DaemonState, Setup
from gpusched.gpus import GpuBackend
from gpusched.proc import runfile
from gpusched.proc.seam import ProcessSeam
from gpusched.proc.supervisorclient import supervisor_socket
from gpusched.store.database import Store
from gpusched.store.writefail import is_write_failure

log = logging.getLogger("gpusched.daemon.loop")

# An idle loop waits for a request, a wake-up or its next deadline (the GPU read, a time
# limit) at most this long: each idle turn costs CPU (issue 15: an idle daemon <= 0.1 % of
# a core), and a stop signal wakes it at once (startup.install_signal_handlers).
_MAX_SLEEP_S = 2.0
# While something looks for time to pass on its own (services' steps, cluster jobs' polls,
# a `wait` with a timeout, writes to retry), the loop turns at least this often.
_LIVELY_SLEEP_S = 0.5


class Daemon:
    """The loop (daemon/startup.py runs it in a daemon process). The state it works on
    (DaemonState), the requests (Handlers) and the hands on jobs (JobControl) are made by
    attach(); the processes outside it are reached through `seam`, the time through
    `clock` (the time module, or in tests a clock they move)."""

    def __init__(
        self,
        paths: Paths,
        settings: Settings,
        backend: GpuBackend,
        fingerprint: dict[str, Any] | None = None,
        seam: ProcessSeam | None = None,
        clock: Any = time,
    ):
        self.paths, self.settings, self.backend = paths, settings, backend
        # How this daemon was started (config file, simulated GPUs), in every reply, so
        # that a client can tell when it would start it otherwise (gpusched/client/drift.py).
        self.fingerprint = fingerprint
        self.seam = seam or ProcessSeam(supervisor_socket(paths.run_dir))
        self.clock = clock
        self.started_at = clock.time()
        self.rules = placement_rules(settings, load_custom_policies())
        self.host = detect_host(settings)
        self.authz = Authz(
            os.getuid(), paths.audit_log, settings.admin_group, settings.show_commands
        )
        self.calls = Calls()  # from the connection threads (calls.dispatch)
        self._waiters: list[tuple[Call, Waiter]] = []
        self.memory = MemoryTrim()
        self._batched: list[tuple[Call, Batched]] = []  # oldest first; one batch per turn
        self.gc_hold = CollectorHold()
        self._next_gpu_read = 0.0
        self._end_reports = EndReports()
        self.answer_shim: Any = None  # sends on the wake socket, once it is open
        self.home_watch: Any = None  # startup.HomeWatch, once the socket listens
        # Made by attach(), once the store is open:
        self.state: DaemonState
        self.setup: Setup
        self.control: JobControl
        self.handlers: Handlers
        self.retention: Retention
        self.idle_gpus: IdleGpus
        self.gpu_over: GpuOver

    # -- lifecycle (a daemon process's start and stop: daemon/startup.py) ------------
    def attach(self, store: Store) -> None:
        """The state on this store, and the parts that act on it, each given it explicitly."""
        os.makedirs(self.paths.jobs_dir, mode=0o700, exist_ok=True)
        setup = Setup(
            self.paths,
            self.settings,
            self.rules,
            self.host,
            self.authz,
            daemon_cgroups(self.settings.enforce_mem),
            self.started_at,
            self.clock,
        )
        purge_incomplete(store)  # submits a crash cut short were never acknowledged
        self.state, self.setup = DaemonState(store, setup, self.backend.name), setup
        self.state.clusters.load(self.calls.wake)  # before the active jobs are loaded
        self.control = JobControl(self.state, setup, self.seam)
        self.handlers = Handlers(self.state, setup, self.seam)
        self.retention = Retention(self.state, setup)
        self.idle_gpus = IdleGpus(self.state, setup, self.seam)
        self.gpu_over = GpuOver(self.state, setup, self.seam)
        gc.enable()  # as step_batched leaves it with no batched request

    def take_over(self) -> None:
        """Re-adopt the jobs still running from before, and read the GPUs."""
        with self.gc_hold.reading(lambda: len(self.state.jobs)):  # maybe 100,000 jobs
            self.control.adopt()
        self.read_gpus()

    def save_usage(self) -> None:
        try:
            with self.state.write():  # a restart goes on from this usage
                self.state.usage.account(
                    self.state.running(), self.clock.time(), self.state.store, save=True
                )
        except StoreWriteError:
            pass  # in the log; a restart counts running jobs from the last usage stored

    def answer_everyone(self) -> None:
        for call, waiter in self._waiters:
            call.answer(waiter.result())
        for call, batched in self._batched:
            if batched.committed:  # stored for good: answered as done
                call.answer(batched.finish())
                continue
            batched.abandon()
            call.fail(
                GpuschedError(
                    "the daemon stopped before this request was done; "
                    "nothing of a submit was queued, a change may be partly "
                    "made: run it again"
                )
            )
        self.calls.fail_all("the daemon is stopping")

    # -- the loop -----------------------------------------------------------------------
    def loop(self) -> None:
        while not self.state.stopping:
            calls = self._next_calls()
            with self.state.telemetry.turn(self.clock.monotonic):  # the loop lag, for /metrics
                self.step(calls)
            self.stop_if_unreachable()

    def stop_if_unreachable(self) -> None:
        why = self.home_watch.lost() if self.home_watch is not None else None
        if why:
            log.warning(
                "%s: no client can reach this daemon any more; stopping (running "
                "jobs go on under their shims)",
                why,
            )
            self.state.note_stopping()

    def step(self, calls: list[Call]) -> None:
        """One turn of the loop: the requests, then a pass (a scheduling pass only when
        a request may have changed something, or the state asks for one), then the shims
        of the jobs it started, then the waits it ended. While writes to the queue fail,
        passes (which write) wait for the next retry; requests are answered all the same."""
        for group in together(calls):
            if len(group) == 1:
                self.handle(group[0])  # a request commits before it is answered
            else:
                self.handle_together(group)
        if calls:
            # Let the connection threads just answered take the GIL and send their replies
            # before this turn's pass holds it: they waited about 0.4 ms for it otherwise,
            # a tenth of a submit's whole round trip.
            time.sleep(0)
        self.step_batched()
        self.retention.step()  # old finished jobs removed, a little per turn
        if self.state.writes.retry_due():
            try:
                with self.state.write():  # the loop's own changes: one commit per pass
                    self.run_pass(
                        schedule=self.state.writes.failing
                        or self.handlers.may_change([call.request for call in calls])
                    )
                self.control.launch_started()
            except StoreWriteError:
                pass  # nothing of the pass happened; said once in the log (WriteHealth)
        self.step_clusters()
        self.handlers.services.step()  # replicas and front doors (daemon/services/replicas.py)
        self.answer_waiters()
        if self.answer_shim is not None:
            self._end_reports.answer(self.state.jobs, self.answer_shim)
        self.memory.note(len(self.state.jobs), self.state.compact)

    def handle(self, call: Call) -> None:
        try:
            outcome = self.outcome(call)
        except GpuschedError as exc:
            call.fail(exc)
        else:
            self.settle(call, outcome)

    def handle_together(self, calls: list[Call]) -> None:
        """Submits that arrived together: one transaction, so one fsync, for all of them
        (group commit). Each is a part of its own that fails alone; none is answered
        before the commit, and if the commit fails, none of them was queued."""
        done: list[tuple[Call, Any]] = []
        try:
            with self.state.write(undone="nothing was queued"):
                for call in calls:
                    try:
                        with self.state.part():
                            done.append((call, self.outcome(call)))
                    except GpuschedError as exc:
                        call.fail(exc)
        except StoreWriteError as exc:
            for _, outcome in done:
                if isinstance(outcome, Batched):  # a big submit's quota hold, stored nothing
                    outcome.abandon()
            for call in calls:
                if not call.done.is_set():
                    call.fail(exc)
            return
        for call, outcome in done:
            self.settle(call, outcome)

    def outcome(self, call: Call) -> Any:
        """What the request comes to: its result, a Waiter or a Batched request; raises
        GpuschedError for one refused (a failing write inside a group is left to it)."""
        if call.cancelled:  # its client cancelled before the loop came to it
            raise GpuschedError(CANCELLED)
        try:
            return self.handlers.handle(call.request)
        except GpuschedError:
            raise
        except Exception as exc:
            if is_write_failure(exc):
                raise
            log.exception("request %r failed", call.request.name)
            raise GpuschedError("the daemon failed on this request; see its log") from None

    def settle(self, call: Call, outcome: Any) -> None:
        if isinstance(outcome, Waiter):
            call.waiter = outcome
            self._waiters.append((call, outcome))
        elif isinstance(outcome, Batched):
            call.batched = outcome
            self._batched.append((call, outcome))
        else:
            call.answer(outcome)

    def step_clusters(self) -> None:
        """Hand jobs to Slurm and poll it (daemon/slurm/poll.py): only with cluster jobs."""
        if self.state.remote_ids:
            try:
                self.state.clusters.step()
            except StoreWriteError:
                pass  # in the log (WriteHealth); the next turn tries again

    def step_batched(self) -> None:
        """One batch of the oldest request done in batches; answered once it is done."""
        if self._batched:
            # What a big request makes (100,000 jobs) survives, and so sets off the cyclic
            # collector's full scans of every object, each 100 ms and more of a turn with
            # them in it: no collection during its turns, then one of what the turn made
            # (daemon/gcfreeze.py; what is freed meanwhile is freed at once).
            gc.disable()
            step_oldest(self._batched)
            self.gc_hold.after_batch(len(self.state.jobs))
        if not self._batched:
            self.gc_hold.idle(len(self.state.jobs))

    def run_pass(self, schedule: bool) -> None:
        poll_due = self.clock.monotonic() >= self._next_gpu_read
        self.control.reconcile_running(check_liveness=poll_due)
        if poll_due:
            self.control.check_memory()
            self.state.notifier.check_pending(self.state.pending_alike, self.state.jobs.get)
        now = self.clock.time()
        self.control.enforce_limits(now)
        # A retry after failed writes writes the usage, if nothing else: a commit is the
        # only proof that writes work again.
        self.state.usage.account(
            self.state.running(), now, self.state.store, save=self.state.writes.failing
        )
        if self.control.retries_due(now):
            self.state.note_schedule_needed()
        if self.state.gpus_dirty or poll_due:
            self.read_gpus()
        # Scheduling passes cost time with a long queue: run one only when something
        # it depends on changed (a request, a job's end, a GPU reading).
        if self.state.take_schedule_needed() or schedule:
            self.control.start_ready()

    def _next_calls(self) -> list[Call]:
        wake = self._next_gpu_read - self.clock.monotonic()
        deadline = self.control.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline - self.clock.time())
        if (
            self._waiters
            or self.handlers.services.services
            or self.state.remote_ids
            or self.state.writes.failing
        ):
            wake = min(wake, _LIVELY_SLEEP_S)
        busy = self._batched or self.retention.busy
        timeout = 0.0 if busy else min(_MAX_SLEEP_S, max(0.0, wake))
        return self.calls.take(timeout)

    def wake(self, message: bytes = runfile.WAKE, sender: Any = None) -> None:
        """A job ended, or could not start (its shim said so): run a pass now rather than
        at the next timeout."""
        run = self._end_reports.report(sender)
        failure = runfile.parse_launch_failure(message)
        if failure is not None:
            self.control.start_failed(*failure)
        else:  # the next pass reads that run's file (or, naming none, every one)
            self.control.run_reads.reported(run)
        self.calls.wake()

    def read_gpus(self) -> None:
        state = self.state
        running = state.running()
        try:
            inventory = self.backend.read(running)
        except Exception as exc:
            log.exception("reading the GPUs failed")
            inventory = Inventory(
                backend=self.backend.name, problem=f"reading the GPUs failed: {exc}"
            )
        state.telemetry.gpus_read(inventory, self.clock.time())
        gpu_pids = {p.pid for g in inventory.schedulable() for p in g.processes}
        shims = {job.runner_pid: job.id for job in running if job.runner_pid}
        # A full process scan only when some GPU process is not a known shim:
        # it costs tens of milliseconds, and this runs after every job that held a GPU.
        pid_jobs = (
            self.seam.pid_owners(running)
            if gpu_pids - shims.keys()
            else {pid: shims[pid] for pid in gpu_pids}
        )
        state.note_gpus(inventory, pid_jobs, self.clock.time())
        self.idle_gpus.step(self.clock.time())
        if pid_jobs:
            self.control.record_gpu_peaks(placement.job_gpu_peaks(inventory, pid_jobs))
        self.gpu_over.step(self.clock.time())  # after the peaks: a requeue raises from them
        self._next_gpu_read = self.clock.monotonic() + self.settings.gpu_poll_interval_s

    def answer_waiters(self) -> None:
        now = self.clock.monotonic()
        still: list[tuple[Call, Waiter]] = []
        for call, waiter in self._waiters:
            if now >= waiter.deadline or waiter.ready(self.state.jobs):
                call.answer(waiter.result())
            else:
                still.append((call, waiter))
        self._waiters = still


# The requests that may share a commit with others of their kind arriving in the same turn.
_TOGETHER = frozenset({"submit"})


def together(calls: list[Call]) -> list[list[Call]]:
    """The turn's calls in order, with each run of consecutive submits in one group."""
    groups: list[list[Call]] = []
    for call in calls:
        if groups and call.request.name in _TOGETHER and groups[-1][-1].request.name in _TOGETHER:
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups
