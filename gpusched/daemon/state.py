"""The daemon's one state: the active jobs, the store, fair-share usage, the GPUs as last read,
and the flags; and the setup it runs with. Request handling and job control are given both."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

from gpusched.client.paths import Paths
from gpusched.core.config import Settings
from gpusched.core.errors import StoreWriteError
from gpusched.core.models import Inventory, Job, JobState
from gpusched.core.sched import gpupromise, placement, queuerules, reservations
from gpusched.core.sched.pendingqueue import PendingQueue
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.reservations import Reservation
from gpusched.core.users import unix_groups
from gpusched.daemon.host import Host
from gpusched.daemon.jobs.cgroups import CgroupJobs
from gpusched.daemon.jobs.fairshare import UsageLedger
from gpusched.daemon.jobs.jobtable import JobTable, Kinds
from gpusched.daemon.jobs.starttimes import StartTimes
from gpusched.daemon.observe.notify import make_notifier
from gpusched.daemon.observe.telemetry import Telemetry
from gpusched.daemon.requests.authz import Authz
from gpusched.daemon.requests.quotas import CountedTable
from gpusched.daemon.slurm.poll import ClusterJobs
from gpusched.proc.mps import MpsControl
from gpusched.proc.runfile import own_log_paths
from gpusched.store.database import Store
from gpusched.store.writefail import WriteHealth

_T = TypeVar("_T")

if TYPE_CHECKING:
    from typing import Protocol

    class Clock(Protocol):
        """The time module, or in tests a clock they move by hand."""

        def time(self) -> float: ...
        def monotonic(self) -> float: ...


@dataclass(frozen=True)
class Setup:
    """What a daemon runs with, fixed from its start to its stop."""

    paths: Paths
    settings: Settings
    rules: PlacementRules
    host: Host
    authz: Authz
    cgroups: CgroupJobs | None  # kernel-enforced memory limits, when enforce_mem found a tree
    started_at: float
    # time() and monotonic(): the time module, or in tests a clock they move by hand.
    clock: Clock = time

    def queue_rules(self, draining: bool) -> queuerules.QueueRules:
        s = self.settings
        return queuerules.QueueRules(
            discipline=s.discipline,
            user_weights=dict(s.user_weights),
            quotas=s.quotas,
            groups_of=cache(unix_groups),  # read again each pass: a change applies at once
            draining=draining,
            host=self.host.capacity(s.max_running),
            las_thresholds_gpu_s=s.las_thresholds_gpu_s,
            las_starvation_factor=s.las_starvation_factor,
            las_starvation_floor_s=s.las_starvation_floor_s,
            las_preempt_smaller_after_s=s.las_preempt_smaller_after_s,
        )

    def mem_enforcement(self) -> str:
        """How --mem is enforced, for `daemon status`."""
        if not self.settings.enforce_mem:
            return "off (overuse is reported, not stopped)"
        if self.cgroups:
            return self.cgroups.describe()
        return (
            f"process-tree measurement every {self.settings.gpu_poll_interval_s:g} s "
            "(no writable cgroup v2 tree)"
        )


def mps_control(setup: Setup) -> MpsControl:
    """memory.mps's control daemon. In system mode it is refused: NVIDIA's control daemon
    serves one user at a time, so one user's job would wait on another's."""
    paths, settings = setup.paths, setup.settings
    return MpsControl(
        settings.mps_control,
        paths.mps_pipe_dir,
        paths.mps_log_dir,
        settings.mps,
        refused="MPS serves one user at a time: not in system mode" if paths.is_system else "",
    )


# The meta key of DaemonState.attained: {job id: GPU-seconds}, as JSON.
ATTAINED_KEY = "las_attained"


def _stored_attained(text: str) -> dict[int, float]:
    """The attained service the store keeps ({} if none or unreadable: las then counts
    those jobs from nothing, as before it was stored)."""
    try:
        return {int(k): float(v) for k, v in json.loads(text).items()} if text else {}
    except (ValueError, TypeError, AttributeError):
        return {}


class DaemonState:
    """The pending and running jobs (finished ones live in the store only), kept in step
    with the store; the GPUs as the loop last read them; and what the loop must do next.
    Other modules read what it gives out and change it through its methods only (note_...),
    so that each part has one writer whichever subsystem asks."""

    def __init__(self, store: Store, setup: Setup, backend_name: str):
        self.store = store
        # Pending jobs alike are held as one template (daemon/jobs/jobtable.py).
        self.kinds = Kinds(
            partial(own_log_paths, setup.paths.jobs_dir, setup.paths.log_root),
            lambda: (entry for _, entry in self.jobs.alike()),
        )
        self.jobs = CountedTable(self.kinds)  # pending and running jobs
        self._running: dict[int, Job] = {}  # the running ones among them
        self._pending = JobTable(self.kinds)  # and the pending ones
        # The pending ones in scheduling order, kept in step by _place (never sorted per
        # pass), and the last pass's reasons for those it stopped before (set_later).
        self.queue = PendingQueue(setup.settings.discipline, per_user=bool(setup.settings.quotas))
        self._later: tuple[str, Callable[[Job], str | None]] | None = None
        self.start_times = StartTimes(setup.clock.time)  # --begin times and retry delays to come
        # GPU reservations by name, their starts and ends on the same timer.
        self.reservations: dict[str, Reservation] = {}
        for reservation in store.reservations():
            self.note_reservation(reservation.name, reservation)
        self.usage = UsageLedger(setup.settings.fairshare_half_life_s, setup.clock.time())
        # GPU-seconds of the runs that went back to the queue, by job id (las), kept in
        # the store's meta so that a restarted daemon puts a requeued job in its queue.
        self.attained = _stored_attained(store.get_meta(ATTAINED_KEY))
        # The GPUs as last read, which processes on them belong to which job, and since
        # when each outside process has shown 0% busy (note_gpus).
        self._inventory = Inventory(backend=backend_name)
        self._pid_jobs: dict[int, int] = {}
        self._idle_since: dict[int, float] = {}
        # Outside memory read within [memory] others_peak_window, per GPU (gpupromise).
        self._outside_window_s = setup.settings.others_peak_window_s
        self._outside_samples: dict[str, tuple[tuple[float, int], ...]] = {}
        self._outside_peaks: dict[str, int] = {}
        # Since when each running job's GPUs have all been 0% busy (daemon/jobs/idlegpus.py).
        self._gpu_idle_since: dict[int, float] = {}
        self.draining = store.get_meta("draining") == "1"
        self._stopping = False
        self._schedule_needed = True  # something a scheduling pass depends on changed
        self._gpus_dirty = True  # a run that held GPUs ended: read them before the poll
        self.writes = WriteHealth(setup.clock)
        # Ends read from run files whose write failed (a full disk): ls and show give them
        # meanwhile, rather than `running` until the disk has room (jobs/control.py, end).
        self._unstored_ends: dict[int, Job] = {}
        self.telemetry = Telemetry()  # counted for /metrics (daemon/observe/metrics.py)
        self.mps = mps_control(setup)  # jobs/control.py starts it, startup.py stops it
        # Each service's figures for /metrics, swapped in whole (daemon/services/replicas.py).
        self._service_figures: list[dict[str, Any]] = []
        self._metrics_status = "off"  # where /metrics is served, for `daemon status`
        self.notifier = make_notifier(setup.settings, setup.paths, setup.clock)
        # While a write() runs: each job it changed as it was before (None: not active),
        # and what to do once it commits, or if it fails.
        self._undo: dict[int, Job | None] | None = None
        self._on_commit: list[Callable[[], object]] = []
        self._on_rollback: list[Callable[[], object]] = []
        # Ids of submits being stored in batches (daemon/requests/batches.py): not acknowledged
        # yet, so no request may see or touch them.
        self._incoming: list[range] = []
        # Moves with every change to the pending jobs, so that `top` gets them (maybe
        # thousands) again only when they changed; the random part tells daemons apart.
        self._pending_nonce, self._pending_changes = secrets.token_hex(4), 0
        # Views worked out from the pending jobs (`ls`'s head, `top`'s order, the counts by
        # group: daemon/requests/lsqueue.py), each with the pending_version it was worked out for.
        self._of_pending: dict[Any, tuple[str, Any]] = {}
        # Cluster jobs (daemon/slurm/poll.py, which holds their ids): active like any job,
        # but never among running() and pending(), which this machine's scheduler works on.
        self.clusters = ClusterJobs(self, setup)
        # Told of the jobs that become active (submitted, or queued again after their
        # end): retention's index of what active jobs need (daemon/jobs/stillneeded.py).
        self._activated: list[Callable[[Iterable[Job]], None]] = []

    # -- the active jobs ----------------------------------------------------------------
    def load_active(self, jobs: Iterable[Job]) -> None:
        """The active jobs, as the store reads them: each job is held (by its template)
        as it comes, so that 100,000 of them are never whole at once."""
        self.jobs, self._running = CountedTable(self.kinds), {}
        self._pending = JobTable(self.kinds)
        self._pending_changes += 1
        self.queue = PendingQueue(self.queue.discipline, self.queue.per_user)
        self.queue.add_many(self._held_pending(jobs))
        self.jobs.sort()

    def _held_pending(self, jobs: Iterable[Job]) -> Iterator[Job]:
        """Each job put in the tables; the local pending ones, for the queue."""
        for job in jobs:
            entry = self.kinds.lean(job)
            self.jobs.put_lean(job.id, entry)
            if job.id in self.remote_ids:
                continue
            if job.is_running:
                self._running[job.id] = job
            elif job.state is JobState.PENDING:
                self._pending.put_lean(job.id, entry)
                self.start_times.note(job.id, job)
                yield job

    @property
    def pending_version(self) -> str:
        """A name for the pending jobs as they are now: another once any of them changed."""
        return f"{self._pending_nonce}.{self._pending_changes}"

    def of_pending(self, key: Any, work_out: Callable[[], _T]) -> _T:
        """work_out()'s value, worked out again only once the pending jobs changed: with
        100,000 pending, `top` asks every second and the queue seldom moves."""
        version = self.pending_version
        kept = self._of_pending.get(key)
        if kept is None or kept[0] != version:
            kept = self._of_pending[key] = (version, work_out())
        return cast("_T", kept[1])  # what work_out() gave for this key

    def compact(self) -> None:
        """Rebuild the job tables, which keep the size of the most they ever held. In
        place: job control, retention and /metrics hold these very dicts."""
        self.jobs.compact()
        self._pending.compact()
        kept = dict(self._running)
        self._running.clear()  # frees the large table; update() sizes a new one to fit
        self._running.update(kept)

    def running(self) -> list[Job]:
        # Kept apart from the queue: asked several times a pass, with thousands pending.
        return list(self._running.values())

    def pending(self) -> list[Job]:
        return list(self._pending.values())

    def pending_alike(self) -> Iterable[tuple[int, Job]]:
        """(id, job or its template) of each pending job: cheaper than pending() for what a
        template answers as its jobs do (daemon/jobs/jobtable.py): all but the id, log paths,
        array index and pending reason."""
        return self._pending.alike()

    def pending_ids(self) -> Iterable[int]:
        return self._pending.keys()

    def pending_in_order(self, share: Callable[[str], float] | None = None) -> Iterator[Job]:
        """The pending jobs in scheduling order, lazily (fairshare: `share` by user)."""
        return self.queue.jobs(self._pending, share)

    def pending_count(self) -> int:
        return len(self._pending)

    def set_later(self, explain: Callable[[Job], str | None] | None) -> None:
        """The pass just made: reasons for the jobs it stopped before, while the pending
        jobs stay as they are now."""
        self._later = (self.pending_version, explain) if explain else None

    def reason_of(self, job: Job) -> str:
        """A pending job's reason as the last pass would have written it had it looked at
        every job (a bounded pass stops early; core/sched/scheduling.py)."""
        if (
            self._later is not None
            and self._later[0] == self.pending_version
            and self._pending.holds(job)
        ):
            why = self._later[1](job)
            if why is not None:
                return why
        return job.pending_reason

    def find(self, job_id: int) -> Job | None:
        """A job, active or finished."""
        if any(job_id in ids for ids in self._incoming):
            return None
        return self.jobs.get(job_id) or self.store.get(job_id)

    def save(self, job: Job) -> None:
        """Store a changed job (inside a write transaction) and keep the active set in step."""
        self.store.update(job)
        self.remember(job)

    def remember(self, job: Job) -> None:
        """Keep the active set in step with a job, without a write of its own: for a job
        just stored, and for what a restart works out again by itself (pending reasons,
        and shim pids, which the run files hold). The next save stores those too.
        Inside write(), the change is undone if the write fails."""
        previous = self.jobs.get(job.id)
        if self._undo is not None:
            self._undo.setdefault(job.id, previous)
        self._place(job.id, None if job.state.is_final else job)
        if previous is None and not job.state.is_final:
            for tell in self._activated:
                tell((job,))
        if (
            previous is None
            or previous.state is not job.state
            or (job.gpu_mem_over_by and not previous.gpu_mem_over_by)  # a gpu_mem_over event
        ):  # counted once stored
            self.after_commit(lambda: self._committed(previous, job))
        if previous is not None and previous.state is JobState.RUNNING and not job.is_running:
            # A run ended: its GPUs are free, so read them again rather than wait for the
            # poll, and let waiting jobs (and dependents) be considered.
            self._gpus_dirty = self._gpus_dirty or bool(previous.gpu_uuids)
            self._schedule_needed = True

    def _committed(self, previous: Job | None, job: Job) -> None:
        """A transition is stored: count it for /metrics, and tell whom it concerns."""
        self.telemetry.job_changed(previous, job)
        self.notifier.job_changed(previous, job)

    def _place(self, job_id: int, job: Job | None) -> None:
        """The active version of a job, or None: it is not active."""
        if job_id in self._pending or (job is not None and job.state is JobState.PENDING):
            self._pending_changes += 1
        local = job if job is not None and job_id not in self.remote_ids else None
        pending = local if local is not None and local.state is JobState.PENDING else None
        self._requeue(self._pending.get(job_id), pending)
        self.start_times.note(job_id, pending)
        entry = None if job is None else self.kinds.lean(job)
        for subset, held in (
            (self.jobs, entry),
            (self._pending, None if pending is None else entry),
        ):
            if held is not None:
                subset.put_lean(job_id, held)
            else:
                subset.discard(job_id)
        if local is not None and local.is_running:
            self._running[job_id] = local
        else:
            self._running.pop(job_id, None)

    def _requeue(self, old: Job | None, new: Job | None) -> None:
        """Keep the ordered queue in step with one job's change."""
        if old is not None and new is not None and self.queue.same_place(old, new):
            return
        if old is not None:
            self.queue.remove(old)
        if new is not None:
            self.queue.add(new)

    @property
    def incoming(self) -> list[range]:
        return self._incoming

    def note_incoming(self, ids: range) -> None:
        """Jobs being stored in batches (daemon/requests/batches.py): until note_known, no
        request may see or touch them."""
        self._incoming.append(ids)

    def note_known(self, ids: range) -> None:
        """Jobs note_incoming named are known now (remember_alike), or were never stored."""
        self._incoming.remove(ids)

    @property
    def unstored_ends(self) -> dict[int, Job]:
        return self._unstored_ends

    def note_end_unstored(self, job: Job, stored: bool = False) -> None:
        """A job's end read from its run file but not stored (a failed write), or stored
        at last (stored=True): meanwhile ls and show give it (daemon/jobs/control.py)."""
        if stored:
            self._unstored_ends.pop(job.id, None)
        else:
            self._unstored_ends[job.id] = job

    def tell_activated(self, tell: Callable[[Iterable[Job]], None], told: bool = True) -> None:
        """Tell `tell` (or no longer: told=False) of the jobs that become active."""
        if told:
            self._activated.append(tell)
        else:
            self._activated.remove(tell)

    # -- writes ---------------------------------------------------------------------------
    @contextmanager
    def write(self, undone: str = "nothing was changed") -> Iterator[None]:
        """One write transaction of the store and of this state together. Nothing it
        changes in memory (jobs, fair-share usage) outlives a failed commit, and what waits
        for the commit (after_commit: signals, launches) happens only after it. A failed
        write raises StoreWriteError ending in `undone`. Nested uses join the outer one."""
        if self._undo is not None:
            yield
            return
        self._undo, self._on_commit, self._on_rollback = {}, [], []
        usage, changes = self.usage.snapshot(), self.store.total_changes
        try:
            with self.store.write():
                yield
        except BaseException as exc:
            undo, on_rollback, self._undo = self._undo, self._on_rollback, None
            for job_id, job in undo.items():
                self._place(job_id, job)
            self.usage.restore(usage)
            for action in on_rollback:
                action()
            if isinstance(exc, StoreWriteError):
                self.writes.failed(exc)
                raise exc.saying(undone) from None
            raise
        on_commit, self._undo = self._on_commit, None
        if self.store.total_changes != changes:
            self.writes.worked()
        for action in on_commit:
            action()

    @contextmanager
    def part(self) -> Iterator[None]:
        """Inside write(): a part that fails alone (a submit among several sharing one
        commit). Its changes, stored and in memory, are undone and the write goes on."""
        outer = self._undo, self._on_commit, self._on_rollback
        assert outer[0] is not None, "part() is only used inside write()"
        undo: dict[int, Job | None] = {}
        on_commit: list[Callable[[], object]] = []
        on_rollback: list[Callable[[], object]] = []
        self._undo, self._on_commit, self._on_rollback = undo, on_commit, on_rollback
        usage = self.usage.snapshot()
        try:
            with self.store.savepoint():
                yield
        except BaseException:
            for job_id, job in undo.items():
                self._place(job_id, job)
            self.usage.restore(usage)
            for action in on_rollback:
                action()
            raise
        else:
            for job_id, job in undo.items():
                outer[0].setdefault(job_id, job)
            outer[1].extend(on_commit)
            outer[2].extend(on_rollback)
        finally:
            self._undo, self._on_commit, self._on_rollback = outer

    def after_commit(self, action: Callable[[], object]) -> None:
        """Do this once the write under way commits (now, outside a write): what must not
        happen for a change that is not stored (a signal, a launch, a file removed)."""
        if self._undo is None:
            action()
        else:
            self._on_commit.append(action)

    def on_rollback(self, action: Callable[[], object]) -> None:
        """Undo this if the write under way fails (a port held, a cgroup made for a start)."""
        if self._undo is not None:
            self._on_rollback.append(action)

    def remember_alike(self, entries: Iterable[tuple[int, Job]]) -> None:
        """remember() for many jobs just queued (all pending), in a few dict updates, as
        (id, Kinds.lean of the job) pairs: what a big submit keeps of its jobs until the
        last batch is stored."""
        entries = list(entries)
        count = len(self._pending)
        self.queue.add_many(self.kinds.passing(self._held_new(entries)))
        self._pending_changes += 1
        self._schedule_needed = True
        for tell in self._activated:  # a template answers what they ask (daemon/jobs/jobtable.py)
            tell([entry for _, entry in entries])
        added = len(self._pending) - count
        self.after_commit(lambda: self.telemetry.jobs_submitted(added))

    def _held_new(self, entries: Iterable[tuple[int, Job]]) -> Iterator[tuple[int, Job]]:
        for job_id, entry in entries:
            self.jobs.put_lean(job_id, entry)
            self._pending.put_lean(job_id, entry)
            self.start_times.note(job_id, entry)
            yield job_id, entry

    # -- flags ----------------------------------------------------------------------------
    def note_reservation(self, name: str, reservation: Reservation | None) -> None:
        """A reservation as stored now (None: deleted)."""
        if reservation is None:
            self.reservations.pop(name, None)
        else:
            self.reservations[name] = reservation
        self.start_times.note_times(
            name, [] if reservation is None else reservations.times([reservation])
        )
        self.note_schedule_needed()

    def set_draining(self, draining: bool) -> None:
        """Start nothing new (or again), stored first so that a restart keeps it."""
        with self.write():
            self.store.set_meta("draining", "1" if draining else "0")
        self.draining = draining

    def note_run_requeued(self, job: Job, ended_at: float) -> None:
        """A run that ended to go back to the queue: its GPU-seconds count towards the
        job's attained service (las), once the write under way is stored."""
        if job.started_at is None:
            return
        ran_gpu_s = max(job.request.gpus, 0) * max(ended_at - job.started_at, 0.0)
        # Only jobs still queued or running are kept: those that ended are dropped here.
        attained = {i: gpu_s for i, gpu_s in self.attained.items() if i in self.jobs}
        attained[job.id] = attained.get(job.id, 0.0) + ran_gpu_s
        self.store.set_meta(ATTAINED_KEY, json.dumps(attained))

        def add() -> None:
            self.attained = attained

        self.after_commit(add)

    def note_schedule_needed(self) -> None:
        """Something a scheduling pass depends on changed: the loop runs one this turn."""
        self._schedule_needed = True

    def take_schedule_needed(self) -> bool:
        """Whether a scheduling pass is due for the state's own reasons; clears the flag."""
        needed, self._schedule_needed = self._schedule_needed, False
        return needed

    @property
    def stopping(self) -> bool:
        return self._stopping

    def note_stopping(self) -> None:
        """Stop the daemon (a request, a signal, a home no client reaches): the loop ends
        after this turn; running jobs go on under their shims."""
        self._stopping = True

    # -- the GPUs, as the loop last read them ------------------------------------------------
    @property
    def inventory(self) -> Inventory:
        return self._inventory

    @property
    def pid_jobs(self) -> dict[int, int]:
        return self._pid_jobs

    @property
    def idle_since(self) -> dict[int, float]:
        return self._idle_since

    @property
    def outside_peaks(self) -> dict[str, int]:
        """GPU uuid -> the most memory processes not ours held within the window."""
        return self._outside_peaks

    @property
    def gpus_dirty(self) -> bool:
        return self._gpus_dirty

    def note_gpus(self, inventory: Inventory, pid_jobs: dict[int, int], now: float) -> None:
        """The GPUs just read, and the job of each process on them: the outside processes'
        idle times follow, and a scheduling pass is due."""
        self._inventory, self._pid_jobs = inventory, pid_jobs
        self._idle_since = placement.track_idle(inventory, pid_jobs, self._idle_since, now)
        self._outside_samples = gpupromise.track_outside(
            inventory, pid_jobs, self._outside_samples, now, self._outside_window_s
        )
        self._outside_peaks = gpupromise.outside_peaks(self._outside_samples)
        self._gpus_dirty = False
        self._schedule_needed = True

    @property
    def gpu_idle_since(self) -> dict[int, float]:
        return self._gpu_idle_since

    def note_gpu_idle_since(self, since: dict[int, float]) -> None:
        """Since when each running job's GPUs have all been 0% busy (daemon/jobs/idlegpus.py)."""
        self._gpu_idle_since = since

    # -- what `daemon status` and /metrics show ---------------------------------------------
    @property
    def service_figures(self) -> list[dict[str, Any]]:
        return self._service_figures

    def note_service_figures(self, figures: list[dict[str, Any]]) -> None:
        """Each service's figures, swapped in whole: /metrics reads them from its own thread."""
        self._service_figures = figures

    @property
    def metrics_status(self) -> str:
        return self._metrics_status

    def note_metrics_status(self, status: str) -> None:
        """Where /metrics is served (or why not), for `daemon status`."""
        self._metrics_status = status

    @property
    def remote_ids(self) -> set[int]:
        """The cluster jobs' ids (daemon/slurm/poll.py)."""
        return self.clusters.ids
