"""The daemon's decisions for singleton and aftercorr (tests/inproc.py: the real loop,
store and job control; fake shims; a clock the test moves)."""

from __future__ import annotations

from inproc import ME


def others(uid: int) -> tuple[int, int, int]:
    return (ME[0], uid, uid)


def test_a_singleton_array_runs_one_element_at_a_time_in_index_order(box):
    ids = box.submit_all("-J", "sweep", "-d", "singleton", "--array", "0-3", "--", "true")
    theirs = box.submit("-J", "sweep", "-d", "singleton", "--", "true", creds=others(4321))
    assert box.states(*ids) == ["running", "pending", "pending", "pending"]
    assert box.show(theirs)["state"] == "running"  # another user's name is their own
    assert box.show(ids[1])["pending_reason"] == (
        f"waiting for singleton (job {ids[0]}, also named 'sweep', is running)"
    )
    assert box.show(ids[3])["pending_reason"].startswith(f"waiting for singleton (job {ids[0]}")
    # A job of the name without singleton starts at once, and holds the next one back.
    plain = box.submit("-J", "sweep", "--", "true")
    assert box.show(plain)["state"] == "running"
    box.exit(ids[0], 3)  # any end will do
    assert box.states(*ids) == ["failed", "pending", "pending", "pending"]
    assert box.show(ids[1])["pending_reason"] == (
        f"waiting for singleton (job {plain}, also named 'sweep', is running)"
    )
    box.exit(plain)
    for n, job_id in enumerate(ids[1:], 1):
        assert box.states(*ids[n:]) == ["running"] + ["pending"] * (len(ids) - n - 1)
        box.exit(job_id)


def test_aftercorr_starts_each_element_after_its_partner(box):
    parents = box.submit_all("--array", "0-2", "--hold", "--", "true")
    children = box.submit_all("--array", "0-2", "-d", f"aftercorr:{parents[0]}", "--", "true")
    box.call("release", ids=[str(parents[0])])
    box.exit(parents[1])
    assert box.states(*children) == ["pending", "running", "pending"]
    box.exit(parents[0], 1)
    assert box.show(children[0])["pending_reason"] == (
        f"dependency aftercorr:{parents[0]} can never be met: element {parents[0]}_0 ended failed"
    )
    assert box.show(children[2])["pending_reason"] == f"waiting for aftercorr:{parents[0]}_2"
    box.exit(parents[2])
    assert box.states(*children) == ["pending", "running", "running"]
