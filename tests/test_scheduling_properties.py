"""Properties of placement and scheduling over random boxes, reservations and job streams."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.models import Constraints, GpuInfo, Inventory, Job, JobState, Request, transition
from gpusched.core.sched import placement, queuerules, scheduling
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import QueueRules

GIB = 2**30
NOW_S = 10_000.0
NAMES = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090")
POLICIES = tuple(placement.BUILTIN_POLICIES)
SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def gpus(draw, index: int) -> GpuInfo:
    total = draw(st.sampled_from([16, 24, 40, 80])) * GIB
    name = draw(st.sampled_from(NAMES))
    capability = draw(st.sampled_from([None, (7, 0), (8, 0), (9, 0)]))
    gpu = GpuInfo(
        index=index,
        uuid=f"GPU-{index}",
        name=name,
        mem_total_bytes=total,
        # With no processes of ours listed, all used memory belongs to someone else.
        # None is a driver that would not say; "almost full" leaves less than the headroom.
        mem_used_bytes=draw(
            st.sampled_from(
                [None, 0, 0, 0, GIB // 2, 2 * GIB, total // 2, total, total - 4 * GIB - GIB // 4]
            )
        ),
        util_pct=draw(st.sampled_from([None, 0.0, 0.0, 0.0, 40.0, 95.0])),
        is_healthy=draw(st.sampled_from([True] * 5 + [False])),
        compute_capability=capability,
    )
    if draw(st.integers(0, 3)) == 0:  # MIG mode: only its devices are given out
        migs = tuple(
            GpuInfo(
                index=index,
                uuid=f"MIG-{index}-{m}",
                name=name,
                mem_total_bytes=total // 4,
                mem_used_bytes=0,
                util_pct=0.0,
                compute_capability=capability,
                parent_index=index,
                gpu_instance_id=m,
            )
            for m in range(draw(st.integers(1, 3)))
        )
        gpu = replace(gpu, mig_devices=migs)
    return gpu


@st.composite
def inventories(draw, max_gpus: int = 5) -> Inventory:
    return Inventory(tuple(draw(gpus(i)) for i in range(draw(st.integers(1, max_gpus)))))


some_constraints = st.builds(
    Constraints,
    gpu_ids=st.sampled_from([(), (), (0,), (1, 2), (0, 3)]),
    exclude_gpus=st.sampled_from([(), (), (0,), (1,), (2, 4)]),
    gpu_type=st.sampled_from(["", "", "H100", "a100"]),
    min_gpu_total_mem_bytes=st.sampled_from([0, 0, 40 * GIB]),
    min_compute_capability=st.sampled_from([None, None, (8, 0)]),
)
# Mostly none, so that jobs compete for the same GPUs.
constraints = st.one_of(st.just(Constraints()), st.just(Constraints()), some_constraints)

requests = st.builds(
    Request,
    gpus=st.sampled_from([0, 1, 1, 1, 2, 2, 3]),
    gpu_mem_bytes=st.sampled_from([None, None, GIB, 4 * GIB, 10 * GIB, 30 * GIB]),
    constraints=constraints,
)


@st.composite
def jobs(draw, first_id: int, max_size: int) -> list[Job]:
    out = []
    for n in range(draw(st.integers(0, max_size))):
        request = draw(requests)
        if request.gpus == 0:
            request = replace(request, gpu_mem_bytes=None)
        out.append(
            Job(
                id=first_id + n,
                command=("train",),
                cwd="/",
                uid=1000,
                user=draw(st.sampled_from(["ann", "bob", "cy"])),
                request=request,
                priority=draw(st.integers(0, 3)),
                submitted_at=float(first_id + n),
                time_limit_s=draw(st.sampled_from([None, 10.0, 100.0, 5000.0])),
                policy=draw(st.sampled_from(["", ""] + list(POLICIES))),
            )
        )
    return out


def reserve(inventory: Inventory, wanted: list[Job], seed: int) -> list[Job]:
    """Running jobs on randomly chosen devices, kept only where a real daemon could have put them."""
    rng = random.Random(seed)
    devices = list(inventory.schedulable())
    held: dict[str, list[Job]] = defaultdict(list)
    running = []
    for job in wanted:
        if job.request.gpus == 0:
            continue
        rng.shuffle(devices)
        chosen = [g for g in devices if _could_hold(g, held[g.uuid], job)][: job.request.gpus]
        if len(chosen) < job.request.gpus:
            continue
        for gpu in chosen:
            held[gpu.uuid].append(job)
        running.append(
            transition(
                job,
                JobState.RUNNING,
                started_at=NOW_S - rng.uniform(0, 50),
                gpu_uuids=tuple(g.uuid for g in chosen),
                gpu_indices=tuple(g.index for g in chosen),
            )
        )
    return running


def _could_hold(gpu: GpuInfo, jobs_on_it: list[Job], job: Job) -> bool:
    if job.request.is_exclusive or gpu.parent_index is not None:
        return not jobs_on_it
    if any(j.request.is_exclusive for j in jobs_on_it):
        return False
    promised = sum(j.request.gpu_mem_bytes for j in jobs_on_it) + job.request.gpu_mem_bytes
    return (gpu.mem_used_bytes or 0) + promised <= gpu.mem_total_bytes


@st.composite
def situations(draw, disciplines=queuerules.DISCIPLINES, max_gpus: int = 5):
    inventory = draw(inventories(max_gpus))
    running = reserve(inventory, draw(jobs(1, 6)), draw(st.integers(0, 2**16)))
    pending = draw(jobs(100, 12))
    rules = PlacementRules(
        policy=draw(st.sampled_from(POLICIES)),
        gpu_weights={0: 2.0, 2: 0.5},
        gpu_order=tuple(draw(st.permutations(range(5)))),
    )
    queue = QueueRules(discipline=draw(st.sampled_from(disciplines)))
    usage = {"ann": draw(st.floats(0, 1e6)), "bob": draw(st.floats(0, 1e6))}
    placements = {i: draw(st.integers(0, 5)) for i in range(5)}
    return inventory, running, pending, rules, queue, usage, placements


def plan_for(situation, pending=None, explain: bool = True) -> scheduling.Plan:
    inventory, running, all_pending, rules, queue, usage, placements = situation
    loads = placement.gpu_loads(inventory, running, {}, rules, now=NOW_S)
    return scheduling.schedule(
        all_pending if pending is None else pending,
        running,
        loads,
        inventory,
        rules,
        queue,
        NOW_S,
        usage=usage,
        placements=placements,
        explain=explain,
    )


@SETTINGS
@given(situations())
def test_starts_respect_memory_exclusivity_gangs_and_constraints(situation):
    inventory, running, pending, rules, *_ = situation
    plan = plan_for(situation)
    devices = {g.uuid: g for g in inventory.schedulable()}
    by_id = {j.id: j for j in pending}
    on_gpu: dict[str, list[Job]] = defaultdict(list)
    for job in running:
        for uuid in job.gpu_uuids:
            on_gpu[uuid].append(job)
    assert len({job_id for job_id, _ in plan.starts}) == len(plan.starts)
    for job_id, chosen in plan.starts:
        job = by_id[job_id]
        # A gang gets every GPU it asked for, all different, or does not start.
        assert len({g.uuid for g in chosen}) == len(chosen) == job.request.gpus
        for gpu in chosen:
            device = devices[gpu.uuid]  # never a MIG parent or a GPU the box lacks
            index = device.index if device.parent_index is None else device.parent_index
            assert device.is_healthy and job.request.constraints.allows(device)
            assert index not in job.request.constraints.exclude_gpus
            assert not job.request.constraints.gpu_ids or index in job.request.constraints.gpu_ids
            on_gpu[gpu.uuid].append(job)
    for uuid in {g.uuid for _, chosen in plan.starts for g in chosen}:
        device, held = devices[uuid], on_gpu[uuid]
        if device.parent_index is not None or any(j.request.is_exclusive for j in held):
            assert len(held) == 1, f"{uuid} is shared by jobs {[j.id for j in held]}"
        else:
            promised = sum(j.request.gpu_mem_bytes for j in held)
            assert (
                device.mem_used_bytes or 0
            ) + promised + rules.mem_headroom_bytes <= device.mem_total_bytes


def loads_after(situation, starts) -> dict:
    """The loads the pass began with, plus these starts, as the pass itself counts them."""
    inventory, running, pending, rules, *_ = situation
    loads = placement.gpu_loads(inventory, running, {}, rules, now=NOW_S)
    by_id = {j.id: j for j in pending}
    for job_id, chosen in starts:
        placement.take(loads, by_id[job_id], chosen)
    return loads


@SETTINGS
@given(situations(disciplines=("fifo",), max_gpus=3))
def test_a_higher_priority_job_that_fits_is_never_passed_over(situation):
    # Under the default discipline a waiting job's turn sees only the starts of jobs with
    # a higher priority (or the same one, submitted earlier): lower ones never take its GPUs.
    rules, pending = situation[3], situation[2]
    plan = plan_for(situation, explain=False)
    started = {job_id for job_id, _ in plan.starts}
    for job in pending:
        if job.id in started:
            continue
        ahead = [
            (i, c) for i, c in plan.starts if (-_priority(pending, i), i) < (-job.priority, job.id)
        ]
        assert (
            placement.choose_gpus(
                job.request, loads_after(situation, ahead), rules, policy=job.policy
            )
            is None
            or job.request.gpus == 0
        )


def _priority(pending: list[Job], job_id: int) -> int:
    return next(j.priority for j in pending if j.id == job_id)


@SETTINGS
@given(situations(disciplines=("fifo", "sjf", "fairshare")))
def test_skip_ahead_leaves_no_waiting_job_that_fits(situation):
    rules, pending = situation[3], situation[2]
    plan = plan_for(situation, explain=False)
    left = loads_after(situation, plan.starts)
    started = {job_id for job_id, _ in plan.starts}
    for job in pending:
        if job.id not in started:
            assert placement.choose_gpus(job.request, left, rules, policy=job.policy) is None


@SETTINGS
@given(situations(), st.randoms(use_true_random=False))
def test_results_are_deterministic_for_the_same_input(situation, rng):
    plan = plan_for(situation)
    shuffled = list(situation[2])
    rng.shuffle(shuffled)
    assert plan_for(situation) == plan
    assert plan_for(situation, shuffled) == plan  # the queue's order, not the list's, decides
    assert plan_for(situation, explain=False).starts == plan.starts


@SETTINGS
@given(situations())
def test_one_pass_is_a_fixpoint(situation):
    # The simulator runs one pass per event: a second pass right after starts nothing more.
    inventory, running, pending, rules, queue, usage, _placements = situation
    plan = plan_for(situation)
    chosen = dict(plan.starts)
    now_running = list(running)
    for job in pending:
        if job.id in chosen:
            now_running.append(
                transition(
                    job,
                    JobState.RUNNING,
                    started_at=NOW_S,
                    gpu_uuids=tuple(g.uuid for g in chosen[job.id]),
                )
            )
    again = (
        inventory,
        now_running,
        [j for j in pending if j.id not in chosen],
        rules,
        queue,
        usage,
        plan.placements,
    )
    assert plan_for(again).starts == ()


@SETTINGS
@given(situations())
def test_the_plan_counts_its_starts_in_the_round_robin_counter(situation):
    # The daemon and the simulator both carry plan.placements to the next pass; neither
    # counts the starts again.
    placements = situation[-1]
    plan = plan_for(situation)
    expected = dict(placements)
    for _, gpus in plan.starts:
        for gpu in gpus:
            expected[gpu.index] = expected.get(gpu.index, 0) + 1
    assert plan.placements == expected
    assert placements == situation[-1]  # the caller's counter is left as it was


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(-3, 3),
            st.sampled_from(["ann", "bob", "cy"]),
            st.sampled_from([None, 60.0, 3600.0]),
        ),
        max_size=40,
    ),
    st.sampled_from(["fifo", "backfill", "fairshare", "sjf"]),
    st.randoms(),
)
def test_the_queue_order_is_order_keys_whatever_the_discipline(specs, discipline, rnd):
    """queue_order sorts without a Python call per job where it can: same order as order_key."""
    jobs = [
        Job(
            id=i + 1,
            command=("true",),
            cwd="/",
            uid=0,
            user=user,
            priority=priority,
            time_limit_s=limit,
        )
        for i, (priority, user, limit) in enumerate(specs)
    ]
    rnd.shuffle(jobs)
    rules = QueueRules(discipline=discipline, user_weights={"bob": 2.0})
    usage = {"ann": 50.0, "bob": 50.0}
    expected = sorted(jobs, key=lambda j: queuerules.order_key(j, rules, usage))
    assert queuerules.queue_order(jobs, rules, usage) == expected
