"""The daemon's loop: reconcile running jobs, apply requests, read GPUs, place and start jobs."""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from filelock import FileLock, Timeout

from gpusched import __version__
from gpusched.client import drift
from gpusched.core import placement, scheduling
from gpusched.proc import runfile, runner
from gpusched.daemon.authz import Authz
from gpusched.core.config import Settings, load_settings
from gpusched.client.paths import Paths, ensure_private_dir
from gpusched.core.errors import ConfigError, GpuschedError
from gpusched.gpus import GpuBackend, open_backend
from gpusched.daemon.cgroups import CgroupJobs
from gpusched.daemon.handlers import Handlers
from gpusched.daemon.host import detect_host
from gpusched.daemon.jobcontrol import JobControl
from gpusched.core.models import Inventory, Job, JobState
from gpusched.client.modes import ensure_public_dir
from gpusched.core.policies import load_custom_policies, placement_rules
from gpusched.daemon.server import SocketServer, WakeListener, error_reply
from gpusched.daemon.store import Store

log = logging.getLogger("gpusched.daemon.loop")

# The loop wakes at least this often, so a stop signal or a missed wake-up costs little.
_MAX_SLEEP_S = 0.5
# Put on the call queue by the wake socket: it only ends the loop's wait.
_WAKE = object()
# A `wait` request is answered after this long at most; the client simply asks again.
_WAIT_SLICE_S = 30.0


