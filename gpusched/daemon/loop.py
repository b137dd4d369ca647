"""The daemon's loop: reconcile running jobs, apply requests, read GPUs, place and start jobs."""

from __future__ import annotations

import gc
import logging
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from filelock import FileLock, Timeout

from gpusched import __version__
from gpusched.client import drift
from gpusched.core import limits, placement
from gpusched.proc import runfile
from gpusched.proc.seam import ProcessSeam, supervisor_socket
from gpusched.daemon.authz import Authz
from gpusched.core.config import Settings, load_settings
from gpusched.client.paths import Paths, ensure_private_dir
from gpusched.core.errors import ConfigError, GpuschedError, StoreWriteError
from gpusched.gpus import GpuBackend, open_backend
from gpusched.daemon.batches import CANCELLED, Batched, purge_incomplete, step_oldest
from gpusched.daemon.cgroups import CgroupJobs
from gpusched.daemon.checkpoints import Checkpointer
from gpusched.daemon.endacks import EndReports
from gpusched.daemon.gcfreeze import CollectorHold
from gpusched.daemon.handlers import Handlers
from gpusched.daemon.host import detect_host
from gpusched.daemon.idlegpus import IdleGpus
from gpusched.daemon.jobcontrol import JobControl
from gpusched.daemon.memtrim import MemoryTrim
from gpusched.daemon.metrics import serve_metrics
from gpusched.core.models import Inventory
from gpusched.client.modes import ensure_public_dir
from gpusched.core.policies import load_custom_policies, placement_rules
from gpusched.daemon.request import Request, Waiter
from gpusched.daemon.retention import Retention
from gpusched.daemon.server import SocketServer, WakeListener
from gpusched.daemon.slurmpoll import ClusterJobs
from gpusched.daemon.state import DaemonState, Setup
from gpusched.daemon.store import Store

log = logging.getLogger("gpusched.daemon.loop")

# An idle loop waits for a request, a wake-up or its next deadline (the GPU read, a time
# limit) at most this long: each idle turn costs CPU (issue 15: an idle daemon <= 0.1 % of
# a core), and a stop signal wakes it at once (_install_signal_handlers).
_MAX_SLEEP_S = 2.0
# While something looks for time to pass on its own (services' steps, cluster jobs' polls,
# a `wait` with a timeout, writes to retry), the loop turns at least this often.
_LIVELY_SLEEP_S = 0.5
# How often a connection thread looks for its client's cancel while the loop works.
_WATCH_S = 0.05
# Put on the call queue by the wake socket: it only ends the loop's wait.
_WAKE = object()


@dataclass
class Call:
    """A request from a connection thread, answered by the loop thread."""

    request: Request
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: GpuschedError | None = None
    waiter: Waiter | None = None  # a `wait` answered later
    batched: Batched | None = None  # a request done a batch per turn, answered when done
    cancelled: bool = False  # its client cancelled: a batched request is dropped, if it can be

    def answer(self, result: Any) -> None:
        self.result = result
        self.done.set()

    def fail(self, error: GpuschedError) -> None:
        self.error = error
        self.done.set()


