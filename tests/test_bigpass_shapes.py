"""A pass skips a refused shape wholesale (issue 23): the pending queue keeps a line per shape,
so the jobs of a shape refused for the rest of a pass cost nothing however many they are. The
decisions, and the reasons asked for later, are the whole walk's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.models import Job, Request
from gpusched.core.sched import placement, queuerules, scheduling
from gpusched.core.sched.pendingqueue import PendingQueue
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import HostCapacity, QueueRules
from inproc import Box
from test_bigpass import (
    GIB,
    LINED,
    NOW_S,
    SETTINGS,
    assert_same_decisions,
    both_passes,
    box,
    default_quota,
    jobs,
    reasons_of,
    running_jobs,
    sweep,
)


def veto_after_odd_placements(request, loads, ctx):
    """A custom policy that says no while an odd number of jobs have been placed: its
    answer changes as a pass starts jobs, so its refusals are never taken as final."""
    return (
        [] if sum(ctx.placements.values()) % 2 else sorted(loads, key=lambda load: load.gpu.index)
    )


CUSTOM = PlacementRules(policy="pack", custom_policies={"odd": veto_after_odd_placements})


@st.composite
def big_head_queues(draw) -> list[Job]:
    """Big jobs at the head (some held, some of another size or policy), then a queue of
    many shapes; with ids shuffled or not, so that the shapes interleave."""
    head = [
        Job(
            id=n + 1,
            command=("true",),
            cwd="/",
            uid=1000,
            user=draw(st.sampled_from(["ann", "bob"])),
            request=Request(
                gpus=draw(st.sampled_from([3, 4, 4])), cpus=draw(st.sampled_from([1, 2]))
            ),
            held=draw(st.sampled_from([False] * 5 + [True])),
            policy=draw(st.sampled_from(["", "", "odd"])),
            submitted_at=0.0,
            time_limit_s=draw(st.sampled_from([None, 60.0, 7200.0])),
        )
        for n in range(draw(st.integers(1, 30)))
    ]
    tail = [
        replace(job, policy=draw(st.sampled_from(["", "", "", "odd"])))
        for job in draw(jobs(first_id=len(head) + 1))
    ]
    queue = head + tail
    if draw(st.booleans()):
        ids = draw(st.permutations([job.id for job in queue]))
        queue = [replace(job, id=new_id) for job, new_id in zip(queue, ids)]
    return queue


@SETTINGS
@given(
    pending=big_head_queues(),
    busy=st.lists(st.integers(0, 3), max_size=4),
    max_running=st.sampled_from([None, 2, 6]),
    discipline=st.sampled_from(LINED),
    per_user=st.sampled_from([(None, None), (2, None), (None, 3)]),
)
def test_skipping_refused_shapes_starts_what_the_whole_walk_starts(
    pending, busy, max_running, discipline, per_user
):
    inventory = box(4)
    queue = QueueRules(
        discipline=discipline,
        quotas=default_quota(per_user),
        host=HostCapacity(cpus=8, mem_bytes=64 * GIB, max_running=max_running),
    )
    usage = {"ann": 50.0, "bob": 5.0}
    full, bounded = both_passes(
        pending, running_jobs(busy, inventory), inventory, queue, usage, rules=CUSTOM
    )
    assert_same_decisions(full, bounded, pending)


class CountingTable(dict):
    """A pass's table of pending jobs (id -> job) that counts the jobs read from it."""

    reads = 0

    def __getitem__(self, job_id: int) -> Job:
        self.reads += 1
        return super().__getitem__(job_id)


def touched_by_a_pass(pending: list[Job], inventory, running, explain: bool):
    """A bounded pass over the pending jobs, and how many of them it read."""
    rules = PlacementRules(policy="pack")
    loads = placement.gpu_loads(inventory, running, {}, rules)
    line = PendingQueue("fifo")
    line.add_many(pending)
    table = CountingTable((job.id, job) for job in pending)
    plan = scheduling.schedule(
        line.jobs(table),
        running,
        loads,
        inventory,
        rules,
        QueueRules(),
        NOW_S,
        {},
        explain=explain,
        line=line,
    )
    return plan, table.reads, len(line.shapes)


def test_a_pass_reads_one_of_50000_refused_big_jobs_at_the_head():
    # The simulator's queue: big jobs pile up at the head while small ones start behind
    # them. Two GPUs of four are busy: the first big job is refused, the 49,999 others of
    # its shape are passed over unread, two small ones start and the third is refused.
    inventory = box(4)
    running = running_jobs([0, 1], inventory)
    pending = sweep(50_000, first_id=10, gpus=4) + sweep(50_000, first_id=60_000, gpus=1)
    for explain in (False, True):
        plan, reads, shapes = touched_by_a_pass(pending, inventory, running, explain)
        assert [job_id for job_id, _ in plan.starts] == [60_000, 60_001]
        assert reads <= shapes + len(plan.starts) == 4


