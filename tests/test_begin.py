"""Delayed starts: `submit --begin TIME` in Slurm's forms, `update --begin`, the BeginTime
pending reason, and the daemon's timer for the earliest begin time (also across a restart)."""

from __future__ import annotations

import datetime as dt

import pytest

from conftest import wait_until
from gpusched.client.submit import fastsubmit
from gpusched.client.submit.jobrequest import build_request
from gpusched.core.errors import UsageError
from gpusched.core.models import Job
from gpusched.core.slurm.clusterconf import ClusterConfig
from gpusched.core.slurm.slurmspec import sbatch_argv
from gpusched.core.spec.begintime import begin_text, parse_begin

# A fixed clock: Thursday 2026-12-03 14:10:30, local time.
NOW = dt.datetime(2026, 12, 3, 14, 10, 30)
NOW_S = NOW.timestamp()


def at(*fields: int) -> float:
    return dt.datetime(*fields).timestamp()  # type: ignore[arg-type]


# -- the forms, with a fixed clock ------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("now", NOW_S),
        ("now+2", NOW_S + 2),
        ("now+90seconds", NOW_S + 90),
        ("now+5minutes", NOW_S + 300),
        ("now+5min", NOW_S + 300),
        ("now+1hour", NOW_S + 3600),
        ("now+2hours", NOW_S + 7200),
        ("now+3days", NOW_S + 3 * 86400),
        ("now+1week", NOW_S + 7 * 86400),
        ("NOW+1HOUR", NOW_S + 3600),
        ("16:00", at(2026, 12, 3, 16, 0)),  # later today
        ("16:00:15", at(2026, 12, 3, 16, 0, 15)),
        ("09:30", at(2026, 12, 4, 9, 30)),  # past today: tomorrow
        ("4:00pm", at(2026, 12, 3, 16, 0)),
        ("12:00am", at(2026, 12, 4, 0, 0)),
        ("today", at(2026, 12, 3)),
        ("tomorrow", at(2026, 12, 4)),
        ("midnight", at(2026, 12, 4)),
        ("noon", at(2026, 12, 4, 12, 0)),  # past today
        ("teatime", at(2026, 12, 3, 16, 0)),
        ("2026-12-24", at(2026, 12, 24)),
        ("2026-12-24T08:00", at(2026, 12, 24, 8, 0)),
        ("2026-12-24T08:00:30", at(2026, 12, 24, 8, 0, 30)),
        ("12/24", at(2026, 12, 24)),
        ("12/24/27", at(2027, 12, 24)),
        ("01/05", at(2027, 1, 5)),  # past this year: next year's
    ],
)
def test_begin_forms_read_as_slurm_reads_them(text, expected):
    assert parse_begin(text, NOW_S) == expected


@pytest.mark.parametrize(
    "text",
    ["", "later", "now+", "now-5", "now+2parsecs", "now+1.5hours", "25:00", "12:60", "13:00pm"]
    + ["2026-13-01", "2026-02-30", "2026-12-24T25:00", "13/01", "1/2/3/4", "1:2:3:4", "+5"],
)
def test_a_bad_begin_names_the_value_and_the_forms(text):
    with pytest.raises(UsageError) as caught:
        parse_begin(text, NOW_S)
    assert caught.value.message.startswith(f"--begin {text!r} is not a time; use HH:MM[:SS]")
    assert "now+N[seconds|minutes|hours|days|weeks]" in caught.value.message


def test_a_cluster_job_hands_its_begin_time_to_sbatch():
    job = Job(id=7, command=("true",), cwd="/", uid=1, user="u", begin_time=at(2026, 12, 24, 8))
    argv = sbatch_argv([job], ClusterConfig(name="c"), "/s", "/o", "/e", "m", [])
    assert "--begin=2026-12-24T08:00:00" in argv


# -- in the daemon's loop, with a clock moved by hand --------------------------------------
def submit_at(box, begin_time: float, *argv: str) -> int:
    """`submit --begin` as the CLI sends it, for a time of the box's clock."""
    opts = fastsubmit.parse([*argv, "--", "true"])
    opts.cwd = str(box.root)
    request = build_request(opts)
    request["jobs"][0]["begin_time"] = begin_time
    (job_id,) = box.call("submit", **request)["ids"]
    return job_id


