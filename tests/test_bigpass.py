"""A scheduling pass over a big queue is bounded (issue 23): it starts exactly what a walk of
the whole queue starts, does work bounded by what can start plus the kinds of job waiting,
and a reason asked for later is the one the whole walk would have written."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.models import GpuInfo, Inventory, Job, JobState, Request, transition
from gpusched.core.sched import placement, queuerules, scheduling
from gpusched.core.sched.pendingqueue import PendingQueue
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import HostCapacity, QueueRules
from gpusched.core.sched.quotas import Quota, Quotas
from gpusched.daemon.jobs.depstates import lowest_by_name


def default_quota(per_user: tuple[int | None, int | None]) -> Quotas:
    """[quotas.default] with max_running_jobs and max_running_gpus (None: unset)."""
    limits = dict(zip(("max_running_jobs", "max_running_gpus"), per_user))
    set_ = {key: value for key, value in limits.items() if value is not None}
    return Quotas(Quota("default", set_)) if set_ else Quotas()


GIB = 2**30
# The disciplines a pass may bound: las sorts the queue at each pass (its order moves with
# time), so the daemon never gives it a line.
LINED = tuple(d for d in queuerules.DISCIPLINES if d != "las")
NOW_S = 10_000.0
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def box(gpus: int) -> Inventory:
    return Inventory(
        tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{i}",
                name="NVIDIA A100-SXM4-80GB",
                mem_total_bytes=80 * GIB,
                mem_used_bytes=0,
                util_pct=0.0,
            )
            for i in range(gpus)
        )
    )


@st.composite
def jobs(draw, first_id: int = 1) -> list[Job]:
    """A queue of a few kinds of job, as sweeps make: GPU counts and memory, cores, users,
    priorities, holds, retries, dependencies and throttled arrays."""
    out = []
    for n in range(draw(st.integers(0, 40))):
        job_id = first_id + n
        gpus = draw(st.sampled_from([0, 0, 1, 1, 2, 4]))
        dep = draw(
            st.sampled_from(
                [
                    (),
                    (),
                    (),
                    (("afterok", 1),),
                    (("afterok", 999),),
                    (("singleton", 0),),
                    (("aftercorr", 1),),
                ]
            )
        )
        out.append(
            Job(
                id=job_id,
                command=("true",),
                cwd="/",
                uid=1000,
                user=draw(st.sampled_from(["ann", "bob", "cy"])),
                name=draw(st.sampled_from(["", "a", "b"])),
                request=Request(
                    gpus=gpus,
                    gpu_mem_bytes=draw(st.sampled_from([None, None, 30 * GIB])) if gpus else None,
                    cpus=draw(st.sampled_from([1, 1, 4])),
                    mem_bytes=draw(st.sampled_from([None, None, 8 * GIB])),
                ),
                priority=draw(st.sampled_from([0, 0, 0, 5])),
                submitted_at=0.0,
                held=draw(st.sampled_from([False] * 6 + [True])),
                dependencies=dep,
                kill_on_invalid_dep=bool(dep) and draw(st.booleans()),
                eligible_at=draw(st.sampled_from([None] * 6 + [NOW_S + 60, NOW_S - 60])),
                array_id=1 if draw(st.integers(0, 4)) == 0 else None,
                array_index=draw(st.sampled_from([None, 0, 1, 2])),
                array_throttle=2,
                time_limit_s=draw(st.sampled_from([None, 60.0, 3600.0])),
            )
        )
    return [job if job.array_id is not None else replace(job, array_throttle=None) for job in out]


def running_jobs(draw_ids: list[int], inventory: Inventory) -> list[Job]:
    """Jobs already running, one per GPU index listed."""
    gpus = inventory.gpus
    return [
        transition(
            Job(
                id=1000 + i,
                command=("x",),
                cwd="/",
                uid=1000,
                user="ann",
                request=Request(gpus=1),
                time_limit_s=600.0,
            ),
            JobState.RUNNING,
            started_at=NOW_S - 10,
            gpu_uuids=(gpus[i].uuid,),
            gpu_indices=(i,),
        )
        for i in sorted(set(draw_ids))
        if i < len(gpus)
    ]


def both_passes(
    pending: list[Job],
    running: list[Job],
    inventory: Inventory,
    queue: QueueRules,
    usage: dict[str, float] | None = None,
    rules: PlacementRules | None = None,
):
    """The whole-queue walk, and the bounded pass over the same jobs in a PendingQueue."""
    rules = rules or PlacementRules(policy="pack")
    loads = placement.gpu_loads(inventory, running, {}, rules)
    deps = scheduling.DependencyStates({1: JobState.RUNNING})
    # aftercorr:1 pairs element N with element N of job 1's array; singleton looks at the
    # active jobs of its user and name.
    deps.elements.update(
        {(1, 0): JobState.SUCCEEDED, (1, 1): JobState.FAILED, (1, 2): JobState.RUNNING}
    )
    deps.same_name.update(lowest_by_name((j.id, j) for j in [*pending, *running]))
    full = scheduling.schedule(
        pending, running, loads, inventory, rules, queue, NOW_S, deps, usage=usage
    )
    line = PendingQueue(queue.discipline, per_user=True)
    line.add_many(pending)
    table = {job.id: job for job in pending}
    ordered = line.jobs(table, queuerules.fair_share(queue, usage or {}))
    bounded = scheduling.schedule(
        ordered, running, loads, inventory, rules, queue, NOW_S, deps, usage=usage, line=line
    )
    return full, bounded


def reasons_of(plan: scheduling.Plan, pending: list[Job]) -> dict[int, str]:
    """Each job's reason: the pass's own, else the one worked out when asked."""
    out = {}
    for job in pending:
        if job.id in plan.reasons:
            out[job.id] = plan.reasons[job.id]
        elif plan.later is not None and job.id not in plan.cancels:
            why = plan.later(job)
            if why is not None:
                out[job.id] = why
    return out


@SETTINGS
@given(
    pending=jobs(),
    busy=st.lists(st.integers(0, 3), max_size=4),
    gpus=st.integers(1, 4),
    max_running=st.sampled_from([None, 1, 3, 6]),
    discipline=st.sampled_from(LINED),
    per_user=st.sampled_from([(None, None), (1, None), (None, 2)]),
    draining=st.sampled_from([False] * 5 + [True]),
)
def test_a_bounded_pass_starts_every_job_the_whole_walk_starts(
    pending, busy, gpus, max_running, discipline, per_user, draining
):
    # The no-starvation property: whatever could start in this pass (the walk of the
    # whole queue says what) starts in it, so a job that can start waits no pass longer.
    inventory = box(gpus)
    queue = QueueRules(
        discipline=discipline,
        quotas=default_quota(per_user),
        draining=draining,
        host=HostCapacity(cpus=8, mem_bytes=64 * GIB, max_running=max_running),
    )
    usage = {"ann": 50.0, "bob": 5.0}
    full, bounded = both_passes(pending, running_jobs(busy, inventory), inventory, queue, usage)
    assert_same_decisions(full, bounded, pending)


def assert_same_decisions(
    full: scheduling.Plan, bounded: scheduling.Plan, pending: list[Job]
) -> None:
    """The bounded pass starts, places and cancels what the whole walk does, and a reason
    asked for later is the whole walk's, for every job that waits."""
    assert bounded.starts == full.starts
    assert bounded.cancels == full.cancels
    assert bounded.placements == full.placements
    waiting = [job for job in pending if job.id not in dict(full.starts)]
    assert reasons_of(bounded, waiting) == {
        job.id: full.reasons[job.id] for job in waiting if job.id in full.reasons
    }


