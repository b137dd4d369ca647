"""Placement as pure functions: which job starts, on which GPUs, and why the others wait."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.models import GpuInfo, GpuProcess, Inventory, Job, JobState, Request
from gpusched.core.sched.placement import PlacementRules, choose_gpus, gpu_loads, impossible_reason
from gpusched.core.sched.queuerules import QueueRules, order_key
from gpusched.core.sched.scheduling import schedule

GiB = 2**30
RULES = PlacementRules()  # 90 % utilization limit, 512 MiB headroom, 1 GiB idle for whole GPUs


def gpu(
    index: int,
    total_gib: float = 80,
    used_gib: float | None = 0,
    util: float | None = 0.0,
    healthy: bool = True,
    processes: tuple = (),
) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index}",
        name="Simulated GPU",
        mem_total_bytes=int(total_gib * GiB),
        mem_used_bytes=None if used_gib is None else int(used_gib * GiB),
        util_pct=util,
        is_healthy=healthy,
        processes=processes,
    )


def box(*gpus: GpuInfo) -> Inventory:
    return Inventory(gpus=tuple(gpus))


def job(job_id: int, gpus: int = 1, mem_gib: float | None = None, priority: int = 0) -> Job:
    mem = None if mem_gib is None else int(mem_gib * GiB)
    return Job(
        id=job_id,
        command=("train",),
        cwd="/",
        uid=1000,
        user="ada",
        request=Request(gpus, mem),
        priority=priority,
    )


def job_order(jobs):
    return sorted(jobs, key=lambda j: order_key(j, QueueRules(), {}))


def plan(pending, loads, inventory, rules, running=()):
    """One scheduling pass with the default queue (priority, then submission, skip-ahead)."""
    return schedule(list(pending), list(running), loads, inventory, rules, QueueRules(), now=0.0)


def running_on(j: Job, *indices: int) -> Job:
    return replace(
        j,
        state=JobState.RUNNING,
        gpu_uuids=tuple(f"GPU-{i}" for i in indices),
        gpu_indices=indices,
        runner_pid=10_000 + j.id,
    )


def place(pending, inventory, running=(), pid_jobs=None, rules=RULES):
    loads = gpu_loads(inventory, list(running), pid_jobs or {})
    result = plan(pending, loads, inventory, rules, running)
    return {job_id: tuple(g.index for g in gpus) for job_id, gpus in result.starts}, result.reasons


# -- order ---------------------------------------------------------------------------------
def test_order_is_priority_then_submission():
    jobs = [job(1), job(2, priority=5), job(3, priority=-1), job(4, priority=5), job(5)]
    assert [j.id for j in job_order(jobs)] == [2, 4, 1, 5, 3]


def test_higher_priority_takes_the_last_gpu():
    starts, reasons = place([job(1), job(2, priority=1)], box(gpu(0)))
    assert starts == {2: (0,)}
    assert set(reasons) == {1}


def test_earlier_submission_wins_at_equal_priority():
    starts, reasons = place([job(7), job(3)], box(gpu(0)))
    assert starts == {3: (0,)} and set(reasons) == {7}


def test_a_job_that_does_not_fit_does_not_block_smaller_ones():
    # Skip-ahead: the first job needs two whole GPUs, only one is idle.
    inventory = box(gpu(0), gpu(1, used_gib=40))
    starts, reasons = place(
        [job(1, gpus=2, priority=9), job(2, gpus=1), job(3, gpus=1, mem_gib=10)], inventory
    )
    assert starts == {2: (0,), 3: (1,)}
    assert reasons == {1: "needs 2 whole GPUs; 1 free (GPU 0)"}


def test_cpu_jobs_always_start():
    starts, reasons = place([job(1, gpus=0), job(2, gpus=1)], box(gpu(0, used_gib=79, util=100)))
    assert starts == {1: ()}
    assert set(reasons) == {2}


# -- which GPUs ----------------------------------------------------------------------------
def test_gpu_zero_is_last_on_a_tie():
    inventory = box(gpu(0), gpu(1), gpu(2), gpu(3))
    assert place([job(1)], inventory)[0] == {1: (3,)}
    assert place([job(1, mem_gib=20)], inventory)[0] == {1: (3,)}
    # The tie picks GPUs 3 and 2; the job has them in index order (its cuda:0 is GPU 2).
    assert place([job(1, gpus=2)], inventory)[0] == {1: (2, 3)}
    assert place([job(1, gpus=4, mem_gib=1)], inventory)[0] == {1: (0, 1, 2, 3)}


def test_best_fit_packs_the_fullest_gpu_that_still_fits():
    inventory = box(gpu(0, used_gib=50), gpu(1, used_gib=30), gpu(2), gpu(3, used_gib=70))
    # GPU 0 has 30 GiB free, the least that covers 20 GiB + headroom; GPU 3 has too little.
    assert place([job(1, mem_gib=20)], inventory)[0] == {1: (0,)}
    assert place([job(1, mem_gib=40)], inventory)[0] == {1: (1,)}


def test_sharing_jobs_fill_a_gpu_as_far_as_memory_goes():
    starts, reasons = place([job(i, mem_gib=30) for i in range(1, 5)], box(gpu(0)))
    assert starts == {1: (0,), 2: (0,)}
    assert reasons == {
        3: "needs 1 GPU with 30.0 GiB free; most free is GPU 0 with 20.0 GiB",
        4: "behind job 3, which is next in line; needs 1 GPU with 30.0 GiB "
        "free; most free is GPU 0 with 20.0 GiB",
    }


def test_six_50g_jobs_on_four_80g_gpus():
    starts, reasons = place(
        [job(i, mem_gib=50) for i in range(1, 7)], box(gpu(0), gpu(1), gpu(2), gpu(3))
    )
    assert sorted(starts.values()) == [(0,), (1,), (2,), (3,)]
    assert set(reasons) == {5, 6}
    assert reasons[5] == "needs 1 GPU with 50.0 GiB free; most free is GPU 0 with 30.0 GiB"


def test_headroom_is_kept():
    # 79.5 GiB free: a 79 GiB job would leave less than 512 MiB.
    assert place([job(1, mem_gib=79.25)], box(gpu(0, used_gib=0.5)))[0] == {}
    assert place([job(1, mem_gib=79)], box(gpu(0, used_gib=0.5)))[0] == {1: (0,)}
    tight = PlacementRules(mem_headroom_bytes=0)
    assert place([job(1, mem_gib=79.5)], box(gpu(0, used_gib=0.5)), rules=tight)[0] == {1: (0,)}


def test_outside_memory_keeps_a_job_off_a_gpu():
    inventory = box(gpu(0, used_gib=70), gpu(1, used_gib=70))
    starts, reasons = place([job(1, mem_gib=20)], inventory)
    assert starts == {}
    assert reasons == {1: "needs 1 GPU with 20.0 GiB free; most free is GPU 0 with 10.0 GiB"}
    assert place([job(1, mem_gib=20)], box(gpu(0, used_gib=70), gpu(1, used_gib=79)))[0] == {}


def test_busy_and_unhealthy_gpus_take_nothing():
    inventory = box(gpu(0, util=95), gpu(1, healthy=False), gpu(2, util=89))
    assert place([job(1, mem_gib=10), job(2, mem_gib=10)], inventory)[0] == {1: (2,), 2: (2,)}
    starts, reasons = place([job(1, mem_gib=10)], box(gpu(0, util=95), gpu(1, healthy=False)))
    assert starts == {}
    assert reasons[1] == (
        "needs 1 GPU with 10.0 GiB free; most free is GPU 0 with 80.0 GiB, but it is 95% busy"
    )
    (reason,) = place([job(1)], box(gpu(0, healthy=False)))[1].values()
    assert reason == "needs 1 whole GPU; every allowed GPU is unhealthy"


def test_utilization_limit_is_a_setting():
    inventory = box(gpu(0, util=60))
    assert place([job(1, mem_gib=1)], inventory)[0] == {1: (0,)}
    assert place([job(1, mem_gib=1)], inventory, rules=PlacementRules(max_util_pct=50))[0] == {}


def test_unknown_readings_do_not_crash():
    # N/A memory and utilization: only our own promises count.
    inventory = box(gpu(0, used_gib=None, util=None))
    running = [running_on(job(1, mem_gib=60), 0)]
    starts, reasons = place([job(2, mem_gib=30), job(3, mem_gib=10)], inventory, running)
    assert starts == {3: (0,)}
    assert reasons[2].startswith("needs 1 GPU with 30.0 GiB free; most free is GPU 0 with 20.0 GiB")


# -- whole GPUs ----------------------------------------------------------------------------
def test_exclusive_jobs_never_share():
    starts, reasons = place([job(1), job(2)], box(gpu(0)))
    assert starts == {1: (0,)}
    assert set(reasons) == {2} and "held whole" in reasons[2]


def test_exclusive_job_waits_for_a_gpu_that_a_sharing_job_uses():
    running = [running_on(job(1, mem_gib=1), 0)]
    assert place([job(2)], box(gpu(0)), running)[0] == {}
    # ... and sharing jobs stay off a GPU held whole.
    running = [running_on(job(1), 0)]
    assert place([job(2, mem_gib=1)], box(gpu(0)), running)[0] == {}


def test_exclusive_job_wants_an_idle_gpu():
    inventory = box(gpu(0, used_gib=2), gpu(1, used_gib=0.5))
    assert place([job(1), job(2)], inventory)[0] == {1: (1,)}
    loose = PlacementRules(exclusive_idle_mem_bytes=4 * GiB)
    # Both qualify now; best fit takes the fuller one first.
    assert place([job(1), job(2)], inventory, rules=loose)[0] == {1: (0,), 2: (1,)}


# -- gangs ---------------------------------------------------------------------------------
def test_multi_gpu_job_gets_all_or_nothing():
    inventory = box(gpu(0, used_gib=70), gpu(1), gpu(2, used_gib=75))
    starts, reasons = place([job(1, gpus=2, mem_gib=20)], inventory)
    assert starts == {}
    assert reasons == {1: "needs 2 GPUs with 20.0 GiB free each; only 1 has it (GPU 1)"}
    starts, _ = place([job(1, gpus=2, mem_gib=5)], inventory)
    assert starts == {1: (0, 1)}  # GPU 2's 5 GiB do not cover 5 GiB plus headroom
    starts, _ = place([job(1, gpus=2, mem_gib=4)], inventory)
    assert starts == {1: (0, 2)}  # best fit: the two fullest GPUs that fit


def test_a_gang_takes_distinct_gpus():
    starts, _ = place([job(1, gpus=3, mem_gib=10)], box(gpu(0), gpu(1), gpu(2)))
    assert sorted(starts[1]) == [0, 1, 2]


# -- promised memory -----------------------------------------------------------------------
def test_memory_promised_to_a_starting_job_counts_before_it_allocates():
    # NVML still shows the GPU empty, but the job placed a second ago will take 50 GiB.
    running = [running_on(job(1, mem_gib=50), 0)]
    loads = gpu_loads(box(gpu(0)), running, {})
    assert loads["GPU-0"].promised_bytes == 50 * GiB
    assert loads["GPU-0"].effective_free_bytes == 30 * GiB
    assert place([job(2, mem_gib=40)], box(gpu(0)), running)[0] == {}


def test_memory_a_job_allocated_is_not_counted_twice():
    proc = GpuProcess(pid=4242, gpu_uuid="GPU-0", used_mem_bytes=30 * GiB)
    inventory = box(gpu(0, used_gib=30, processes=(proc,)))
    running = [running_on(job(1, mem_gib=50), 0)]
    loads = gpu_loads(inventory, running, {4242: 1})
    assert loads["GPU-0"].promised_bytes == 20 * GiB
    assert loads["GPU-0"].ours_used_bytes == 30 * GiB
    assert loads["GPU-0"].outside_used_bytes == 0
    assert loads["GPU-0"].effective_free_bytes == 30 * GiB
    assert place([job(2, mem_gib=29)], inventory, running, {4242: 1})[0] == {2: (0,)}


def test_outside_process_is_not_ours():
    proc = GpuProcess(pid=99, gpu_uuid="GPU-0", used_mem_bytes=5 * GiB)
    loads = gpu_loads(box(gpu(0, used_gib=5, processes=(proc,))), [], {})
    assert loads["GPU-0"].outside_used_bytes == 5 * GiB
    assert loads["GPU-0"].promised_bytes == 0


# -- MIG -----------------------------------------------------------------------------------
def test_mig_devices_are_given_out_one_job_each():
    migs = tuple(
        replace(gpu(10 + i, total_gib=10), uuid=f"MIG-{i}", parent_index=0, gpu_instance_id=i)
        for i in range(2)
    )
    inventory = box(replace(gpu(0), mig_devices=migs))
    loads = gpu_loads(inventory, [], {})
    assert set(loads) == {"MIG-0", "MIG-1"}  # the parent itself is never given out
    result = plan([job(i, mem_gib=1) for i in (1, 2, 3)], loads, inventory, RULES)
    assert sorted(g.uuid for _, gpus in result.starts for g in gpus) == ["MIG-0", "MIG-1"]
    assert set(result.reasons) == {3}


# -- reasons and impossible requests -------------------------------------------------------
def test_reason_when_there_are_no_gpus():
    assert place([job(1)], Inventory(problem="NVML is not installed"))[1] == {
        1: "NVML is not installed"
    }
    assert place([job(1)], Inventory())[1] == {1: "no GPUs are available to gpusched"}


@pytest.mark.parametrize(
    "request_, reason",
    [
        (Request(5), "asks for 5 GPUs; this box has 4 ("),
        (
            Request(1, 100 * GiB),
            "asks for 100.0 GiB on each of 1 GPU(s); the largest here have 80.0 GiB",
        ),
        (
            Request(2, 50 * GiB),
            "asks for 50.0 GiB on each of 2 GPU(s); the largest here have 40.0 GiB",
        ),
        (Request(0), None),
        (Request(4), None),
        (Request(1, 80 * GiB), None),
        (Request(1, 41 * GiB), None),
    ],
)
def test_impossible_requests(request_, reason):
    inventory = box(
        gpu(0, total_gib=80), gpu(1, total_gib=40), gpu(2, total_gib=40), gpu(3, total_gib=16)
    )
    found = impossible_reason(request_, inventory)
    assert found == reason or (
        reason is not None and reason.endswith("(") and found.startswith(reason)
    )


def test_nothing_is_impossible_before_the_gpus_were_read():
    assert impossible_reason(Request(64), Inventory()) is None


# -- properties ----------------------------------------------------------------------------
gpus_st = st.lists(
    st.builds(
        lambda total, used_frac, util, healthy: (total, used_frac, util, healthy),
        st.sampled_from([16, 40, 80]),
        st.floats(0, 1),
        st.sampled_from([0.0, 30.0, 95.0]),
        st.booleans().map(lambda b: b or True) | st.just(False),
    ),
    min_size=1,
    max_size=6,
)
requests_st = st.lists(
    st.tuples(st.integers(0, 3), st.none() | st.integers(1, 90), st.integers(-2, 2)),
    min_size=0,
    max_size=12,
)


def _inventory(spec) -> Inventory:
    return box(
        *(
            gpu(i, total_gib=t, used_gib=round(t * f, 2), util=u, healthy=h)
            for i, (t, f, u, h) in enumerate(spec)
        )
    )


def _declared(j: Job, g: GpuInfo) -> int:
    return g.mem_total_bytes if j.request.gpu_mem_bytes is None else j.request.gpu_mem_bytes


@settings(max_examples=300, deadline=None)
@given(gpus_st, requests_st, st.integers(0, 12))
def test_placement_invariants(gpu_spec, requests, split):
    inventory = _inventory(gpu_spec)
    by_uuid = {g.uuid: g for g in inventory.gpus}
    pending = [job(i + 1, gpus=n, mem_gib=m, priority=p) for i, (n, m, p) in enumerate(requests)]
    running: list[Job] = []
    # Two rounds, so the second plans around the promises of jobs the first one started.
    for batch in (pending[:split], pending[split:]):
        loads = gpu_loads(inventory, running, {})
        result = plan(batch, loads, inventory, RULES, running)
        started = dict(result.starts)
        assert set(started) | set(result.reasons) == {j.id for j in batch}
        assert not set(started) & set(result.reasons)
        assert all(result.reasons.values())  # every waiting job says why
        for j in batch:
            if j.id not in started:
                continue
            chosen = started[j.id]
            # All or nothing, on distinct, healthy GPUs that were not too busy.
            assert len(chosen) == j.request.gpus == len({g.uuid for g in chosen})
            assert all(g.is_healthy and (g.util_pct or 0) < RULES.max_util_pct for g in chosen)
            running.append(running_on(j, *(g.index for g in chosen)))
        # Skip-ahead is maximal: whatever still waits cannot fit in what is left.
        left = gpu_loads(inventory, running, {})
        for j in batch:
            if j.id in result.reasons:
                assert choose_gpus(j.request, left, RULES) is None
        # Among jobs asking for the same thing, the earlier in order never waits for a later one.
        order = job_order(batch)
        for a_pos, a in enumerate(order):
            for b in order[a_pos + 1 :]:
                if a.request == b.request and b.id in started:
                    assert a.id in started
    on_gpu: dict[str, list[Job]] = {}
    for j in running:
        for uuid in j.gpu_uuids:
            on_gpu.setdefault(uuid, []).append(j)
    for uuid, jobs in on_gpu.items():
        g = by_uuid[uuid]
        if any(j.request.is_exclusive for j in jobs):
            # A whole-GPU job is alone on a GPU that others left (almost) idle.
            assert len(jobs) == 1
            assert g.mem_used_bytes <= RULES.exclusive_idle_mem_bytes
        else:
            # Never more memory promised than the GPU has, headroom included.
            promised = sum(_declared(j, g) for j in jobs)
            assert g.mem_used_bytes + promised + RULES.mem_headroom_bytes <= g.mem_total_bytes


@settings(max_examples=200, deadline=None)
@given(gpus_st, requests_st)
def test_planning_is_deterministic_and_order_independent(gpu_spec, requests):
    inventory = _inventory(gpu_spec)
    pending = [job(i + 1, gpus=n, mem_gib=m, priority=p) for i, (n, m, p) in enumerate(requests)]
    loads = gpu_loads(inventory, [], {})
    forward = plan(pending, loads, inventory, RULES)
    backward = plan(list(reversed(pending)), loads, inventory, RULES)
    assert dict(forward.starts) == dict(backward.starts)
    assert dict(forward.reasons) == dict(backward.reasons)


def test_a_jobs_observed_peak_counts_when_it_is_using_less_now():
    """Declared 10 GiB, seen at 50 GiB, using 20 GiB now: 30 GiB more may come back."""
    from gpusched.core.models import GpuInfo, GpuProcess, Inventory, Job, JobState, Request

    gpu = GpuInfo(
        index=0,
        uuid="GPU-a",
        name="g",
        mem_total_bytes=80 * GiB,
        mem_used_bytes=20 * GiB,
        util_pct=0.0,
        processes=(GpuProcess(pid=4242, gpu_uuid="GPU-a", used_mem_bytes=20 * GiB),),
    )
    running = Job(
        id=1,
        command=("x",),
        cwd="/",
        uid=0,
        user="u",
        state=JobState.RUNNING,
        request=Request(gpus=1, gpu_mem_bytes=10 * GiB),
        gpu_uuids=("GPU-a",),
        gpu_mem_peak_bytes=50 * GiB,
    )
    loads = gpu_loads(Inventory(gpus=(gpu,)), [running], {4242: 1})
    assert loads["GPU-a"].promised_bytes == 30 * GiB
    assert loads["GPU-a"].effective_free_bytes == 30 * GiB