@dataclass
class Call:
    """A request from a connection thread, answered by the loop thread."""

    name: str
    args: dict[str, Any]
    creds: tuple[int, int, int]
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None
    deadline: float = 0.0  # for `wait`: when to answer even if jobs still run
    ended: int = 0  # for `wait`: how many of the leading ids are known to have ended

    def answer(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.done.set()


class Daemon:
    def __init__(self, paths: Paths, settings: Settings, backend: GpuBackend,
                 fingerprint: dict[str, Any] | None = None):
        self.paths, self.settings, self.backend = paths, settings, backend
        # How this daemon was started (config file, simulated GPUs), in every reply, so
        # that a client can tell when it would start it otherwise (gpusched/client/drift.py).
        self.fingerprint = fingerprint
        self.rules = placement_rules(settings, load_custom_policies())
        self.host = detect_host(settings)
        self.cgroups: CgroupJobs | None = None
        self.draining = False
        self.idle_since: dict[int, float] = {}  # outside pid -> since when it shows 0% busy
        self.control = JobControl(self)
        self.launcher = runner.Launcher()
        self._schedule_needed = True
        self.started_at = time.time()
        self.jobs: dict[int, Job] = {}  # pending and running jobs; finished ones live in the store
        self._running: dict[int, Job] = {}  # the running ones among them
        self._pending: dict[int, Job] = {}  # and the pending ones
        self.inventory = Inventory(backend=backend.name)
        self.pid_jobs: dict[int, int] = {}
        self.boot_id = runner.boot_id()
        self.stopping = False
        self._calls: queue.Queue[Any] = queue.Queue()  # Calls, and _WAKE
        self._waiters: list[Call] = []
        self._next_gpu_read = 0.0
        self._gpus_dirty = True
        self.store: Store | None = None
        self.handlers = Handlers(self)
        self.authz = Authz(os.getuid(), paths.audit_log, settings.admin_group,
                           settings.show_commands)

    # -- the connection threads' side -------------------------------------------------
    def dispatch(self, name: str, args: dict[str, Any], creds: tuple[int, int, int]) -> dict:
        if name == "ping":
            return {"ok": True, "result": {"pid": os.getpid()}}
        call = Call(name, args, creds)
        self._calls.put(call)
        call.done.wait()
        assert call.reply is not None
        return {**call.reply, "daemon": self.fingerprint}

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
            self.store = Store(self.paths.db)
            os.makedirs(self.paths.jobs_dir, mode=0o700, exist_ok=True)
            # System mode: anyone may connect; who they are comes from SO_PEERCRED.
            server = SocketServer(self.paths.socket, self.dispatch,
                                  mode=0o666 if self.paths.is_system else 0o600,
                                  max_per_uid=self.settings.max_connections_per_uid,
                                  exempt_uids={0, os.getuid()})
            try:
                self._install_signal_handlers()
                self.draining = self.store.get_meta("draining") == "1"
                self._set_up_cgroups()
                self.control.adopt()
                # Submit refuses requests no GPU here could ever take: know the GPUs
                # before the first request, which may come the moment the socket listens.
                self.read_gpus()
                server.start()
                wake = WakeListener(self.paths.wake_socket, self.wake)
                log.info("gpusched %s daemon started (pid %d, backend %s)",
                         __version__, os.getpid(), self.backend.name)
                try:
                    self.loop()
                    with self.store.write():  # a restart goes on from this usage
                        self.control.usage.account(self.running(), time.time(), self.store,
                                                   save=True)
                finally:
                    wake.close()
            finally:
                server.close()
                self._answer_everyone()
                server.drain()  # those answers, and the one to `stop`, reach their clients
                self.launcher.close()  # running shims are in sessions of their own: unaffected
                self.store.close()
                self.backend.close()
        finally:
            lock.release()

    def _set_up_cgroups(self) -> None:
        """Kernel-enforced memory limits when enforce_mem is on and a cgroup v2 tree is ours."""
        if not self.settings.enforce_mem:
            return
        tree = CgroupJobs.detect()
        if tree is not None and tree.prepare(os.getpid()):
            self.cgroups = tree

    def mem_enforcement(self) -> str:
        """How --mem is enforced, for `daemon status`."""
        if not self.settings.enforce_mem:
            return "off (overuse is reported, not stopped)"
        if self.cgroups:
            return self.cgroups.describe()
        return (f"process-tree measurement every {self.settings.gpu_poll_interval_s:g} s "
                "(no writable cgroup v2 tree)")

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
            self.stopping = True

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)

    def _answer_everyone(self) -> None:
        for call in self._waiters:
            call.answer(self.handlers.wait_reply(call))
        while not self._calls.empty():
            call = self._calls.get_nowait()
            if call is not _WAKE:
                call.answer(error_reply(GpuschedError("the daemon is stopping")))

    # -- the loop -----------------------------------------------------------------------
    def queue_rules(self) -> scheduling.QueueRules:
        s = self.settings
        return scheduling.QueueRules(
            discipline=s.discipline, user_weights=dict(s.user_weights),
            max_gpus_per_user=s.max_gpus_per_user or None,
            max_running_per_user=s.max_running_per_user or None, draining=self.draining,
            host=self.host.capacity(s.max_running))

    def loop(self) -> None:
        while not self.stopping:
            calls = self._next_calls()
            for call in calls:
                self.handlers.handle(call)  # each request commits before it is answered
            with self.store.write():  # the loop's own changes: one commit per pass
                self.run_pass(schedule=bool(calls))
            self.control.launch_started()
            self.answer_waiters()

    def run_pass(self, schedule: bool) -> None:
        poll_due = time.monotonic() >= self._next_gpu_read
        self.control.reconcile_running(check_liveness=poll_due)
        if poll_due:
            self.control.check_memory()
        now = time.time()
        self.control.enforce_limits(now)
        self.control.usage.account(self.running(), now, self.store)
        if self.control.retries_due(now):
            self._schedule_needed = True
        if self._gpus_dirty or poll_due:
            self.read_gpus()
        # Scheduling passes cost time with a long queue: run one only when something
        # it depends on changed (a request, a job's end, a GPU reading).
        if self._schedule_needed or schedule:
            self._schedule_needed = False
            self.control.start_ready()

    def _next_calls(self) -> list[Call]:
        wake = self._next_gpu_read - time.monotonic()
        deadline = self.control.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline - time.time())
        timeout = min(_MAX_SLEEP_S, max(0.0, wake))
        calls = []
        try:
            calls.append(self._calls.get(timeout=timeout))
            while True:
                calls.append(self._calls.get_nowait())
        except queue.Empty:
            pass
        return [call for call in calls if call is not _WAKE]

    def wake(self, message: bytes = runfile.WAKE) -> None:
        """A job ended, or could not start (its shim said so): run a pass now rather than
        at the next timeout."""
        failure = runfile.parse_launch_failure(message)
        if failure is not None:
            self.control.launch_failures.put(failure)
        self._calls.put(_WAKE)

    def load_active(self, jobs: list[Job]) -> None:
        self.jobs = {job.id: job for job in jobs}
        self._running = {job.id: job for job in jobs if job.is_running}
        self._pending = {job.id: job for job in jobs if job.state is JobState.PENDING}

    def running(self) -> list[Job]:
        # Kept apart from the queue: asked several times a pass, with thousands pending.
        return list(self._running.values())

    def pending(self) -> list[Job]:
        return list(self._pending.values())

    def save(self, job: Job) -> None:
        """Store a changed job (inside a write transaction) and keep the active set in step."""
        assert self.store is not None
        self.store.update(job)
        self.remember(job)

    def remember(self, job: Job) -> None:
        """Keep the active set in step with a job, without a write of its own: for a job
        just stored, and for what a restart works out again by itself (pending reasons,
        and shim pids, which the run files hold). The next save stores those too."""
        previous = self.jobs.get(job.id)
        if job.state.is_final:
            self.jobs.pop(job.id, None)
        else:
            self.jobs[job.id] = job
        for subset, belongs in ((self._running, job.is_running),
                                (self._pending, job.state is JobState.PENDING)):
            if belongs:
                subset[job.id] = job
            else:
                subset.pop(job.id, None)
        if previous is not None and previous.state is JobState.RUNNING and not job.is_running:
            # A run ended: its GPUs are free, so read them again rather than wait for the
            # poll, and let waiting jobs (and dependents) be considered.
            self._gpus_dirty = self._gpus_dirty or bool(previous.gpu_uuids)
            self._schedule_needed = True

    def read_gpus(self) -> None:
        running = self.running()
        try:
            self.inventory = self.backend.read(running)
        except Exception as exc:  # noqa: BLE001 - a backend failure must not stop the queue
            log.exception("reading the GPUs failed")
            self.inventory = Inventory(backend=self.backend.name,
                                       problem=f"reading the GPUs failed: {exc}")
        gpu_pids = {p.pid for g in self.inventory.schedulable() for p in g.processes}
        shims = {job.shim_pid: job.id for job in running if job.shim_pid}
        # A full process scan only when some GPU process is not a known shim:
        # it costs tens of milliseconds, and this runs after every job that held a GPU.
        self.pid_jobs = runner.pid_owners(running) if gpu_pids - shims.keys() else \
            {pid: shims[pid] for pid in gpu_pids}
        self.idle_since = placement.track_idle(self.inventory, self.pid_jobs, self.idle_since,
                                               time.time())
        if self.pid_jobs:
            self.control.record_gpu_peaks(placement.job_gpu_peaks(self.inventory, self.pid_jobs))
        self._gpus_dirty = False
        self._schedule_needed = True
        self._next_gpu_read = time.monotonic() + self.settings.gpu_poll_interval_s

    def answer_waiters(self) -> None:
        now = time.monotonic()
        still = []
        for call in self._waiters:
            if now >= call.deadline or self.all_ended(call):
                call.answer(self.handlers.wait_reply(call))
            else:
                still.append(call)
        self._waiters = still

    def all_ended(self, call: Call) -> bool:
        """Whether every job a `wait` names has ended."""
        # An ended job stays ended: step past each once, so that waiting on thousands
        # of jobs (which mostly end in order) costs next to nothing per pass.
        ids = call.args["ids"]
        while call.ended < len(ids) and ids[call.ended] not in self.jobs:
            call.ended += 1
        return call.ended == len(ids)

    def add_waiter(self, call: Call) -> None:
        timeout = float(call.args.get("timeout_s") or _WAIT_SLICE_S)
        call.deadline = time.monotonic() + min(max(timeout, 0.0), _WAIT_SLICE_S)
        self._waiters.append(call)


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