def test_a_pass_over_interleaved_shapes_reads_a_few_jobs_of_each():
    # 100,000 jobs of three sizes submitted in turn, 100 apiece (a grid of sweeps): what a
    # pass reads is bounded by the shapes and the starts, not by the queue.
    inventory = box(4)
    running = running_jobs([0], inventory)
    sizes = [4, 2, 1]
    pending = [
        replace(job, request=Request(gpus=sizes[(job.id // 100) % 3]))
        for job in sweep(100_000, first_id=1)
    ]
    plan, reads, shapes = touched_by_a_pass(pending, inventory, running, explain=True)
    full = scheduling.schedule(
        pending,
        running,
        placement.gpu_loads(inventory, running, {}, PlacementRules()),
        inventory,
        PlacementRules(policy="pack"),
        QueueRules(),
        NOW_S,
        {},
    )
    assert plan.starts == full.starts
    assert reads <= shapes + len(plan.starts)
    assert reasons_of(plan, pending[-10:]) == {
        job.id: full.reasons[job.id] for job in pending[-10:]
    }


def test_a_skipped_job_is_explained_with_the_gpus_free_at_its_place_in_line():
    # A and B want 4 GPUs of which 2 are free; C takes one of them; D wants 4 too. The
    # whole walk tells B "2 free" (before C started) and D "1 free": a reason worked out
    # later for B, whom the pass skipped, must say the same.
    inventory = box(4)
    running = running_jobs([0, 1], inventory)
    pending = [
        *sweep(2, first_id=1, gpus=4),
        *sweep(1, first_id=3, gpus=1),
        *sweep(1, first_id=4, gpus=4),
    ]
    full, bounded = both_passes(pending, running, inventory, QueueRules())
    assert [job_id for job_id, _ in bounded.starts] == [3]
    assert bounded.considered == 2  # A and C: B and D are of A's shape
    why = reasons_of(bounded, [pending[1], pending[3]])
    assert why == {2: full.reasons[2], 4: full.reasons[4]}
    assert "2 free" in why[2] and "1 free" in why[4]


@SETTINGS
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "add_many", "remove"]),
            st.integers(1, 60),
            st.sampled_from([0, 0, 3]),
            st.sampled_from([0, 1, 2]),
            st.sampled_from(["ann", "bob"]),
        ),
        max_size=80,
    ),
    discipline=st.sampled_from(LINED),
)
def test_the_lines_stay_in_scheduling_order_as_jobs_come_and_go(ops, discipline):
    # Jobs leave mostly from the head of their line (which only moves a start mark);
    # whatever the order of adds and removes, the merge reads the queue in order_key's order.
    line, table = PendingQueue(discipline), {}
    queue = QueueRules(discipline=discipline)
    usage = {"ann": 3.0}
    for op, job_id, priority, gpus, user in ops:
        job = Job(
            id=job_id,
            command=("true",),
            cwd="/",
            uid=1000,
            user=user,
            priority=priority,
            request=Request(gpus=gpus),
            time_limit_s=float(job_id % 7 * 60) or None,
        )
        if op == "remove" or job_id in table:
            head = min(
                table, key=lambda i: queuerules.order_key(table[i], queue, usage), default=None
            )
            if head is not None:  # the head of the queue leaves, as a start takes it
                line.remove(table.pop(head if op == "remove" else job_id))
            continue
        (line.add if op == "add" else lambda j: line.add_many([j]))(job)
        table[job_id] = job
        want = [j.id for j in queuerules.queue_order(list(table.values()), queue, usage)]
        assert [j.id for j in line.jobs(table, queuerules.fair_share(queue, usage))] == want
        assert len(line) == len(table) == sum(line.shapes.values())
        assert len(line._numbers) == len(line.shapes)  # no number kept for a shape gone


def test_the_daemon_explains_the_big_jobs_it_skipped(tmp_path: Path):
    # In the daemon: four-GPU jobs behind a two-GPU one that runs, then small jobs.
    box_ = Box(tmp_path)
    hog = box_.submit_all("--gpus", "2", "--", "sleep", "1000")[0]
    assert box_.running() == {hog}
    box_.call("drain")
    big = box_.submit_all("--gpus", "4", "--from-file", "-", stdin="true\n" * 30)
    small = box_.submit_all("--gpus", "1", "--from-file", "-", stdin="true\n" * 3)
    box_.call("resume")
    box_.step()
    assert box_.running() == {hog, *small[:2]}
    # One reply, so that every row comes from the same pass (a later one writes anew).
    rows = {row["id"]: row for row in box_.call("list")["jobs"]}
    first = rows[big[0]]["pending_reason"]
    assert first.startswith("needs 4 whole GPUs")
    # Skipped, each explained as the whole walk would: behind the first, with the GPUs that
    # were free when the walk came to it.
    for job_id in (big[1], big[-1]):
        assert (
            rows[job_id]["pending_reason"] == f"behind job {big[0]}, which is next in line; {first}"
        )


def test_ls_shows_a_skipped_job_behind_the_first_big_one(home):
    # Through the real CLI and daemon: big jobs queued behind a running one, a small one
    # after them that starts, and `ls` giving every big job the reason of its place.
    hog = home.submit("--gpus", "2", "--", "sleep", "300")
    home.wait_state(hog, "running")
    home.run("drain")
    big = [home.submit("--gpus", "4", "--", "true") for _ in range(3)]
    small = home.submit("--gpus", "1", "--", "sleep", "300")
    home.run("resume")
    home.wait_state(small, "running")
    rows = {row["id"]: row for row in home.json("ls")}
    first = rows[big[0]]["pending_reason"]
    assert first.startswith("needs 4 whole GPUs")
    for job_id in big[1:]:
        assert (
            rows[job_id]["pending_reason"] == f"behind job {big[0]}, which is next in line; {first}"
        )
    home.run("cancel", str(hog), str(small))
