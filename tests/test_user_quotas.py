"""Quotas per user and per Unix group, with time windows: the config's shape and the rule
(unit), the daemon's pending reasons across a window's edge with a moving clock, a config
change on restart and the refused submit (inproc), and the CLI's view (e2e)."""

from __future__ import annotations

import getpass
import grp
import json
import os
import time

import pytest

from conftest import wait_until
from gpusched.cli.commands.simulate import simulate_command
from gpusched.core.config import settings_from_mapping
from gpusched.core.errors import ConfigError, GpuschedError, UsageError
from gpusched.core.sched import quotas
from gpusched.sim import traces
from gpusched.sim.simulator import simulate

ME = getpass.getuser()
MY_GROUP = grp.getgrgid(os.getgid()).gr_name  # the primary group counts as one of the user's


def parse(toml: dict) -> quotas.Quotas:
    return settings_from_mapping(toml, "gpusched.toml").quotas


def labels(table: quotas.Quotas, user: str, groups: tuple[str, ...], hhmm: str) -> dict:
    hours, minutes = hhmm.split(":")
    minute = int(hours) * 60 + int(minutes)
    return {k: v.label() for k, v in quotas.limits_for(table, user, groups, minute).items()}


STUDENTS = {
    "default": {"max_running_gpus": 4, "max_queued_jobs": 100},
    "groups": {
        "students": {"max_running_gpus": 3, "day": {"hours": "09:00-18:00", "max_running_gpus": 1}},
        "interns": {"max_running_gpus": 2, "max_gpu_mem": "100GiB"},
    },
    "users": {"alice": {"max_queued_jobs": "unlimited", "night": {"hours": "22:00-06:00"}}},
}


# -- the rule (unit) -------------------------------------------------------------------------
def test_the_most_specific_quota_sets_each_limit_and_windows_change_it_by_the_hour():
    table = parse({"quotas": STUDENTS})
    # bob, in no group: the default's limits.
    assert labels(table, "bob", (), "12:00") == {
        "max_running_gpus": "quota default max_running_gpus=4",
        "max_queued_jobs": "quota default max_queued_jobs=100",
    }
    # A student in the day, then at night: the window's limit, then the group's own.
    assert labels(table, "bob", ("students",), "17:59")["max_running_gpus"] == (
        "quota groups.students max_running_gpus=1 (day, until 18:00)"
    )
    assert labels(table, "bob", ("students",), "18:00")["max_running_gpus"] == (
        "quota groups.students max_running_gpus=3 (until 09:00)"
    )
    # In two groups: the most generous of them (3 of students at night over interns' 2;
    # interns' 2 over students' 1 in the day); a key only one group sets comes from it.
    both = ("students", "interns")
    assert labels(table, "bob", both, "23:00")["max_running_gpus"].startswith(
        "quota groups.students max_running_gpus=3"
    )
    assert labels(table, "bob", both, "10:00") == {
        "max_running_gpus": "quota groups.interns max_running_gpus=2",
        "max_gpu_mem": "quota groups.interns max_gpu_mem=100.0 GiB",
        "max_queued_jobs": "quota default max_queued_jobs=100",
    }
    # A user's own quota wins, "unlimited" included: alice has no max_queued_jobs.
    assert labels(table, "alice", ("students",), "10:00") == {
        "max_running_gpus": "quota groups.students max_running_gpus=1 (day, until 18:00)"
    }


def test_windows_across_midnight_and_the_next_edge():
    table = parse(
        {"quotas": {"default": {"night": {"hours": "22:00-06:00", "max_running_jobs": 9}}}}
    )
    assert labels(table, "x", (), "23:30") == {
        "max_running_jobs": "quota default max_running_jobs=9 (night, until 06:00)"
    }
    assert labels(table, "x", (), "05:59") != {} and labels(table, "x", (), "06:00") == {}
    at_2130 = 21.5 * 3600
    assert quotas.next_change(table, at_2130, quotas.trace_minute) == 22 * 3600
    assert quotas.next_change(table, 22 * 3600, quotas.trace_minute) == 30 * 3600
    assert quotas.next_change(parse({}), at_2130, quotas.trace_minute) is None


