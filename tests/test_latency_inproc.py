"""The loop stays quick with a long queue (issue 23): a request that only looks sets off no
scheduling pass, one that changes something still does, and `ls`'s and `top`'s cached
views of the pending queue belong to one daemon. The loop's real turns, in process
(tests/inproc.py)."""

from __future__ import annotations

import pytest

from gpusched.client import protocol
from gpusched.core.errors import NotFound
from gpusched.daemon.requests import lsqueue
from inproc import Box


@pytest.fixture
def passes(box, monkeypatch) -> list[int]:
    """One entry per scheduling pass the box's loop runs from now on."""
    counted: list[int] = []
    control = box.daemon.control
    real = control.start_ready

    def counting() -> None:
        counted.append(1)
        real()

    monkeypatch.setattr(control, "start_ready", counting)
    return counted


def blocked_queue(box: Box) -> tuple[int, int]:
    """A job on all four GPUs and one waiting behind it; the pass after them is done."""
    running = box.submit("--gpus", "4", "--", "sleep", "100")
    box.step()
    waiting = box.submit("--gpus", "1", "--", "true")
    box.step()
    assert box.running() == {running}
    return running, waiting


@pytest.mark.parametrize(
    "name, args",
    [
        ("status", {}),
        ("list", {}),
        ("list", {"pending_rows": 100}),
        ("list", {"all": True}),
        ("show", {"ids": ["1"]}),
        ("gpus", {}),
        ("snapshot", {"lean": True}),
        ("logs", {"id": "1"}),
        ("env", {"id": "1"}),
        ("wait", {"ids": ["1"], "timeout_s": 0}),
        ("usage", {}),
        ("history", {"key": "train"}),
        ("attach", {"id": "1"}),
        ("reservations", {}),
    ],
)
def test_a_request_that_only_looks_sets_off_no_scheduling_pass(box, passes, name, args):
    blocked_queue(box)
    passes.clear()
    call = box.send(name, **args)  # `wait` on the running job 1 is answered later
    assert call.error is None, call.error
    box.step()
    assert passes == [], f"`{name}` set off a scheduling pass"


def test_every_read_only_request_is_tested_above():
    tested = {
        "status",
        "list",
        "show",
        "gpus",
        "snapshot",
        "logs",
        "env",
        "wait",
        "usage",
        "history",
        "attach",
        "reservations",
    }
    table = protocol.COMMANDS.items()
    assert {name for name, spec in table if spec.read_only and not spec.on_server} == tested


def test_a_request_that_changes_the_queue_still_sets_off_a_pass(box, passes):
    running, waiting = blocked_queue(box)
    held = box.submit("--hold", "--gpus", "0", "--", "true")
    box.step()
    passes.clear()
    box.call("release", ids=[str(held)])
    assert passes == [1]  # which started it: no GPU reading was due
    assert box.running() == {running, held}
    box.call("cancel", ids=[str(waiting)])
    assert passes == [1, 1]


def test_a_refused_request_that_may_change_still_sets_off_a_pass(box, passes):
    """A request's name says whether a pass follows, not its outcome (conservative)."""
    blocked_queue(box)
    passes.clear()
    with pytest.raises(NotFound):
        box.call("cancel", ids=["999"])
    assert passes == [1]


def test_the_ls_and_top_views_of_the_queue_belong_to_one_daemon(make_box):
    """Two daemons in one process never answer from each other's cached views, even when
    their pending queues have the same version."""
    first, second = make_box(), make_box()
    first_ids = first.submit_all("--hold", "--array", "0-4", "--", "true")
    second_ids = second.submit_all(
        "--hold", "--name", "other", "--from-file", "-", stdin="true 1\ntrue 2\n"
    )
    # The same version string: the caches must be told apart by more than it.
    second.daemon.state._pending_nonce = first.daemon.state._pending_nonce
    second.daemon.state._pending_changes = first.daemon.state._pending_changes
    assert first.daemon.state.pending_version == second.daemon.state.pending_version
    for box, ids in ((first, first_ids), (second, second_ids), (first, first_ids)):
        state = box.daemon.state
        assert [job.id for job in lsqueue.pending_top(state, 10)] == ids
        assert sum(count for count, _ in lsqueue.pending_groups(state).values()) == len(ids)
        top = box.call("snapshot", lean=True)
        assert [job["id"] for job in top["jobs"]] == ids
        assert box.call("list", pending_rows=1)["more_pending"]["count"] == len(ids) - 1
