"""A long queue in `ls` and `top`, decided in the daemon (tests/inproc.py's Box): the first
pending jobs, the rest counted by array or by name, filters, other users' hidden names,
and a snapshot that carries counts rather than every pending row."""

from __future__ import annotations

import json
import os

import pytest

from gpusched.cli.views import lsstream, lsview
from gpusched.daemon.requests import lsqueue
from inproc import ME, Box

OTHER = (os.getpid(), 65534, 65534)  # not the daemon's user, not an admin


@pytest.fixture
def box(tmp_path):
    b = Box(tmp_path / "home")
    yield b
    b.stop()


def block(box: Box) -> int:
    """A running job on all four GPUs: every job queued after it waits."""
    running = box.submit("--gpus", "4", "--", "sleep", "100")
    box.step()
    assert box.running() == {running}
    return running


def fill(box: Box) -> dict[str, list[int]]:
    """One running job, then 180 pending: an array of 150, 20 named `grid`, 10 `eval`."""
    running = block(box)
    array = box.submit_all("--array", "0-149", "--gpus", "1", "--", "true")
    grid = box.submit_all(
        "--name",
        "grid",
        "--from-file",
        "-",
        "--gpus",
        "1",
        stdin="".join(f"true {i}\n" for i in range(20)),
    )
    evals = box.submit_all(
        "--name",
        "eval",
        "--from-file",
        "-",
        "--gpus",
        "1",
        stdin="".join(f"true {i}\n" for i in range(10)),
    )
    box.step()
    return {"running": [running], "array": array, "grid": grid, "eval": evals}


def head(box: Box, creds=ME, **filters) -> dict:
    """A plain `ls` of up to 100 pending jobs (the client asks for LS_PENDING_ROWS)."""
    return box.call("list", creds, pending_rows=100, **filters)


def test_the_first_pending_jobs_and_the_rest_counted_by_array_and_name(box):
    jobs = fill(box)
    reply = head(box)
    ids = [row["id"] for row in reply["jobs"]]
    assert ids == jobs["running"] + jobs["array"][:100]
    more = reply["more_pending"]
    assert more["count"] == 80 and more["others"] == 0 and more["other_groups"] == 0
    assert [(g["count"], g["array_id"], g["name"]) for g in more["groups"]] == [
        (50, jobs["array"][0], "true"),
        (20, None, "grid"),
        (10, None, "eval"),
    ]
    assert lsview.more_pending_line(more) == (
        f"and 80 more pending: 50 of array {jobs['array'][0]}, 20 named grid ({ME_NAME}), "
        f"10 named eval ({ME_NAME}) (--all lists every job)"
    )


ME_NAME = __import__("pwd").getpwuid(os.getuid()).pw_name


def test_a_short_queue_has_no_summary(box):
    block(box)
    box.submit_all("--array", "0-99", "--gpus", "1", "--", "true")
    reply = head(box)
    assert len(reply["jobs"]) == 101 and reply["more_pending"] is None


def test_filters_choose_the_jobs_shown_and_counted(box):
    jobs = fill(box)
    reply = head(box, names=["grid"])
    assert [r["id"] for r in reply["jobs"]] == jobs["grid"] and reply["more_pending"] is None
    reply = head(box, states=["running"])
    assert [r["id"] for r in reply["jobs"]] == jobs["running"] and reply["more_pending"] is None
    reply = head(box, states=["pending"], names=["true", "eval"])
    assert [r["id"] for r in reply["jobs"]] == jobs["array"][:100]
    assert reply["more_pending"]["count"] == 60
    assert head(box, users=["nobody"])["jobs"] == []


def test_another_users_names_stay_hidden_in_the_summary(box):
    fill(box)
    more = head(box, creds=OTHER)["more_pending"]
    # The array shows by its id; the names of the two groups are not told: they merge.
    assert [(g["count"], g["name"]) for g in more["groups"]] == [(50, ""), (30, "")]
    assert "grid" not in json.dumps(more) and "eval" not in json.dumps(more)
    assert lsview.more_pending_line(more).endswith(
        f"30 of {ME_NAME}'s jobs (--all lists every job)"
    )