def sweep(count: int, first_id: int = 1, gpus: int = 0) -> list[Job]:
    return [
        Job(
            id=first_id + n,
            command=("true",),
            cwd="/",
            uid=1000,
            user="ann",
            request=Request(gpus=gpus),
            submitted_at=0.0,
        )
        for n in range(count)
    ]


def test_a_pass_behind_max_running_looks_at_a_handful_of_a_100000_job_sweep():
    # The sweep of the issue: `true`, --gpus 0, max_running = 4; three run, one slot frees.
    pending = sweep(100_000, first_id=10)
    running = [transition(job, JobState.RUNNING, started_at=NOW_S) for job in sweep(3)]
    queue = QueueRules(host=HostCapacity(cpus=16, mem_bytes=64 * GIB, max_running=4))
    full, bounded = both_passes(pending, running, box(4), queue)
    assert bounded.starts == full.starts == ((10, ()),)
    assert bounded.considered <= 2  # the job that starts, and the one that finds the box full
    assert full.considered == 1  # the whole walk gives 99,999 jobs one shared reason...
    assert len(full.reasons) == 99_999 and len(bounded.reasons) == 0  # ...the bounded none
    assert bounded.later(pending[-1]) == full.reasons[pending[-1].id]


def test_a_small_job_behind_big_ones_still_starts_and_the_pass_stops_after_it():
    # 50,000 four-GPU jobs wait for a box with two GPUs free; a one-GPU job is queued
    # behind them. Counting the kinds of job left, the pass walks on past the big ones
    # (one kind, refused once) to the small one, starts it, and stops: the one kind
    # left ahead of it must not starve it.
    inventory = box(4)
    running = running_jobs([0, 1], inventory)
    pending = sweep(50_000, first_id=10, gpus=4) + sweep(1, first_id=60_000, gpus=1)
    full, bounded = both_passes(pending, running, inventory, QueueRules())
    assert bounded.starts == full.starts
    assert [job_id for job_id, _ in bounded.starts] == [60_000]
    # The big ones after the first are passed over unseen; asked for, each has the reason
    # the whole walk wrote.
    assert reasons_of(bounded, pending[:-1]) == full.reasons


