"""Which committed job changes set off which [[notify]] entries (the daemon in this process,
tests/inproc.py), how the config's entries are checked, and how a hook's output is read
and deliveries queued."""

from __future__ import annotations

import tracemalloc

import pytest

from conftest import is_gone, wait_until
from gpusched.core.config import settings_from_mapping
from gpusched.core.errors import ConfigError
from gpusched.daemon.observe.notify import chat_text, event_body, hook_env
from gpusched.daemon.observe.notifyqueue import FairQueue
from gpusched.proc.hookrun import OUTPUT_KEPT_BYTES, run_hook

ALL = '["start", "end", "fail", "timeout", "oom", "lost"]'


def notified(box) -> list[tuple[str, int]]:
    """What the box's notifier would send from now on: (event, job id)."""
    seen: list[tuple[str, int]] = []
    box.daemon.state.notifier.dispatch = lambda rule, event: seen.append(
        (event["event"], event["job"]["id"])
    )
    return seen


def config(events: str = ALL, extra: str = "") -> str:
    return f'[[notify]]\nevents = {events}\ncommand = ["true"]\n{extra}'


def test_a_failed_job_tells_of_its_start_end_and_failure(make_box):
    box = make_box(config=config())
    seen = notified(box)
    job = box.submit("--", "python", "train.py")
    box.step()
    box.exit(job, 3)
    assert seen == [("start", job), ("end", job), ("fail", job)]


def test_only_the_events_an_entry_asks_for(make_box):
    box = make_box(config=config('["fail"]'))
    seen = notified(box)
    good, bad = box.submit("--", "true"), box.submit("--", "false")
    box.step()
    box.exit(good, 0)
    box.exit(bad, 1)
    assert seen == [("fail", bad)]


def test_a_lost_job_and_a_cancelled_pending_one(make_box):
    box = make_box("1x80GiB", config=config())
    seen = notified(box)
    running, queued = box.submit("--gpus", "1", "--", "a"), box.submit("--gpus", "1", "--", "b")
    box.step()
    box.call("cancel", ids=[queued])
    box.shims.vanish(running)
    box.step(120)
    assert ("lost", running) in seen and ("end", running) in seen
    assert ("end", queued) in seen and ("start", queued) not in seen


def test_a_retried_attempt_is_not_an_end(make_box):
    box = make_box(config=config())
    seen = notified(box)
    job = box.submit("--retries", "1", "--", "flaky")
    box.step()
    box.exit(job, 1)
    assert ("end", job) not in seen and ("fail", job) not in seen


def test_nothing_is_sent_for_a_change_that_was_not_committed(make_box):
    box = make_box(config=config())
    seen = notified(box)
    job = box.submit("--", "a")
    box.step()
    with box.failing_writes():
        box.exit(job, 3)  # the pass that would store its end cannot commit
        assert seen == [("start", job)]
    box.step(60)  # the next retry of the loop's writes commits it
    assert seen == [("start", job), ("end", job), ("fail", job)]


def test_pending_longer_than_tells_once_and_skips_held_jobs(make_box):
    box = make_box(
        "1x80GiB", config=config('["pending_longer_than"]', 'pending_longer_than = "1h"')
    )
    seen = notified(box)
    box.submit("--gpus", "1", "--", "holder")
    waiting = box.submit("--gpus", "1", "--", "waiting")
    box.submit("--hold", "--gpus", "1", "--", "held")
    box.step(1800)
    assert seen == []
    box.step(1900)
    box.step(10)
    box.step(10)
    assert seen == [("pending_longer_than", waiting)]


def test_hostile_names_stay_data():
    from gpusched.core.models import Job, JobState

    name = "<!channel> $(touch x) 'a\"\nb\0c"
    job = Job(
        id=7,
        command=("sh", "-c", "$(rm -rf ~)"),
        cwd="/",
        uid=1,
        user="al",
        name=name,
        state=JobState.FAILED,
        exit_code=1,
        submitted_at=1.0,
    )
    event = event_body("fail", job, 2.0, "ws1")
    assert "&lt;!channel&gt;" in chat_text(event) and "<!" not in chat_text(event)
    assert hook_env(event)["GPUSCHED_JOB_NAME"] == name  # NULs go when the hook is run


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"events": ["end"], "command": "notify-send done"}, "write it as an argv list"),
        ({"events": ["finish"], "command": ["x"]}, "'finish' is not one of: start, end"),
        ({"events": ["end"]}, "has neither 'command' nor 'url'"),
        ({"events": ["end"], "url": "ftp://x"}, "http:// or https://"),
        ({"events": ["pending_longer_than"], "command": ["x"]}, "go together"),
        ({"events": ["end"], "command": ["x"], "timout": "1s"}, "unknown key 'timout'"),
    ],
)
def test_bad_entries_name_the_entry_and_the_key(entry, message):
    with pytest.raises(ConfigError) as info:
        settings_from_mapping({"notify": [{"events": ["end"], "command": ["ok"]}, entry]}, "c")
    assert "[[notify]] entry 2" in info.value.message and message in info.value.message


def test_a_notify_table_instead_of_an_array_says_how_to_write_it():
    with pytest.raises(ConfigError, match=r"\[\[notify\]\]"):
        settings_from_mapping({"notify": {"events": ["end"], "command": ["x"]}}, "c")


@pytest.mark.e2e
def test_a_hooks_output_is_read_as_it_comes_and_only_its_last_kib_kept():
    """A hook that prints 256 MiB (and never reads its stdin): the reader holds a few
    KiB at any moment, and keeps the end."""
    tracemalloc.start()
    try:
        result = run_hook(
            ("sh", "-c", "head -c 268435456 /dev/zero; echo; echo the end"),
            {},
            b"x" * (1024 * 1024),
            60,
        )
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.outcome == "exit 0" and result.output.endswith("\nthe end\n")
    assert len(result.output) <= OUTPUT_KEPT_BYTES
    assert peak_bytes < 4 * 1024 * 1024, f"{peak_bytes} bytes held while reading"


@pytest.mark.e2e
def test_a_hook_whose_child_keeps_its_output_open_is_killed_at_its_timeout(tmp_path):
    pid_file = tmp_path / "pid"
    result = run_hook(("sh", "-c", f"sleep 300 & echo $! > {pid_file}; echo started"), {}, b"", 1)
    assert result.outcome == "timeout after 1 s (killed)" and result.output == "started\n"
    wait_until(lambda: is_gone(int(pid_file.read_text())), "the hook's child to be killed")


def test_one_lane_at_its_limit_leaves_the_others_their_turns():
    lanes = FairQueue(per_lane=1, max_queued=8, max_per_lane=3)
    assert all(lanes.put("alice", n) for n in range(3))
    assert not lanes.put("alice", 3), "a lane takes no more than its share"
    assert lanes.put("bob", 0) and lanes.put("site", 0)
    assert lanes.get() == ("alice", 0)  # still running: alice waits for done()
    assert [lanes.get(), lanes.get()] == [("bob", 0), ("site", 0)]
    lanes.done("alice")
    assert lanes.get() == ("alice", 1)
