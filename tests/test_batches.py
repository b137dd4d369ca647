"""Big submits and cancels done a batch per turn of the loop (issue 14, point 3): other
requests are answered between batches, ids are contiguous, and nothing of a submit cut
short by a crash is ever run. The loop's real turns, in process (tests/inproc.py)."""

from __future__ import annotations

import pytest

from conftest import Home
from gpusched.client.protocol import check_request
from gpusched.daemon.loop import Call
from gpusched.daemon.requests import batches
from gpusched.daemon.requests.request import Request
from inproc import ME

ELEMENTS = 5000  # over batches.BIG_JOBS


@pytest.fixture(autouse=True)
def one_chunk_per_turn(monkeypatch):
    """Each turn does one chunk, however fast this machine is: many turns, every time."""
    monkeypatch.setattr(batches, "TURN_BUDGET_S", 0.0)


def start(box, name: str, **args) -> Call:
    """A request handed to the loop, and one turn: the big ones are not done after it."""
    check_request({"cmd": name, "args": args})
    call = Call(Request(name, args, ME))
    box.daemon.step([call])
    return call


def array_request(box, count: int) -> dict:
    from gpusched.client.submit.fastsubmit import parse
    from gpusched.client.submit.jobrequest import build_request

    opts = parse(["--hold", "--array", f"0-{count - 1}", "--", "true"])
    opts.cwd = str(box.root)
    return build_request(opts)


def finish(box, call: Call) -> int:
    turns = 0
    while not call.done.is_set():
        box.daemon.step([])
        turns += 1
    assert call.error is None, call.error
    return turns


def test_a_big_submit_goes_in_batches_and_others_are_answered_between_them(box):
    before = box.submit("--hold", "--", "true")
    call = start(box, "submit", **array_request(box, ELEMENTS))
    assert not call.done.is_set()
    box.step()
    # Between batches: ls answers, and sees nothing of the submit not yet acknowledged.
    assert [j["id"] for j in box.call("list", all=True)["jobs"]] == [before]
    with pytest.raises(Exception, match=f"no job {before + 1}"):
        box.call("show", ids=[before + 1])
    assert finish(box, call) > 10
    ids = call.result["ids"]
    assert ids == list(range(before + 1, before + 1 + ELEMENTS))  # contiguous
    assert call.result["array_ids"] == [ids[0]]
    assert len(box_list_all(box)) == ELEMENTS + 1
    assert box.submit("--", "true") == ids[-1] + 1


def box_list_all(box) -> list[dict]:
    jobs, after = [], 0
    while True:
        page = box.call("list", all=True, after=after)
        jobs += page["jobs"]
        if page["next"] is None:
            return jobs
        after = page["next"]


def test_a_submit_cut_short_by_a_crash_leaves_nothing_and_its_ids_unused(box):
    call = start(box, "submit", **array_request(box, ELEMENTS))
    for _ in range(5):
        box.daemon.step([])
    assert not call.done.is_set()
    stored = box.daemon.state.store.get(2)  # part of it is in the file...
    assert stored is not None
    box.restart(crash=True)
    # ...and after the restart none of it: not listed, not runnable, not in the file.
    assert box.daemon.state.store.get(2) is None
    assert box_list_all(box) == [] and box.daemon.state.pending() == []
    assert box.submit("--", "true") == ELEMENTS + 1  # its ids are never reused


def test_a_big_cancel_goes_in_batches_and_ends_every_element(box):
    ids = box.call("submit", **array_request(box, ELEMENTS))["ids"]
    call = start(box, "cancel", ids=[ids[0]])
    assert not call.done.is_set()
    assert box.call("status")["pending"] > 0  # answered between batches
    finish(box, call)
    assert set(call.result["results"].values()) == {"cancelled"}
    assert len(call.result["results"]) == ELEMENTS
    assert box.daemon.state.pending() == []
    assert {j["state"] for j in box_list_all(box)} == {"cancelled"}


def test_a_big_array_is_queued_listed_and_cancelled_through_the_cli(home: Home):
    home.start()
    queued = home.json("submit", "--hold", "--array", "0-4999", "--", "true")
    first = queued["array_id"]
    assert queued["ids"] == list(range(first, first + 5000))
    assert len(home.json("ls", "-r", "--all")) == 5000  # plain `ls` lists the first 50
    home.run("cancel", str(first))
    states = home.run("ls", "--all", "-r", "--format", "state", "--noheader").stdout.split()
    assert states == ["cancelled"] * 5000