def test_a_pass_over_many_kinds_stops_once_each_kind_is_refused():
    # 20 users' sweeps of 5,000 one-GPU jobs each, submitted side by side, on a full box,
    # per-user limits set (so that a user is part of a job's kind): one job of each user
    # is looked at, not 100,000.
    inventory = box(2)
    running = running_jobs([0, 1], inventory)
    pending = [replace(job, user=f"u{job.id % 20}") for job in sweep(100_000, 10, gpus=1)]
    queue = QueueRules(quotas=default_quota((10, None)))
    full, bounded = both_passes(pending, running, inventory, queue)
    assert bounded.starts == full.starts == ()
    assert full.considered == 100_000
    assert bounded.considered == 20


def test_singleton_and_aftercorr_jobs_of_one_request_are_told_apart():
    """singleton is decided by the job itself, aftercorr by its array index: a refused one
    must not stop the pass before a job alike but for those."""
    inventory = box(2)
    blocker = transition(
        Job(id=50, command=("x",), cwd="/", uid=1000, user="ann", name="x"),
        JobState.RUNNING,
        started_at=NOW_S - 10,
    )

    def job(job_id: int, **fields) -> Job:
        return Job(
            id=job_id, command=("true",), cwd="/", uid=1000, user="ann", submitted_at=0.0, **fields
        )

    pending = [
        job(2, name="x", dependencies=(("singleton", 0),)),
        job(3, name="y", dependencies=(("singleton", 0),)),
        job(4, array_id=4, array_index=2, dependencies=(("aftercorr", 1),)),
        job(5, array_id=4, array_index=0, dependencies=(("aftercorr", 1),)),
    ]
    queue = QueueRules(discipline="fifo")
    full, bounded = both_passes(pending, [blocker], inventory, queue)
    assert sorted(i for i, _ in full.starts) == [3, 5]
    assert sorted(i for i, _ in bounded.starts) == [3, 5]


def test_a_later_singleton_job_ahead_in_line_does_not_stop_the_oldest_of_its_name():
    # Of ann's jobs named a, the oldest (3) may run; 13 waits for it, though its priority
    # puts it first in line. Among throttled array elements, as a property test found.
    inventory = box(2)

    def job(job_id: int, **fields) -> Job:
        return Job(
            id=job_id, command=("true",), cwd="/", uid=1000, user="ann", submitted_at=0.0, **fields
        )

    elements = [
        job(i, array_id=1, array_index=n, array_throttle=2)
        for n, i in enumerate([1, 2, *range(4, 13)])
    ]
    pending = [
        *elements,
        job(3, name="a", dependencies=(("singleton", 0),)),
        job(13, name="a", priority=5, dependencies=(("singleton", 0),)),
    ]
    full, bounded = both_passes(pending, [], inventory, QueueRules(discipline="fifo"))
    assert sorted(i for i, _ in full.starts) == [1, 2, 3]
    assert sorted(i for i, _ in bounded.starts) == [1, 2, 3]
