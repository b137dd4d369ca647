"""`ls --last N`: only the N most recent matching jobs, read newest first from the store."""

from __future__ import annotations

import json
import os
import pwd

import pytest

from conftest import Home
from gpusched.core.errors import UsageError
from gpusched.core.models import Job, JobState
from gpusched.store.database import Store
from inproc import ME, FakeClock
from test_cli_errors import assert_one_error_line

USER = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    """Six finished jobs, a-1 .. a-3 and b-1 .. b-3 interleaved, then a held one."""
    home = Home(tmp_path_factory.mktemp("last") / "home")
    home.write_config()
    home.done = [
        home.submit("--gpus", "0", "--name", f"{kind}-{n}", "--", "true")
        for n in (1, 2, 3)
        for kind in "ab"
    ]
    home.run("wait", *map(str, home.done))
    home.held = home.submit("--hold", "--name", "a-held", "--", "true")
    yield home
    home.cleanup()


def ids(home: Home, *args: str) -> list[int]:
    return [job["id"] for job in json.loads(home.script("ls", "--json", *args).stdout)]


@pytest.mark.e2e
def test_last_keeps_the_newest_in_id_order(queue):
    assert ids(queue, "--all", "--last", "3") == queue.done[-2:] + [queue.held]
    assert ids(queue, "--all", "--last", "100") == queue.done + [queue.held]
    # Without --all only pending and running jobs count, as for plain ls.
    assert ids(queue, "--last", "1") == [queue.held]


@pytest.mark.e2e
def test_last_counts_only_the_jobs_that_match(queue):
    a_done = queue.done[0::2]
    assert ids(queue, "--all", "--name", "a-*", "--last", "2") == [a_done[-1], queue.held]
    assert ids(queue, "--state", "succeeded", "--last", "2") == queue.done[-2:]
    out = queue.script(
        "ls", "--all", "--name", "b-*", "--last", "2", "--format", "jobid,name", "--noheader"
    ).stdout
    assert out.split() == [str(queue.done[3]), "b-2", str(queue.done[5]), "b-3"]


@pytest.mark.e2e
@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_bad_last_is_one_error_line(queue, value):
    assert_one_error_line(queue.script("ls", "--last", value, check=False), 2, "last", value)
    assert_one_error_line(queue.script("ls", "--last", "many", check=False), 2, "--last")


# The in-process daemon's clock: jobs that ended just now, which retention keeps.
NOW = FakeClock().time()


def finished_jobs(first_id: int, count: int) -> list[Job]:
    """Rows as the daemon stores a job that ran and succeeded."""
    return [
        Job(
            id=i,
            command=("true",),
            cwd="/",
            uid=ME[1],
            user=USER,
            name=f"job-{i}",
            state=JobState.SUCCEEDED,
            submitted_at=NOW - 3,
            started_at=NOW - 2,
            ended_at=NOW - 1,
            exit_code=0,
        )
        for i in range(first_id, first_id + count)
    ]


def fill(store: Store, count: int) -> None:
    with store.write():
        store.insert(finished_jobs(1, count))


def count_rows_read(box, monkeypatch) -> list[int]:
    """Jobs the store turns from rows into Job objects, counted as they are read."""
    store, read = box.daemon.state.store, [0]
    parse = store._jobs

    def counting(rows):
        jobs = parse(rows)
        read[0] += len(jobs)
        return jobs

    monkeypatch.setattr(store, "_jobs", counting)
    return read


def test_the_newest_of_many_finished_jobs_are_found_without_reading_the_rest(box, monkeypatch):
    fill(box.daemon.state.store, 20_000)
    pending = box.submit("--hold", "--", "true")
    read = count_rows_read(box, monkeypatch)
    page = box.call("list", all=True, last=3)
    assert [job["id"] for job in page["jobs"]] == [19_999, 20_000, pending]
    assert page["next"] is None
    assert read[0] < 500  # of 20,000: only the newest are read
    # A filter that matches few reads further down, still newest first.
    read[0] = 0
    page = box.call("list", all=True, last=2, names=["job-1999?"])
    assert [job["id"] for job in page["jobs"]] == [19_998, 19_999]
    assert read[0] < 5_000


def test_pages_of_a_long_last_hold_exactly_the_newest(box):
    fill(box.daemon.state.store, 3_000)
    jobs, after, pages = [], 0, 0
    while True:  # as the client pages: again from each reply's "next", "last" unchanged
        page = box.call("list", all=True, last=1_500, after=after, page_bytes=65_536)
        jobs, pages = jobs + page["jobs"], pages + 1
        if page["next"] is None:
            break
        after = page["next"]
    assert [job["id"] for job in jobs] == list(range(1_501, 3_001))
    assert pages > 2


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_the_daemon_refuses_a_bad_last(box, value):
    with pytest.raises(UsageError, match="last"):
        box.call("list", last=value)


def test_ls_sends_last_only_when_given(monkeypatch, capsys):
    """A daemon older than --last refuses arguments it does not know: a plain `ls`
    must keep working against it while the new client is installed."""
    from gpusched.cli import jobviews

    sent = []

    class Recorder:
        def call_paged(self, cmd, **args):
            sent.append(args)
            return {"jobs": [], "next": None}

        def stream(self, cmd, **args):  # `ls --all` and `--last` print pages as they come
            yield self.call_paged(cmd, **args)

    monkeypatch.setattr(jobviews, "Client", Recorder)
    options = {
        "all_jobs": True,
        "expand": False,
        "as_json": True,
        "users": None,
        "me": False,
        "states": None,
        "names": None,
        "fields": None,
        "noheader": False,
    }
    jobviews.list_jobs(**options, last=None)
    jobviews.list_jobs(**options, last=5)
    assert "last" not in sent[0] and sent[1]["last"] == 5
