"""The daemon's loop: reconcile running jobs, apply requests, read GPUs, place and start jobs."""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from filelock import FileLock, Timeout

from gpusched import __version__, placement, runner
from gpusched.config import Paths, Settings, ensure_private_dir, load_settings
from gpusched.errors import ConfigError, GpuschedError
from gpusched.gpus import GpuBackend, open_backend
from gpusched.handlers import Handlers
from gpusched.models import Inventory, Job, JobState, transition
from gpusched.server import SocketServer, error_reply
from gpusched.store import Store

log = logging.getLogger("gpusched.daemon")

# The loop wakes at least this often, so a stop signal or a missed wake-up costs little.
_MAX_SLEEP_S = 0.5
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

    def answer(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.done.set()


class Daemon:
    def __init__(self, paths: Paths, settings: Settings, backend: GpuBackend):
        self.paths, self.settings, self.backend = paths, settings, backend
        self.rules = placement.PlacementRules(
            max_util_pct=settings.max_util_pct, mem_headroom_bytes=settings.mem_headroom_bytes,
            exclusive_idle_mem_bytes=settings.exclusive_idle_mem_bytes)
        self.started_at = time.time()
        self.jobs: dict[int, Job] = {}  # pending and running jobs; finished ones live in the store
        self.inventory = Inventory(backend=backend.name)
        self.pid_jobs: dict[int, int] = {}
        self.boot_id = runner.boot_id()
        self.stopping = False
        self._calls: queue.Queue[Call] = queue.Queue()
        self._waiters: list[Call] = []
        self._next_gpu_read = 0.0
        self._gpus_dirty = True
        self.store: Store | None = None
        self.handlers = Handlers(self)

    # -- the connection threads' side -------------------------------------------------
    def dispatch(self, name: str, args: dict[str, Any], creds: tuple[int, int, int]) -> dict:
        if name == "ping":
            return {"ok": True, "result": {"pid": os.getpid()}}
        call = Call(name, args, creds)
        self._calls.put(call)
        call.done.wait()
        assert call.reply is not None
        return call.reply

    # -- lifecycle ----------------------------------------------------------------------
    def run(self) -> None:
        """Run in the foreground until stopped; raises GpuschedError if it cannot start."""
        ensure_private_dir(self.paths.state_dir)
        ensure_private_dir(self.paths.run_dir)
        lock = FileLock(str(self.paths.lock), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise GpuschedError(f"a gpusched daemon already runs for {self.paths.state_dir}; "
                                "use `gpusched daemon status`.") from None
        try:
            self.store = Store(self.paths.db)
            self.paths.jobs_dir.mkdir(mode=0o700, exist_ok=True)
            server = SocketServer(self.paths.socket, self.dispatch)
            try:
                self._install_signal_handlers()
                self.adopt()
                server.start()
                log.info("gpusched %s daemon started (pid %d, backend %s)",
                         __version__, os.getpid(), self.backend.name)
                self.loop()
            finally:
                server.close()
                self._answer_everyone()
                self.store.close()
                self.backend.close()
        finally:
            lock.release()

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
            self._calls.get_nowait().answer(error_reply(GpuschedError("the daemon is stopping")))

    # -- the loop -----------------------------------------------------------------------
    def loop(self) -> None:
        while not self.stopping:
            calls = self._next_calls()
            self.reconcile_running()
            for call in calls:
                self.handlers.handle(call)
            if self._gpus_dirty or time.monotonic() >= self._next_gpu_read:
                self.read_gpus()
            self.start_ready()
            self.answer_waiters()

    def _next_calls(self) -> list[Call]:
        timeout = min(_MAX_SLEEP_S, max(0.0, self._next_gpu_read - time.monotonic()))
        calls = []
        try:
            calls.append(self._calls.get(timeout=timeout))
            while True:
                calls.append(self._calls.get_nowait())
        except queue.Empty:
            pass
        return calls

    def running(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state is JobState.RUNNING]

    def pending(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state is JobState.PENDING]

    def save(self, job: Job) -> None:
        """Store a changed job (inside a write transaction) and keep the active set in step."""
        assert self.store is not None
        self.store.update(job)
        if job.state.is_final:
            self.jobs.pop(job.id, None)
            # Its memory is free now: read the GPUs again rather than wait for the poll.
            self._gpus_dirty = self._gpus_dirty or bool(job.gpu_uuids)
        else:
            self.jobs[job.id] = job

    def read_gpus(self) -> None:
        running = self.running()
        try:
            self.inventory = self.backend.read(running)
        except Exception as exc:  # noqa: BLE001 - a backend failure must not stop the queue
            log.exception("reading the GPUs failed")
            self.inventory = Inventory(backend=self.backend.name,
                                       problem=f"reading the GPUs failed: {exc}")
        has_processes = any(g.processes for g in self.inventory.schedulable())
        self.pid_jobs = runner.pid_owners(running) if has_processes else {}
        self._gpus_dirty = False
        self._next_gpu_read = time.monotonic() + self.settings.gpu_poll_interval_s

    # -- job lifecycle ------------------------------------------------------------------
    def adopt(self) -> None:
        """After a (re)start: keep running jobs that still run, settle the rest."""
        assert self.store is not None
        self.jobs = {job.id: job for job in self.store.active()}
        with self.store.write():
            for job in list(self.jobs.values()):
                if job.state is JobState.PENDING and runner.was_started(self.paths.jobs_dir, job.id):
                    self._recover_unrecorded_start(job)
        self.reconcile_running(check_liveness=True)
        log.info("adopted %d running jobs", len(self.running()))

    def _recover_unrecorded_start(self, job: Job) -> None:
        """A previous daemon started this job's shim but died before recording it."""
        found = runner.find_shim(self.paths.jobs_dir, job.id)
        pid, started = found if found else (None, None)
        self.save(transition(job, JobState.RUNNING, shim_pid=pid, shim_start_time=started,
                             boot_id=self.boot_id, started_at=time.time()))

    def reconcile_running(self, check_liveness: bool = False) -> None:
        """Record jobs that ended: from their exit record, or as lost if their shim vanished."""
        runner.reap_children()
        if not self.running():
            return
        check_liveness = check_liveness or time.monotonic() >= self._next_gpu_read
        assert self.store is not None
        with self.store.write():
            for job in self.running():
                record = runner.read_exit_record(self.paths.jobs_dir, job.id)
                if record is not None:
                    self.save(self.finished(job, record))
                elif check_liveness and not runner.is_alive(job):
                    # Read again: the shim may have written its record and exited since.
                    record = runner.read_exit_record(self.paths.jobs_dir, job.id)
                    self.save(self.finished(job, record) if record else transition(
                        job, JobState.LOST, ended_at=time.time(),
                        end_reason="the job's shim vanished without an exit record "
                                   "(killed, or the machine rebooted)"))

    @staticmethod
    def finished(job: Job, record: runner.ExitRecord) -> Job:
        if job.cancel_requested:
            state = JobState.CANCELLED
        elif record.exit_code == 0 and not record.error:
            state = JobState.SUCCEEDED
        else:
            state = JobState.FAILED
        return transition(job, state, exit_code=record.exit_code, signal=record.signal,
                          ended_at=record.ended_at, end_reason=record.error)

    def start_ready(self) -> None:
        pending = self.pending()
        if not pending:
            return
        loads = placement.gpu_loads(self.inventory, self.running(), self.pid_jobs)
        plan = placement.plan(pending, loads, self.inventory, self.rules)
        assert self.store is not None
        with self.store.write():
            for job_id, gpus in plan.starts:
                self.start(self.jobs[job_id], gpus)
            for job_id, reason in plan.reasons.items():
                if self.jobs[job_id].pending_reason != reason:
                    self.save(replace(self.jobs[job_id], pending_reason=reason))

    def start(self, job: Job, gpus: tuple) -> None:
        taken = [j.master_port for j in self.running() if j.master_port]
        port = runner.pick_master_port(self.settings.master_port_min,
                                       self.settings.master_port_max, taken)
        env = runner.job_environment(job, gpus, port, self.settings.visible_devices)
        started_at = time.time()
        pid, pid_started = runner.start_shim(job, env, self.paths.jobs_dir, self.paths.socket,
                                             self.settings.cancel_grace_s)
        self.save(transition(
            job, JobState.RUNNING, started_at=started_at, gpu_uuids=tuple(g.uuid for g in gpus),
            gpu_indices=tuple(g.index for g in gpus), master_port=port, pending_reason="",
            shim_pid=pid, shim_start_time=pid_started, boot_id=self.boot_id))
        # No GPU read is needed now: until the next one, the new job's whole declared
        # memory counts as promised (placement.gpu_loads).

    def answer_waiters(self) -> None:
        now = time.monotonic()
        still = []
        for call in self._waiters:
            if now >= call.deadline or self.handlers.all_final(call.args["ids"]):
                call.answer(self.handlers.wait_reply(call))
            else:
                still.append(call)
        self._waiters = still

    def add_waiter(self, call: Call) -> None:
        timeout = float(call.args.get("timeout_s") or _WAIT_SLICE_S)
        call.deadline = time.monotonic() + min(max(timeout, 0.0), _WAIT_SLICE_S)
        self._waiters.append(call)


def serve(paths: Paths) -> None:
    """`gpusched daemon run`: load the config, open the GPU backend, run until stopped."""
    settings = load_settings(paths.config_file)
    try:
        backend = open_backend(settings.simulate, paths.sim_processes)
    except ValueError as exc:
        raise ConfigError(f"gpus.simulate / GPUSCHED_SIMULATE: {exc}") from None
    Daemon(paths, settings, backend).run()