def test_a_job_waits_for_its_begin_time_then_starts(box):
    start = box.clock.time() + 60
    job_id = submit_at(box, start)
    job = box.show(job_id)
    assert (job["state"], job["begin_time"]) == ("pending", start)
    assert job["pending_reason"] == f"BeginTime (starts at {begin_text(start)})"
    assert box.daemon.control.next_deadline() == start  # the loop's wait ends then
    box.step(59.0)
    assert box.show(job_id)["state"] == "pending"
    box.step(1.0)
    assert box.show(job_id)["state"] == "running"
    assert box.daemon.control.next_deadline() is None


def test_update_begin_moves_the_time_and_now_releases_it(box):
    job_id = submit_at(box, box.clock.time() + 3600)
    later = box.clock.time() + 7200
    assert box.call("update", ids=[job_id], begin_time=later)["results"] == {
        str(job_id): f"begin {begin_text(later)}"
    }
    box.step(3600.0)
    assert box.show(job_id)["state"] == "pending"
    box.call("update", ids=[job_id], begin_time=box.clock.time())  # --begin now
    assert box.show(job_id)["state"] == "running"
    refused = box.call("update", ids=[job_id], begin_time=later)["refused"]
    assert "only pending jobs" in refused[str(job_id)]


def test_a_held_job_with_a_begin_time_waits_for_both(box):
    start = box.clock.time() + 60
    job_id = submit_at(box, start, "--hold")
    box.step(61.0)
    assert box.show(job_id)["pending_reason"].startswith("held")
    box.call("release", ids=[job_id])
    assert box.show(job_id)["state"] == "running"  # its time has come: it starts

    other = submit_at(box, box.clock.time() + 60, "--hold")
    box.call("release", ids=[other])
    assert box.show(other)["pending_reason"].startswith("BeginTime")
    box.step(60.0)
    assert box.show(other)["state"] == "running"


def test_a_restart_keeps_the_begin_time_and_its_timer(box):
    start = box.clock.time() + 120
    job_id = submit_at(box, start)
    box.restart()
    assert box.daemon.control.next_deadline() == start
    box.step(119.0)
    assert box.show(job_id)["state"] == "pending"
    box.step(1.0)
    assert box.show(job_id)["state"] == "running"


# -- through the CLI and a real daemon -------------------------------------------------------
def test_submit_begin_now_plus_two_seconds_starts_it_then(home):
    job_id = home.submit("--begin", "now+2", "--", "true")
    job = home.show(job_id)
    assert job["state"] == "pending" and job["begin_time"] is not None
    assert f"begin_time={begin_text(job['begin_time'])}" in home.run("show", str(job_id)).stdout
    done = home.wait_state(job_id, "succeeded")
    assert done["started_at"] >= job["begin_time"]
    bad = home.run("submit", "--begin", "soonish", "--", "true", check=False)
    assert bad.returncode == 2
    assert bad.stderr.startswith("Error: --begin 'soonish' is not a time; use HH:MM[:SS]")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_begin_in_a_script_and_update_begin_through_the_cli(home, tmp_path):
    script = tmp_path / "night.sh"
    script.write_text("#!/bin/sh\n#SBATCH --begin=now+1hour\ntrue\n")
    script.chmod(0o755)
    job_id = home.submit(str(script))
    wait_until(
        lambda: home.show(job_id)["pending_reason"].startswith("BeginTime"), "the BeginTime reason"
    )
    assert "BeginTime" in home.run("ls").stdout
    home.run("update", str(job_id), "--begin", "now")
    home.wait_state(job_id, "succeeded")


def test_a_begin_time_that_passed_while_the_daemon_was_down_starts_the_job_at_once(box):
    job_id = submit_at(box, box.clock.time() + 60)
    box.stop()
    box.clock.advance(600.0)
    box.start()
    box.step()
    assert box.show(job_id)["state"] == "running"