def test_the_summary_names_three_groups_and_counts_the_others(box):
    block(box)
    box.submit_all("--array", "0-99", "--gpus", "1", "--", "true")
    for n in range(5):
        box.submit_all(
            "--name",
            f"g{n}",
            "--from-file",
            "-",
            "--gpus",
            "1",
            stdin="".join(f"true {i}\n" for i in range(10 - n)),
        )
    more = head(box)["more_pending"]
    assert more["count"] == 40
    line = lsview.more_pending_line(more)
    assert line == (
        f"and 40 more pending: 10 named g0 ({ME_NAME}), 9 named g1 ({ME_NAME}), "
        f"8 named g2 ({ME_NAME}), 13 others (--all lists every job)"
    )


def test_later_pages_of_the_head_are_the_same_head(box):
    """A head whose rows fill more than one page: each page works the head out again."""
    jobs = fill(box)
    reply, rows = box.call("list", pending_rows=100, page_bytes=1024), []
    while True:
        rows += reply["jobs"]
        if reply["next"] is None:
            break
        reply = box.call("list", pending_rows=100, page_bytes=1024, after=reply["next"])
    assert [r["id"] for r in rows] == jobs["running"] + jobs["array"][:100]
    assert reply["more_pending"]["count"] == 80


def test_a_snapshot_carries_the_first_pending_jobs_and_the_counts(box):
    jobs = fill(box)
    snap = box.call("snapshot", lean=True)
    pending = [j["id"] for j in snap["jobs"] if j["state"] == "pending"]
    assert pending == jobs["array"][: lsqueue.TOP_PENDING_ROWS]
    assert snap["pending_total"] == 180 and snap["pending_mine"] == 180
    assert box.call("snapshot", OTHER, lean=True)["pending_mine"] == 0
    # Asked again unchanged: only the running ones, and the counts still.
    again = box.call("snapshot", lean=True, pending_version=snap["pending_version"])
    assert [j["id"] for j in again["jobs"]] == jobs["running"]
    assert again["pending_total"] == 180


def test_top_takes_the_first_pending_jobs_in_its_order(box):
    """Top lists pending jobs by priority, then age: the first of those are sent."""
    fill(box)
    urgent = box.submit("--priority", "5", "--gpus", "1", "--", "true")
    snap = box.call("snapshot", lean=True)
    pending = [j["id"] for j in snap["jobs"] if j["state"] == "pending"]
    assert pending[0] == urgent and len(pending) == lsqueue.TOP_PENDING_ROWS


def test_arrays_fold_the_same_a_page_at_a_time():
    rows = [
        _row(1),
        *(_row(i, array=2, index=i - 2) for i in range(2, 9)),
        _row(9),
        *(_row(i, array=10, index=i - 10, state="running") for i in range(10, 13)),
    ]
    whole = lsview.fold_arrays(rows)
    for cut in range(len(rows) + 1):
        folder = lsview.ArrayFolder()
        assert folder.feed(rows[:cut]) + folder.feed(rows[cut:]) + folder.finish() == whole


def test_streamed_json_is_the_document_json_writes(capsys):
    rows = [_row(i) for i in range(1, 6)]
    for pages in ([], [rows], [rows[:2], [], rows[2:]]):
        lsstream.write_json([{"jobs": page} for page in pages])
        everything = [row for page in pages for row in page]
        assert capsys.readouterr().out == json.dumps(everything, indent=2) + "\n"


def _row(
    job_id: int, array: int | None = None, index: int | None = None, state: str = "pending"
) -> dict:
    return {
        "id": job_id,
        "array_id": array,
        "array_index": index,
        "state": state,
        "gpu_indices": [job_id % 4] if state == "running" else [],
        "pending_reason": f"waits {job_id}",
        "array_throttle": None,
        "text": "a\nb",
    }