class Daemon:
    """The loop, and how it starts and stops. The state it works on (DaemonState), the
    requests (Handlers) and the hands on jobs (JobControl) are made by attach(); the
    processes outside it are reached through `seam`, the time through `clock` (the time
    module, or in tests a clock they move)."""

    def __init__(self, paths: Paths, settings: Settings, backend: GpuBackend,
                 fingerprint: dict[str, Any] | None = None, seam: ProcessSeam | None = None,
                 clock: Any = time):
        self.paths, self.settings, self.backend = paths, settings, backend
        # How this daemon was started (config file, simulated GPUs), in every reply, so
        # that a client can tell when it would start it otherwise (gpusched/client/drift.py).
        self.fingerprint = fingerprint
        self.seam = seam or ProcessSeam(supervisor_socket(paths.run_dir))
        self.clock = clock
        self.started_at = clock.time()
        self.rules = placement_rules(settings, load_custom_policies())
        self.host = detect_host(settings)
        self.authz = Authz(os.getuid(), paths.audit_log, settings.admin_group,
                           settings.show_commands)
        self._calls: queue.Queue[Any] = queue.Queue()  # Calls, and _WAKE
        self._waiters: list[Call] = []
        self.memory = MemoryTrim()
        self._batched: list[Call] = []  # oldest first; one batch per turn
        self.gc_hold = CollectorHold()
        self._next_gpu_read = 0.0
        self._end_reports = EndReports()
        self._answer_shim: Any = None  # sends on the wake socket, once it is open
        # Made by attach(), once the store is open:
        self.state: DaemonState
        self.setup: Setup
        self.control: JobControl
        self.handlers: Handlers
        self.retention: Retention
        self.idle_gpus: IdleGpus

    # -- the connection threads' side -------------------------------------------------
    def dispatch(self, name: str, args: dict[str, Any], creds: tuple[int, int, int],
                 gone: Callable[[], bool] | None = None) -> Any:
        """A request's result, from the loop thread; raises its GpuschedError. gone():
        whether the client cancelled meanwhile (a streamed request: the loop drops what
        of it has not committed)."""
        call = Call(Request(name, args, creds))
        self._calls.put(call)
        while not call.done.wait(None if gone is None else _WATCH_S):
            if gone():
                call.cancelled, gone = True, None
        if call.error is not None:
            raise call.error
        return call.result

    # -- lifecycle ----------------------------------------------------------------------
    def run(self) -> None:
        """Run in the foreground until stopped; raises GpuschedError if it cannot start."""
        self._prepare_dirs()
        lock = FileLock(str(self.paths.lock), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise GpuschedError(f"a gpusched daemon already runs for {self.paths.state_dir}; "
                                "use `gpusched daemon status`.") from None
        try:
            store = Store(self.paths.db, self.paths.jobs_dir)
            # System mode: anyone may connect; who they are comes from SO_PEERCRED.
            server = SocketServer(self.paths.socket, self.dispatch,
                                  mode=0o666 if self.paths.is_system else 0o600,
                                  max_per_uid=self.settings.max_connections_per_uid,
                                  exempt_uids={0, os.getuid()}, stamp=self.fingerprint,
                                  max_json_depth=self.settings.limit_json_depth,
                                  limits=limits.from_settings(self.settings))
            checkpoints = Checkpointer(str(self.paths.db))  # off the loop's thread
            checkpoints.attach(store)
            try:
                self.attach(store)
                self._install_signal_handlers()
                # Submit refuses requests no GPU here could ever take: know the GPUs
                # before the first request, which may come the moment the socket listens.
                self.take_over()
                server.start()
                metrics = serve_metrics(self.state, self.setup)
                wake = WakeListener(self.paths.wake_socket, self.wake)
                self._answer_shim = wake.answer
                log.info("gpusched %s daemon started (pid %d, backend %s)",
                         __version__, os.getpid(), self.backend.name)
                try:
                    self.loop()
                    self.save_usage()
                finally:
                    wake.close()
                    metrics.close()
                    self.handlers.services.close()
                    self.state.notifier.close()
            finally:
                server.close()
                self._answer_everyone()
                server.drain()  # those answers, and the one to `stop`, reach their clients
                self.seam.close()  # running shims are in sessions of their own: unaffected
                checkpoints.close()
                store.close()
                self.backend.close()
        finally:
            lock.release()

    def attach(self, store: Store) -> None:
        """The state on this store, and the parts that act on it, each given it explicitly."""
        os.makedirs(self.paths.jobs_dir, mode=0o700, exist_ok=True)
        setup = Setup(self.paths, self.settings, self.rules, self.host, self.authz,
                      self._set_up_cgroups(), self.started_at, self.clock)
        purge_incomplete(store)  # submits a crash cut short were never acknowledged
        self.state, self.setup = DaemonState(store, setup, self.backend.name), setup
        clusters = ClusterJobs(self.state, setup)
        clusters.load()  # before the active jobs are loaded
        clusters.wake_loop = lambda: self._calls.put(_WAKE)  # a Slurm command is done
        self.control = JobControl(self.state, setup, self.seam)
        self.handlers = Handlers(self.state, setup, self.seam)
        self.retention = Retention(self.state, setup)
        self.idle_gpus = IdleGpus(self.state, setup, self.seam)
        gc.enable()  # as step_batched leaves it with no batched request

    def take_over(self) -> None:
        """Re-adopt the jobs still running from before, and read the GPUs."""
        with self.gc_hold.reading(lambda: len(self.state.jobs)):  # maybe 100,000 jobs
            self.control.adopt()
        self.read_gpus()

    def save_usage(self) -> None:
        try:
            with self.state.write():  # a restart goes on from this usage
                self.state.usage.account(self.state.running(), self.clock.time(),
                                         self.state.store, save=True)
        except StoreWriteError:
            pass  # in the log; a restart counts running jobs from the last usage stored

    def _set_up_cgroups(self) -> CgroupJobs | None:
        """Kernel-enforced memory limits when enforce_mem is on and a cgroup v2 tree is ours."""
        if not self.settings.enforce_mem:
            return None
        tree = CgroupJobs.detect()
        if tree is not None and tree.prepare(os.getpid()):
            return tree
        return None

    def _prepare_dirs(self) -> None:
        """State always private; in system mode the socket's and the logs' parents are
        readable by all and writable by the daemon only."""
        ensure_private_dir(self.paths.state_dir)
        if self.paths.is_system:
            ensure_public_dir(self.paths.run_dir)
            if self.paths.log_root is not None:
                ensure_public_dir(self.paths.log_root)
        else:
            ensure_private_dir(self.paths.run_dir)

    def _install_signal_handlers(self) -> None:
        def stop(_signum: int, _frame: object) -> None:
            self.state.stopping = True
            self._poke()  # end the loop's wait now, not at its next deadline

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)

    def _poke(self) -> None:
        """A wake-up datagram to our own wake socket: safe in a signal handler, where
        putting on the call queue could wait for a lock the interrupted code holds."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(runfile.WAKE, socket.MSG_DONTWAIT, self.paths.wake_socket)
        except OSError:
            pass  # not listening yet: the loop sees `stopping` at its next turn

    def _answer_everyone(self) -> None:
        for call in self._waiters:
            call.answer(call.waiter.result())
        for call in self._batched:
            if call.batched.committed:  # stored for good: answered as done
                call.answer(call.batched.finish())
                continue
            call.batched.abandon()
            call.fail(GpuschedError("the daemon stopped before this request was done; "
                                    "nothing of a submit was queued, a change may be partly "
                                    "made: run it again"))
        while not self._calls.empty():
            call = self._calls.get_nowait()
            if call is not _WAKE:
                call.fail(GpuschedError("the daemon is stopping"))

    # -- the loop -----------------------------------------------------------------------
    def loop(self) -> None:
        while not self.state.stopping:
            calls = self._next_calls()
            with self.state.telemetry.turn(self.clock.monotonic):  # the loop lag, for /metrics
                self.step(calls)

    def step(self, calls: list[Call]) -> None:
        """One turn of the loop: the requests, then a pass (a scheduling pass only when
        a request may have changed something, or the state asks for one), then the shims
        of the jobs it started, then the waits it ended. While writes to the queue fail,
        passes (which write) wait for the next retry; requests are answered all the same."""
        for call in calls:
            self.handle(call)  # each request commits before it is answered
        self.step_batched()
        self.retention.step()  # old finished jobs removed, a little per turn
        if self.state.writes.retry_due():
            try:
                with self.state.write():  # the loop's own changes: one commit per pass
                    self.run_pass(schedule=self.state.writes.failing or self.handlers.may_change(
                        [call.request for call in calls]))
                self.control.launch_started()
            except StoreWriteError:
                pass  # nothing of the pass happened; said once in the log (WriteHealth)
        self.step_clusters()
        self.handlers.services.step()  # replicas and front doors (daemon/services.py)
        self.answer_waiters()
        if self._answer_shim is not None:
            self._end_reports.answer(self.state.jobs, self._answer_shim)
        self.memory.note(len(self.state.jobs), self.state.compact)

    def handle(self, call: Call) -> None:
        if call.cancelled:  # its client cancelled before the loop came to it
            call.fail(GpuschedError(CANCELLED))
            return
        try:
            outcome = self.handlers.handle(call.request)
        except GpuschedError as exc:
            call.fail(exc)
        except Exception:  # noqa: BLE001 - a bug in one request must not stop the daemon
            log.exception("request %r failed", call.request.name)
            call.fail(GpuschedError("the daemon failed on this request; see its log"))
        else:
            if isinstance(outcome, Waiter):
                call.waiter = outcome
                self._waiters.append(call)
            elif isinstance(outcome, Batched):
                call.batched = outcome
                self._batched.append(call)
            else:
                call.answer(outcome)

    def step_clusters(self) -> None:
        """Hand jobs to Slurm and poll it (daemon/slurmpoll.py): only with cluster jobs."""
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
        self.state.usage.account(self.state.running(), now, self.state.store,
                                 save=self.state.writes.failing)
        if self.control.retries_due(now):
            self.state.schedule_needed = True
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
        if (self._waiters or self.handlers.services.services or self.state.remote_ids
                or self.state.writes.failing):
            wake = min(wake, _LIVELY_SLEEP_S)
        busy = self._batched or self.retention.busy
        timeout = 0.0 if busy else min(_MAX_SLEEP_S, max(0.0, wake))
        calls = []
        try:
            calls.append(self._calls.get(timeout=timeout))
            while True:
                calls.append(self._calls.get_nowait())
        except queue.Empty:
            pass
        return [call for call in calls if call is not _WAKE]

    def wake(self, message: bytes = runfile.WAKE, sender: Any = None) -> None:
        """A job ended, or could not start (its shim said so): run a pass now rather than
        at the next timeout."""
        run = self._end_reports.report(sender)
        failure = runfile.parse_launch_failure(message)
        if failure is not None:
            self.control.launch_failures.put(failure)
        else:  # the next pass reads that run's file (or, naming none, every one)
            self.control.run_reads.reported(run)
        self._calls.put(_WAKE)

    def read_gpus(self) -> None:
        state = self.state
        running = state.running()
        try:
            state.inventory = self.backend.read(running)
        except Exception as exc:  # noqa: BLE001 - a backend failure must not stop the queue
            log.exception("reading the GPUs failed")
            state.inventory = Inventory(backend=self.backend.name,
                                        problem=f"reading the GPUs failed: {exc}")
        state.telemetry.gpus_read(state.inventory, self.clock.time())
        gpu_pids = {p.pid for g in state.inventory.schedulable() for p in g.processes}
        shims = {job.shim_pid: job.id for job in running if job.shim_pid}
        # A full process scan only when some GPU process is not a known shim:
        # it costs tens of milliseconds, and this runs after every job that held a GPU.
        state.pid_jobs = self.seam.pid_owners(running) if gpu_pids - shims.keys() else \
            {pid: shims[pid] for pid in gpu_pids}
        state.idle_since = placement.track_idle(state.inventory, state.pid_jobs,
                                                state.idle_since, self.clock.time())
        self.idle_gpus.step(self.clock.time())
        if state.pid_jobs:
            self.control.record_gpu_peaks(placement.job_gpu_peaks(state.inventory,
                                                                  state.pid_jobs))
        state.gpus_dirty = False
        state.schedule_needed = True
        self._next_gpu_read = self.clock.monotonic() + self.settings.gpu_poll_interval_s

    def answer_waiters(self) -> None:
        now = self.clock.monotonic()
        still = []
        for call in self._waiters:
            if now >= call.waiter.deadline or call.waiter.all_ended(self.state.jobs):
                call.answer(call.waiter.result())
            else:
                still.append(call)
        self._waiters = still


def serve(paths: Paths) -> None:
    """`gpusched daemon run`: load the config, open the GPU backend, run until stopped."""
    config = drift.config_stamp(paths.config_file)  # before reading it: a later change shows
    settings = load_settings(paths.config_file)
    check_mode(paths, settings)
    backend = open_backend(settings.simulate, paths.sim_processes)
    configured = load_settings(paths.config_file, environ={}).simulate
    Daemon(paths, settings, backend,
           drift.fingerprint(config, settings.simulate, configured, dict(os.environ))).run()


def check_mode(paths: Paths, settings: Settings) -> None:
    """A system config read by a user daemon, or a system daemon that cannot switch users."""
    if settings.mode == "system" and not paths.is_system:
        raise ConfigError(f"{paths.config_file}: daemon.mode is \"system\", but this is a user "
                          "daemon's config; put it in /etc/gpusched/gpusched.toml or run "
                          "`gpusched daemon run --system` as root.")
    if paths.is_system and os.geteuid() != 0 and not settings.service_user:
        raise ConfigError("system mode starts every job as its submitter, which needs root; "
                          "run `gpusched daemon run --system` as root (the systemd unit does), "
                          "or set system.service_user for a user with CAP_SETUID and CAP_SETGID.")
