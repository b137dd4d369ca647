"""core/preemption.choose_victims, the pure choice the daemon and the simulator share:
examples, and properties over random boxes (hypothesis)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.models import GpuInfo, Inventory, Job, JobState, Request
from gpusched.core.sched import placement
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.preemption import (
    PreemptionRules,
    can_preempt,
    choose_victims,
    loads_without,
)

GIB = 2**30
NOW = 10_000.0
RULES = PlacementRules()
NO_MIN = PreemptionRules(min_run_s=0.0)


def box(gpus: int) -> Inventory:
    return Inventory(
        tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{i}",
                name="Sim",
                mem_total_bytes=80 * GIB,
                mem_used_bytes=0,
                util_pct=0.0,
            )
            for i in range(gpus)
        )
    )


def job(
    job_id: int,
    gpus: tuple[int, ...] = (),
    priority: int = 0,
    preemptible: bool = True,
    mem_gib: int | None = None,
    ran_s: float = 1000.0,
    preemptions: int = 0,
    count: int | None = None,
) -> Job:
    running = bool(gpus)
    return Job(
        id=job_id,
        command=("x",),
        cwd="/",
        uid=0,
        user="u",
        priority=priority,
        request=Request(
            gpus=count or len(gpus) or 1, gpu_mem_bytes=None if mem_gib is None else mem_gib * GIB
        ),
        state=JobState.RUNNING if running else JobState.PENDING,
        started_at=NOW - ran_s if running else None,
        preemptible=preemptible,
        preemptions=preemptions,
        gpu_uuids=tuple(f"GPU-{g}" for g in gpus),
        gpu_indices=gpus,
    )


def choose(urgent: Job, running: list[Job], gpus: int, rules: PreemptionRules = NO_MIN):
    loads = placement.gpu_loads(box(gpus), running, {}, RULES)
    found = choose_victims(urgent, running, loads, RULES, rules, NOW)
    return None if found is None else sorted(j.id for j in found)


def test_the_lowest_priority_goes_first():
    running = [job(1, (0,), priority=5), job(2, (1,), priority=1), job(3, (2,), priority=3)]
    assert choose(job(9, priority=10), running, 3) == [2]


def test_then_the_least_run_time_lost():
    running = [job(1, (0,), ran_s=5000), job(2, (1,), ran_s=100), job(3, (2,), ran_s=900)]
    assert choose(job(9, priority=10), running, 3) == [2]


def test_never_more_than_needed():
    # One two-GPU victim frees what the urgent job needs; two one-GPU ones would too.
    running = [job(1, (0, 1), priority=2), job(2, (2,), priority=0), job(3, (3,), priority=0)]
    assert choose(job(9, priority=10, count=2), running, 4) == [1]


def test_a_free_gpu_plus_one_victim():
    running = [job(1, (0,), priority=0), job(2, (1,), priority=1)]
    assert choose(job(9, priority=10, count=2), running, 3) == [1]


def test_none_when_the_job_fits_already_or_nothing_would_do():
    running = [job(1, (0,))]
    assert choose(job(9, priority=10), running, 2) is None  # GPU 1 is free
    assert (
        choose(job(9, priority=10, count=2), [job(1, (0,)), job(2, (1,), preemptible=False)], 2)
        is None
    )


def test_never_a_job_of_the_same_or_higher_priority():
    assert choose(job(9, priority=3), [job(1, (0,), priority=3)], 1) is None
    assert choose(job(9, priority=3), [job(1, (0,), priority=2)], 1) == [1]


def test_the_rules_that_protect_a_job():
    young = job(1, (0,), ran_s=60)
    assert choose(job(9, priority=10), [young], 1, PreemptionRules(min_run_s=300)) is None
    assert choose(job(9, priority=10), [young], 1, PreemptionRules(min_run_s=30)) == [1]
    worn = job(1, (0,), preemptions=3)
    assert (
        choose(job(9, priority=10), [worn], 1, PreemptionRules(min_run_s=0, max_preemptions=3))
        is None
    )
    assert choose(
        job(9, priority=10), [worn], 1, PreemptionRules(min_run_s=0, max_preemptions=0)
    ) == [1]
    assert (
        choose(job(9, priority=10), [job(1, (0,))], 1, PreemptionRules(enabled=False, min_run_s=0))
        is None
    )


def test_shared_gpus_free_only_as_much_memory_as_needed():
    running = [job(1, (0,), mem_gib=30, priority=1), job(2, (0,), mem_gib=30, priority=0)]
    # 20 GiB are free; 30 more (one victim) make room for 40 GiB plus the headroom.
    assert choose(job(9, priority=10, mem_gib=40), running, 1) == [2]
    assert choose(job(9, priority=10, mem_gib=70), running, 1) == [1, 2]


@st.composite
def boxes(draw):
    """A box of 1-5 GPUs, each empty, held whole by one job (maybe of two GPUs), or shared
    by one or two jobs; and an urgent job."""
    gpus = draw(st.integers(1, 5))
    running, next_id, g = [], 1, 0
    while g < gpus:
        kind = draw(st.sampled_from(["empty", "whole", "double", "shared"]))
        common = {
            "priority": draw(st.integers(0, 5)),
            "preemptible": draw(st.booleans()),
            "ran_s": draw(st.sampled_from([10.0, 400.0, 5000.0])),
            "preemptions": draw(st.integers(0, 4)),
        }
        if kind == "whole" or (kind == "double" and g + 1 >= gpus):
            running.append(job(next_id, (g,), **common))
        elif kind == "double":
            running.append(job(next_id, (g, g + 1), **common))
            g += 1
        elif kind == "shared":
            for _ in range(draw(st.integers(1, 2))):
                running.append(
                    job(next_id, (g,), mem_gib=draw(st.sampled_from([10, 30])), **common)
                )
                next_id += 1
        next_id += 1
        g += 1
    urgent = job(
        100,
        priority=draw(st.integers(0, 6)),
        count=draw(st.integers(1, gpus)),
        mem_gib=draw(st.sampled_from([None, None, 20, 50])),
    )
    return gpus, running, urgent


@settings(max_examples=300, deadline=None)
@given(boxes(), st.sampled_from([NO_MIN, PreemptionRules(min_run_s=300, max_preemptions=2)]))
def test_properties_of_every_choice(case, rules):
    gpus, running, urgent = case
    loads = placement.gpu_loads(box(gpus), running, {}, RULES)

    def fits(victims):
        return (
            placement.choose_gpus(urgent.request, loads_without(loads, victims, {}), RULES, {})
            is not None
        )

    found = choose_victims(urgent, running, loads, RULES, rules, NOW)
    allowed = [j for j in running if can_preempt(j, urgent, rules, NOW)]
    if found is None:
        # Nothing to do (it fits), or even every allowed victim would not be enough.
        assert fits(()) or not fits(allowed)
        return
    assert not fits(())
    assert all(can_preempt(j, urgent, rules, NOW) for j in found)  # never a protected job
    assert fits(found)
    for victim in found:  # never one more than needed
        assert not fits([j for j in found if j is not victim])
    for size in range(1, len(found)):  # and no smaller set would do
        assert not any(fits(combo) for combo in itertools.combinations(allowed, size))
