"""GPU reservations, pure: the placement filter and the scheduling pass with a moving clock."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import test_bigpass
from gpusched.core.errors import UsageError
from gpusched.core.models import GpuInfo, Inventory, Job, JobState, Request
from gpusched.core.sched import placement, reservations, scheduling
from gpusched.core.sched.pendingqueue import PendingQueue
from gpusched.core.sched.queuerules import QueueRules
from gpusched.core.sched.reservations import Reservation
from gpusched.sim import simulator, traces

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
DEMO = Reservation("demo", (2, 3), ("alice",), T0 + 3600, T0 + 3 * 3600, "root", T0)
GPUS = tuple(
    GpuInfo(index=i, uuid=f"GPU-{i}", name="Sim", mem_total_bytes=80 << 30, mem_used_bytes=0)
    for i in range(4)
)


def job(job_id: int, gpus: int = 1, user: str = "bob", **fields) -> Job:
    return Job(
        id=job_id,
        command=("true",),
        cwd="/",
        uid=1000,
        user=user,
        request=Request(gpus=gpus),
        **fields,
    )


def plan(pending, now, running=(), reserved=None):
    inventory = Inventory(gpus=GPUS)
    rules = placement.PlacementRules()
    loads = placement.gpu_loads(inventory, list(running), {}, rules, {}, now)
    return scheduling.schedule(
        pending,
        list(running),
        loads,
        inventory,
        rules,
        QueueRules(),
        now,
        reserved={"demo": DEMO} if reserved is None else reserved,
    )


def started(p) -> dict[int, list[int]]:
    return {job_id: [g.index for g in gpus] for job_id, gpus in p.starts}


def test_a_job_without_time_stays_off_reserved_gpus_from_the_moment_they_are_reserved():
    closed = reservations.closed_gpus(job(1), {"demo": DEMO}, T0, range(4))
    assert set(closed) == {2, 3}
    assert reservations.closed_gpus(job(1), {"demo": DEMO}, DEMO.end, range(4)) == {}


@pytest.mark.parametrize(
    "time_limit_s, now, closed",
    [
        (1800.0, T0, set()),  # ends before the start
        (3600.0, T0, set()),  # ends at the start
        (3601.0, T0, {2, 3}),  # would still run then
        (1800.0, T0 + 1801, {2, 3}),  # later, the same job no longer fits before it
        (60.0, T0 + 3600, {2, 3}),  # inside the window
        (60.0, T0 + 3 * 3600, set()),  # after it
    ],
)
def test_its_time_limit_decides_as_the_clock_moves(time_limit_s, now, closed):
    j = job(1, time_limit_s=time_limit_s)
    assert set(reservations.closed_gpus(j, {"demo": DEMO}, now, range(4))) == closed


def test_a_job_in_the_reservation_waits_for_its_window_and_uses_only_its_gpus():
    mine = job(1, user="alice", reservation="demo")
    assert reservations.wait_reason(mine, {"demo": DEMO}, T0).startswith(
        "Reservation demo (starts at"
    )
    assert reservations.wait_reason(mine, {"demo": DEMO}, DEMO.start) == ""
    assert "ended or was deleted" in reservations.wait_reason(mine, {"demo": DEMO}, DEMO.end)
    assert "ended or was deleted" in reservations.wait_reason(mine, {}, T0)
    assert set(reservations.closed_gpus(mine, {"demo": DEMO}, DEMO.start, range(4))) == {0, 1}


def test_the_pass_places_others_beside_the_reservation_and_says_why_they_wait():
    p = plan([job(1, gpus=2), job(2, gpus=2), job(3, gpus=1, time_limit_s=600)], T0)
    got = started(p)
    assert got[1] == [0, 1] and got[3][0] in (2, 3)  # a short one may use a reserved GPU till then
    assert 2 not in got
    assert p.reasons[2].startswith("GPUs 2,3 are reserved from ")
    assert "(reservation demo; no --time)" in p.reasons[2]


def test_inside_the_window_only_its_users_jobs_run_there():
    now = DEMO.start + 60
    p = plan(
        [job(1, gpus=2), job(2, gpus=2), job(3, gpus=2, user="alice", reservation="demo")], now
    )
    assert started(p) == {1: [0, 1], 3: [2, 3]}
    assert "reservation demo, until" in p.reasons[2]
    before = plan([job(3, gpus=2, user="alice", reservation="demo")], T0)
    assert before.starts == () and before.reasons[3].startswith("Reservation demo (starts at")


def test_preemptible_jobs_on_its_gpus_are_named_once_it_starts():
    on_it = job(1, preemptible=True, state=JobState.RUNNING, gpu_indices=(3,))
    not_preemptible = job(2, state=JobState.RUNNING, gpu_indices=(2,))
    elsewhere = job(3, preemptible=True, state=JobState.RUNNING, gpu_indices=(0,))
    running = [on_it, not_preemptible, elsewhere]
    assert reservations.preempt_for(running, {"demo": DEMO}, T0) == []
    assert reservations.preempt_for(running, {"demo": DEMO}, DEMO.start) == [(on_it, DEMO)]


def test_clashes_and_names():
    later = Reservation("later", (3,), ("bob",), DEMO.end, DEMO.end + 60)
    overlapping = Reservation("x", (0, 3), ("bob",), DEMO.start - 60, DEMO.start + 60)
    assert reservations.clash(later, [DEMO]) is None
    assert reservations.clash(overlapping, [DEMO, later]) == DEMO
    with pytest.raises(UsageError):
        reservations.check_name("-x")
    assert reservations.from_dict(reservations.to_dict(DEMO)) == DEMO


def test_top_marks_reserved_gpus_with_the_reservation_now_or_next():
    from test_tui import NOW, frame

    reserved = (("demo", (0,), NOW - 60, NOW + 3600), ("later", (1,), NOW + 7200, NOW + 9000))
    text = frame(120, gpu_reservations=reserved)
    gpu_rows = [line for line in text.splitlines() if " ok" in line]
    assert "ok [demo]" in gpu_rows[0]
    assert f"ok [later {time.strftime('%H:%M', time.gmtime(NOW + 7200))}]" in text  # UTC frame
    assert "[demo" not in frame(120)


# -- the simulator: the same filter, in the trace's time -------------------------------------
def test_simulate_keeps_trace_jobs_off_a_reserved_gpu_through_the_window(tmp_path):
    from test_simulator import history

    calendar = tmp_path / "calendar.toml"
    calendar.write_text(
        '[[reservation]]\nname = "demo"\ngpus = [1]\nstart = "1h"\nduration = "2h"\n'
    )
    reserved = traces.load_reservations(calendar)
    assert [(r.name, r.gpus, r.start, r.end) for r in reserved] == [("demo", (1,), 3600, 3 * 3600)]
    rows = [("short", "u", 0, 1, 1800), ("long", "u", 0, 1, 7200), ("late", "v", 1, 1, 600)]
    rows.append(("after", "v", 1, 1, 7200))
    jobs = traces.load_trace(history(tmp_path, rows)).jobs
    free = {r.job_id: r for r in simulator.simulate(jobs, gpus=2, discipline="fifo")}
    assert (free["late"].start_s, free["after"].start_s) == (1800, 2400)  # no reservation
    got = {
        r.job_id: r for r in simulator.simulate(jobs, gpus=2, discipline="fifo", reserved=reserved)
    }
    # short fits before the start on either GPU; long runs past it, so only on GPU 0
    assert got["long"].gpu_indices == (0,) and got["short"].gpu_indices == (1,)
    assert got["late"].start_s == 1800 and got["late"].gpu_indices == (1,)  # ends by 1h
    assert (got["after"].start_s, got["after"].gpu_indices) == (7200, (0,))  # long's GPU
    bad = tmp_path / "bad.toml"
    bad.write_text('[[reservation]]\nname = "x"\ngpus = [0]\n')
    with pytest.raises(UsageError, match="needs a start and a duration"):
        traces.load_reservations(bad)
    with pytest.raises(UsageError, match="holds GPU 1; the simulated box has GPUs 0-0"):
        simulator.simulate(jobs, gpus=1, reserved=reserved)


# -- a bounded pass (pendingqueue's lines) decides as the whole walk does ----------------------
@test_bigpass.SETTINGS
@given(
    queue=test_bigpass.jobs(),
    limits=st.lists(st.sampled_from([None, None, 600.0, 7200.0]), min_size=40, max_size=40),
    inside=st.lists(st.sampled_from(["", "", "", "demo"]), min_size=40, max_size=40),
    starts_in=st.sampled_from([-60.0, 1800.0, 3600.0]),
    busy=st.lists(st.integers(0, 3), max_size=3),
)
def test_a_bounded_pass_keeps_jobs_off_reserved_gpus_as_the_whole_walk_does(
    queue, limits, inside, starts_in, busy
):
    now = test_bigpass.NOW_S
    demo = Reservation("demo", (2, 3), ("ann", "bob"), now + starts_in, now + 3 * 3600)
    reserved = {"demo": demo, "later": replace(demo, name="later", gpus=(0,), start=now + 7200)}
    pending = [
        replace(job, time_limit_s=limit, reservation=name)
        for job, limit, name in zip(queue, limits, inside)
    ]
    full = both_ways(pending, busy, reserved)
    for job_id, gpus in full.starts:
        job = next(j for j in pending if j.id == job_id)
        closed = reservations.closed_gpus(job, reserved, now, range(4))
        assert not closed.keys() & {g.index for g in gpus}


def both_ways(pending, busy, reserved):
    """The whole walk's plan, checked against the bounded pass's decisions."""
    now = test_bigpass.NOW_S
    inventory = test_bigpass.box(4)
    running = test_bigpass.running_jobs(busy, inventory)
    rules = placement.PlacementRules(policy="pack")
    loads = placement.gpu_loads(inventory, running, {}, rules)
    deps = scheduling.DependencyStates({1: JobState.RUNNING})
    deps.same_name.update(test_bigpass.lowest_by_name((j.id, j) for j in [*pending, *running]))
    queue = QueueRules()
    args = (running, loads, inventory, rules, queue, now, deps)
    full = scheduling.schedule(pending, *args, reserved=reserved)
    line = PendingQueue(queue.discipline, per_user=True)
    line.add_many(pending)
    ordered = line.jobs({job.id: job for job in pending})
    bounded = scheduling.schedule(ordered, *args, reserved=reserved, line=line)
    test_bigpass.assert_same_decisions(full, bounded, pending)
    return full


def test_a_job_without_time_kept_off_does_not_block_a_short_one_of_its_kind():
    now = test_bigpass.NOW_S
    demo = Reservation("demo", (2, 3), ("ann",), now + 1800, now + 3600)
    pending = [replace(job(1), submitted_at=0.0), replace(job(2), time_limit_s=600.0)]
    full = both_ways(pending, [0, 1], {"demo": demo})
    assert [job_id for job_id, _ in full.starts] == [2]
