"""The loop's turns stay short while a big submit is stored (issue 23): its jobs are made
known to the scheduler in parts sized by the time the last part took, each turn's garbage
is collected as the turn ends, and what survives is left out of the collector's full scans
until most of those jobs have gone. The loop's real turns in process (tests/inproc.py), on
a clock the test moves for the work; and the reply, through the real CLI and daemon."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest

from conftest import Home
from gpusched.client.submit.fastsubmit import parse
from gpusched.client.submit.jobrequest import build_request
from gpusched.daemon.loop import Call
from gpusched.daemon.requests import batches
from gpusched.daemon.requests.request import Request
from inproc import ME


class Clock:
    """batches' clock, moved only by the jobs made known (per_job_s each)."""

    def __init__(self, per_job_s: float):
        self.now, self.per_job_s = 0.0, per_job_s

    def monotonic(self) -> float:
        return self.now


def submit_call(box, *argv: str) -> Call:
    opts = parse(list(argv))
    opts.cwd = str(box.root)
    return Call(Request("submit", build_request(opts), ME))


def streamed_call(box, count: int) -> Call:
    """A streamed submit of `count` distinct lines (a template each), as the server hands
    it to the loop."""
    args = {
        "jobs": [{"command": ["/bin/sh", "-c"], "hold": True, "gpus": 0}],
        "cwd": str(box.root),
        "env": {"PATH": "/bin"},
        "stream": "lines",
        "lines": [f"echo {i}" for i in range(count)],
    }
    return Call(Request("submit", args, ME))


def run_to_the_end(box, call: Call) -> int:
    """The loop's turns until the call is answered; how many."""
    calls, turns = [call], 0
    while not call.done.is_set():
        box.daemon.step(calls)
        calls, turns = [], turns + 1
    assert call.error is None, call.error
    return turns


def test_a_committed_submit_is_made_known_in_parts_that_fit_a_turn(box, monkeypatch):
    """A fixed 5,000 jobs a turn took 60 ms on a quiet machine and over 120 ms on a loaded
    one: each part is as many jobs as the last part's pace fits in TURN_BUDGET_S."""
    clock = Clock(per_job_s=0.0001)  # a slow machine: 5,000 jobs would take 500 ms
    monkeypatch.setattr(batches, "_monotonic", clock.monotonic)  # stored in one turn
    state = box.daemon.state
    parts: list[tuple[int, float]] = []  # (jobs, seconds each) of each part
    real = state.remember_alike

    def remember_alike(entries):
        entries = list(entries)
        parts.append((len(entries), clock.per_job_s))
        clock.now += len(entries) * clock.per_job_s
        if sum(n for n, _ in parts) > 8000:
            clock.per_job_s = 0.000002  # the machine is quiet again: parts grow back
        real(entries)

    monkeypatch.setattr(state, "remember_alike", remember_alike)
    count = 20_000
    call = submit_call(box, "--hold", "--array", f"0-{count - 1}", "--", "true")
    run_to_the_end(box, call)
    sizes = [n for n, _ in parts]
    assert sum(sizes) == count and len(call.result["ids"]) == count
    # Each part fits the budget at the pace of the part before it.
    assert all(
        n * pace <= batches.TURN_BUDGET_S * 1.01 for (n, _), (_, pace) in zip(parts[1:], parts)
    ), parts
    assert sizes[0] <= batches.KNOWN_FIRST, parts
    assert max(sizes) <= batches.KNOWN_PER_TURN
    slow = [n for n, pace in parts if pace == 0.0001]
    assert max(sizes) > 10 * max(slow[1:]), parts  # quicker parts, bigger parts


def test_each_turn_of_a_big_submit_collects_its_own_garbage_cycles(box, monkeypatch):
    """The collector is off during a big request's turns (a collection would walk all it
    made so far), yet a cycle dropped in one of its turns is gone when the turn ends:
    nothing garbage is frozen with the jobs."""
    store = box.daemon.state.store
    real, cycles = store.insert_alike, []

    class Node:
        pass

    def insert_alike(template, jobs):
        node = Node()
        node.me = node  # a cycle, dropped at once: only the collector frees it
        cycles.append(weakref.ref(node))
        real(template, jobs)

    monkeypatch.setattr(store, "insert_alike", insert_alike)
    call = streamed_call(box, 3 * batches.BIG_JOBS)
    calls, alive_after_turns = [call], []
    while not call.done.is_set():
        box.daemon.step(calls)
        calls = []
        alive_after_turns.append(sum(ref() is not None for ref in cycles))
    assert call.error is None, call.error
    assert cycles and not any(alive_after_turns), alive_after_turns


def test_a_big_submits_jobs_stay_out_of_full_collections_until_most_have_gone(box):
    """A full collection walked every one of 100,000 new jobs (over 100 ms of a turn, and
    again at each full scan after): they are frozen as they are made, and given back to
    the collector once the active jobs are down to a quarter, or a few thousand."""
    count = 3 * batches.BIG_JOBS
    call = streamed_call(box, count)  # a template (one tracked object) per line
    run_to_the_end(box, call)
    box.step()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= count  # the jobs are all there
    ids = call.result["ids"]
    keep = count // 5
    cancel = Call(Request("cancel", {"ids": [str(i) for i in ids[keep:]]}, ME))
    run_to_the_end(box, cancel)
    box.step()
    assert len(box.daemon.state.jobs) == keep
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    assert box.show(ids[0])["state"] == "pending"


@pytest.mark.parametrize("array", [False, True])
def test_a_big_submits_reply_reads_as_before(home: Home, tmp_path: Path, array: bool):
    """Ids of every job, and with --array each line's array: plain and --json output,
    exactly (the reply is built from the groups, not command by command)."""
    lines = 1500 if array else 3000
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("".join(f"echo {i}\n" for i in range(lines)))
    argv = [
        "--hold",
        "--gpus",
        "0",
        *(["--array", "0-1"] if array else []),
        "--from-file",
        str(sweep),
    ]
    out = home.run("submit", "--json", *argv).stdout
    first = json.loads(out)["ids"][0]
    ids = list(range(first, first + 3000))
    expected = {"ids": ids, **({"array_ids": ids[::2]} if array else {})}
    assert out == json.dumps(expected, indent=2) + "\n"
    plain = home.run("submit", *argv).stdout
    again = [i + 3000 for i in (ids[::2] if array else ids)]
    assert plain == "".join(f"{i}\n" for i in again)