def test_the_old_keys_are_the_defaults_quotas():
    old = parse({"scheduling": {"max_gpus_per_user": 2, "max_running_per_user": 0}})
    assert labels(old, "x", (), "12:00") == {"max_running_gpus": "quota default max_running_gpus=2"}
    with pytest.raises(ConfigError, match=r"keep quotas\.default\.max_running_gpus only"):
        parse(
            {"scheduling": {"max_gpus_per_user": 2}, "quotas": {"default": {"max_running_gpus": 3}}}
        )


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"default": {"max_gpus": 2}}, "unknown key 'quotas.default.max_gpus'"),
        ({"users": {"a": {"max_running_jobs": -1}}}, "'quotas.users.a.max_running_jobs'"),
        ({"default": {"day": {"hours": "9-18"}}}, "'quotas.default.day.hours'"),
        ({"default": {"day": {"max_running_jobs": 1}}}, r"\[quotas.default.day\] needs hours"),
        ({"people": {}}, r"unknown section \[quotas.people\]"),
        ({"default": {"a": {"hours": "08:00-12:00"}, "b": {"hours": "11:00-13:00"}}}, "overlap"),
    ],
)
def test_a_bad_quota_is_refused_naming_its_key(table, message):
    with pytest.raises(ConfigError, match=message):
        parse({"quotas": table})


def test_simulate_holds_a_group_to_its_day_window(tmp_path):
    # A student submits two one-GPU jobs of ten hours (times after a midnight): at
    # 08:00 the night's limit of 3 lets both start; at 09:00 the day's limit of 1 holds
    # the second until 18:00.
    table = parse({"quotas": STUDENTS})
    starts = {}
    for hour in (8, 9):
        trace = tmp_path / f"at{hour}.csv"
        trace.write_text(
            "job_id,user,num_gpus,duration_s,submit_s\n"
            + "".join(f"{n},ann,1,36000,{hour * 3600}\n" for n in range(2))
        )
        loaded = traces.load_trace(trace)  # its times from 0: the first submit's
        assert [r.start_s for r in simulate(loaded.jobs, gpus=4)] == [0, 0]
        held = simulate(
            loaded.jobs,
            gpus=4,
            quota_table=table,
            groups={"ann": ["students"]},
            origin_s=loaded.origin_s,
        )
        starts[hour] = [r.start_s for r in held]
    assert starts == {8: [0, 0], 9: [0, 9 * 3600]}


def test_simulate_config_reads_quotas_and_simulate_groups(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "job_id,user,num_gpus,duration_s,submit_s\n"
        + "".join(f"{n},ann,1,3600,{10 * 3600}\n" for n in range(2))
    )
    config = tmp_path / "gpusched.toml"
    config.write_text(
        '[quotas.groups.students.day]\nhours = "09:00-18:00"\nmax_running_gpus = 1\n'
        '[simulate.groups]\nstudents = ["ann"]\n'
    )

    def waits(**extra) -> float:
        assert (
            simulate_command(
                trace,
                gpus=4,
                policy="pack",
                discipline="fifo",
                load=None,
                arrivals="trace",
                seed=0,
                as_json=True,
                **extra,
            )
            == 0
        )
        return json.loads(capsys.readouterr().out)["avg_wait_s"]

    assert waits() == 0
    assert waits(config=config) == 1800  # the second waits the first's hour
    with pytest.raises(UsageError, match="leave out --preemption"):
        waits(config=config, preemption=True)
    config.write_text("[quotas.users.ann]\nmax_running_jobs = 0\n")
    with pytest.raises(GpuschedError, match="could never start on this box under ann's quotas"):
        waits(config=config)
    config.write_text("[simulate]\nusers = 1\n")
    with pytest.raises(ConfigError, match=r"\[simulate\] holds groups only"):
        waits(config=config)


# -- the daemon, with a moving clock (inproc) --------------------------------------------------
def to_local(box, hhmm: str) -> None:
    """Move the box's clock forward to the next hh:mm of local time, and take a turn."""
    hours, minutes = hhmm.split(":")
    now = time.localtime(box.clock.time())
    at = now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec
    box.step((int(hours) * 3600 + int(minutes) * 60 - at) % 86400)


DAY_QUOTA = f"""
[quotas.groups.{MY_GROUP}]
max_running_gpus = 2
[quotas.groups.{MY_GROUP}.day]
hours = "09:00-18:00"
max_running_gpus = 1
[quotas.users.{ME}]
max_queued_jobs = 4
"""


