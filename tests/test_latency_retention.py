"""Retention's sweep with a long active queue (issue 23): a turn looks at a bounded number
of active jobs (not all of them, every turn), and a job that becomes active during the
sweep still keeps the finished jobs it needs. The loop's real turns, in process."""

from __future__ import annotations

import pytest

from gpusched.core.spec import syntax
from gpusched.daemon.jobs import retention
from gpusched.daemon.loop import Call
from gpusched.daemon.requests.request import Request
from inproc import ME

HOUR_S = 3600.0
CHUNK = 200  # active jobs a turn may look at, made small so that a small queue shows it
ACTIVE = 5 * CHUNK


@pytest.fixture
def looks(monkeypatch) -> list[int]:
    """One entry per active job a sweep looks at (its dependencies read), this turn."""
    counted: list[int] = []
    real = syntax.dependency_job_ids

    def counting(deps):
        counted.append(1)
        return real(deps)

    monkeypatch.setattr(retention, "dependency_job_ids", counting, raising=False)
    try:
        from gpusched.daemon.jobs import stillneeded
    except ImportError:  # before the index: retention looked at every job itself
        pass
    else:
        monkeypatch.setattr(stillneeded, "dependency_job_ids", counting)
        monkeypatch.setattr(stillneeded, "CHUNK_JOBS", CHUNK)
    return counted


def ended(box, count: int) -> list[int]:
    """An array of `count` held elements, cancelled: finished, and soon old."""
    ids = box.submit_all("--hold", "--array", f"0-{count - 1}", "--", "true")
    box.call("cancel", ids=[ids[0]])
    return ids


def distinct_active(box) -> None:
    """ACTIVE held jobs, each its own (a sweep of alike jobs shares one template, which a
    sweep looks at once: daemon/jobs/jobtable.py)."""
    lines = box.root / "distinct.txt"
    lines.write_text("".join(f"true {i}\n" for i in range(ACTIVE)))
    box.submit_all("--hold", "--from-file", str(lines))


def gc_turns(box, looks: list[int], before_each=None) -> tuple[dict, list[int]]:
    """`gc` turn by turn: its report, and the active jobs it looked at each turn."""
    gc = Call(Request("gc", {}, ME))
    per_turn, calls = [], [gc]
    while not gc.done.is_set():
        looks.clear()
        if before_each is not None:
            before_each(sum(per_turn))
        box.daemon.step(calls)
        per_turn.append(len(looks))
        calls = []
    assert gc.error is None, gc.error
    return gc.result, per_turn


def test_a_sweep_turn_looks_at_a_bounded_number_of_active_jobs(make_box, looks):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\n')
    old = ended(box, 50)
    distinct_active(box)
    box.clock.now += 2 * HOUR_S  # the monotonic clock stays: no sweep of the daemon's own
    report, per_turn = gc_turns(box, looks)
    assert report["jobs"] == len(old)
    assert max(per_turn) <= CHUNK, per_turn
    assert sum(per_turn) >= ACTIVE  # every active job was looked at, once


def test_a_job_queued_during_a_sweep_keeps_the_finished_job_it_depends_on(make_box, looks):
    box = make_box(config='[jobs]\nkeep_finished = "1h"\n')
    needed = ended(box, 3)
    distinct_active(box)
    box.clock.now += 2 * HOUR_S
    queued: list[int] = []

    def submit_once(looked_at: int) -> None:
        if not queued and looked_at:  # the sweep has begun looking, not finished
            queued.append(
                box.submit("--hold", "--dependency", f"afterok:{needed[1]}", "--", "true")
            )

    report, _ = gc_turns(box, looks, submit_once)
    assert queued, "the sweep was over in one turn"
    assert report["kept_for_dependents"] >= 1
    assert box.show(needed[1])["state"] == "cancelled"  # still there
