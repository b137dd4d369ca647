"""A big queue that has run leaves a small daemon, and a store of many finished jobs keeps
`ls` from reading them (unless --all asks)."""

from __future__ import annotations

import psutil

from conftest import wait_until
from gpusched.daemon.memtrim import TRIM_AFTER_JOBS_GONE, MemoryTrim
from gpusched.daemon.requests.pagedreplies import SCAN_ROWS
from test_ls_last import count_rows_read, fill


def rss_bytes(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def test_the_daemon_gives_back_the_memory_of_a_long_queue_once_it_is_gone(home):
    pid = home.start()
    home.run("ls")
    idle = rss_bytes(pid)
    # Jobs with their own log files, which the daemon holds whole (a sweep's jobs with
    # gpusched's own logs it holds as one template: tests/test_compact_queue.py).
    ids = home.json(
        "submit",
        "--hold",
        "--gpus",
        "0",
        "-o",
        "%j.out",
        "--from-file",
        "-",
        input="true\n" * 20_000,
    )["ids"]
    queued = rss_bytes(pid)
    # 20,000 pending jobs live in the daemon's memory (whole: about 2 KB each).
    assert queued > idle + 10 * 2**20
    home.run("cancel", *map(str, ids))
    # Once they are gone, so is much of what they took: the C allocator keeps freed
    # pages unless told to give them back.
    # Jobs are held compactly, so SQLite's page cache and the allocator's arenas are a
    # larger share of the growth than they were; a third of it must come back.
    wait_until(
        lambda: rss_bytes(pid) < queued - (queued - idle) / 3,
        "the daemon's memory to shrink after the queue emptied",
        timeout=30,
    )


class Trims:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, pad: int) -> int:
        self.calls += 1
        return 1


def test_a_trim_comes_once_a_large_drop_has_settled_not_for_small_queues(box):
    trims = Trims()
    box.daemon.memory = MemoryTrim(trims)
    small = box.submit_all("--hold", "--from-file", "-", stdin="true\n" * 50)
    box.call("cancel", ids=[str(i) for i in small])
    box.step()
    box.step()
    assert trims.calls == 0  # a few jobs: not worth walking the heap
    big = box.submit_all("--hold", "--from-file", "-", stdin="true\n" * (2 * TRIM_AFTER_JOBS_GONE))
    box.call("cancel", ids=[str(i) for i in big])
    box.step()  # the queue held still for a turn
    box.step()
    assert trims.calls == 1
    state = box.daemon.state
    assert state.jobs == {} and state.pending() == [] and state.running() == []
    # The daemon works as before on its rebuilt tables.
    job = box.submit("--gpus", "1", "--", "true")
    assert box.states(job) == ["running"]
    assert box.exit(job)["state"] == "succeeded"


def test_plain_ls_reads_none_of_many_finished_jobs(box, monkeypatch):
    fill(box.daemon.state.store, 20_000)
    held = box.submit("--hold", "--", "true")
    read = count_rows_read(box, monkeypatch)
    assert [job["id"] for job in box.call("list")["jobs"]] == [held]
    assert read[0] == 0
    # --all reads them a page at a time, in id order, never all in one request.
    page = box.call("list", all=True)
    assert page["next"] is not None and read[0] <= SCAN_ROWS