def test_a_window_closing_starts_the_jobs_it_held_and_its_reason_names_the_quota(make_box):
    box = make_box("4x80GiB", DAY_QUOTA)
    to_local(box, "17:00")
    ids = [box.submit("--gpus", "1", "--", "true") for _ in range(3)]
    assert box.states(*ids) == ["running", "pending", "pending"]
    assert box.show(ids[1])["pending_reason"] == (
        f"quota groups.{MY_GROUP} max_running_gpus=1 (day, until 18:00): {ME} holds 1 GPU"
    )
    # No request at 18:00: the loop's own timer runs the pass once the window closes.
    to_local(box, "17:59")
    assert box.states(*ids) == ["running", "pending", "pending"]
    to_local(box, "18:00")
    assert box.states(*ids) == ["running", "running", "pending"]
    assert box.show(ids[2])["pending_reason"] == (
        f"quota groups.{MY_GROUP} max_running_gpus=2 (until 09:00): {ME} holds 2 GPUs"
    )
    # Another user (in no group, no default quota) is not held by it.
    theirs = box.submit("--gpus", "1", "--", "true", creds=(ME[0], 54321, 54321))
    assert box.show(theirs)["state"] == "running"
    # max_queued_jobs counts pending and running jobs: a fifth is refused, whole.
    box.submit("--gpus", "1", "--", "true")
    with pytest.raises(GpuschedError, match=rf"over quota users.{ME} max_queued_jobs=4; nothing"):
        box.submit("--gpus", "1", "--", "true")
    assert len(box.call("list", all=True)["jobs"]) == 5


def test_a_changed_quota_applies_on_restart_and_the_queue_stays(make_box):
    box = make_box("4x80GiB", "[quotas.default]\nmax_running_jobs = 1\n")
    ids = [box.submit("--gpus", "1", "--", "true") for _ in range(3)]
    assert box.states(*ids) == ["running", "pending", "pending"]
    assert box.show(ids[1])["pending_reason"] == (
        f"quota default max_running_jobs=1: {ME} runs 1 job"
    )
    box.configure("[quotas.default]\nmax_running_jobs = 2\n")
    box.restart()
    assert box.states(*ids) == ["running", "running", "pending"]


def test_max_gpu_mem_counts_whole_gpus_and_gpu_mem(make_box):
    box = make_box("4x80GiB", '[quotas.default]\nmax_gpu_mem = "100GiB"\n')
    whole = box.submit("--gpus", "1", "--", "true")  # 80 GiB: a whole GPU
    shared = box.submit("--gpu-mem", "30G", "--", "true")
    small = box.submit("--gpu-mem", "20G", "--", "true")
    assert box.states(whole, shared, small) == ["running", "pending", "running"]
    assert box.show(shared)["pending_reason"] == (
        f"quota default max_gpu_mem=100.0 GiB: {ME} holds 80.0 GiB"
    )
    usage = box.call("usage", since_s=None, by="user")
    mine = {row["key"]: row for row in usage["quotas"] if row["user"] == ME}
    assert mine["max_gpu_mem"]["used"] == 100 * 2**30
    assert mine["max_gpu_mem"]["quota"] == "quota default max_gpu_mem=100.0 GiB"


def test_a_job_its_quota_holds_preempts_nobody(make_box):
    config = '[preemption]\nmin_run_before_preempt = "0s"\n[quotas.default]\nmax_running_gpus = 1\n'
    box = make_box("2x80GiB", config)
    mine = box.submit("--gpus", "1", "--", "true")
    theirs = box.submit("--gpus", "1", "--preemptible", "--", "true", creds=(ME[0], 54321, 54321))
    urgent = box.submit("--gpus", "1", "--priority", "10", "--", "true")
    box.step()
    box.step(60)
    assert box.states(mine, theirs, urgent) == ["running", "running", "pending"]
    assert box.shims.signalled(theirs) == []
    assert box.show(urgent)["pending_reason"] == (
        f"quota default max_running_gpus=1: {ME} holds 1 GPU"
    )


# -- the CLI (e2e) --------------------------------------------------------------------------
def test_usage_shows_each_quota_and_submit_refuses_past_max_queued_jobs(home):
    home.write_config(
        "[quotas.default]\nmax_running_jobs = 1\nmax_queued_jobs = 2\n"
        f"[quotas.users.{ME}]\nmax_running_gpus = 3\n"
    )
    home.start()
    first = home.submit("--gpus", "1", "--", "sleep", "600")
    second = home.submit("--gpus", "1", "--", "true")
    home.wait_state(first, "running")
    reason = f"quota default max_running_jobs=1: {ME} runs 1 job"
    wait_until(lambda: home.show(second)["pending_reason"] == reason, "the quota's reason")
    refused = home.run("submit", "--", "true", check=False)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("Error: user ")
    assert "over quota default max_queued_jobs=2; nothing was queued" in refused.stderr
    text = home.run("usage").stdout
    assert "quotas now" in text
    assert f"{ME}  max_running_gpus  1     3      users.{ME}\n" in text
    rows = json.loads(home.run("usage", "--json").stdout)["quotas"]
    assert {(r["key"], r["used"], r["limit"]) for r in rows if r["user"] == ME} == {
        ("max_running_jobs", 1, 1),
        ("max_queued_jobs", 2, 2),
        ("max_running_gpus", 1, 3),
    }
    home.run("cancel", str(first), str(second))
