"""`gpusched usage` as a user runs it: a real daemon in a temporary home, real jobs."""

from __future__ import annotations

import pytest


def ran_gpu_s(home, job_id: int) -> float:
    job = home.show(job_id)
    return (job["ended_at"] - job["started_at"]) * len(job["gpu_indices"])


def test_usage_sums_gpu_time_and_ends_per_user_and_keeps_removed_jobs(home):
    home.write_config("[jobs]\nkeep_finished_count = 1\n")
    first = home.submit("--gpus", "2", "--", "sleep", "0.2")
    home.wait_state(first, "succeeded")
    gpu_s = ran_gpu_s(home, first)
    second = home.submit("--gpus", "1", "--name", "eval", "--", "false")
    home.wait_state(second, "failed")
    gpu_s += ran_gpu_s(home, second)
    report = home.json("usage")
    (me,) = report["groups"]
    assert me["jobs"] == 2 and me["states"] == {"failed": 1, "succeeded": 1}
    assert me["gpu_seconds"] == pytest.approx(gpu_s)
    text = home.run("usage").stdout
    # STATES, not ENDED: the column counts running and pending jobs too.
    assert text.splitlines()[1].split() == [
        "USER",
        "JOBS",
        "GPU-H",
        "MEM",
        "GiB-H",
        "MEAN",
        "WAIT",
        "PEAK/ASK",
        "ASK>2X",
        "STATES",
    ]
    assert "failed 1 succeeded 1" in text
    # Retention keeps one finished job: the first goes, and still counts.
    home.run("gc")
    assert [j["id"] for j in home.jobs()] == [second]
    after = home.json("usage")
    assert after["removed_jobs"] == {"jobs": 1, "included": True}
    assert after["groups"][0]["jobs"] == 2
    assert after["groups"][0]["gpu_seconds"] == pytest.approx(gpu_s)
    week = home.run("usage", "--since", "7d")
    assert "not counted: 1 job(s) removed" in week.stdout
    by_name = home.json("usage", "--by", "name", "--since", "1d")
    assert [line["key"] for line in by_name["groups"]] == ["eval"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--by", "group"], "--by 'group': choose one of user, name"),
        (["--since", "lately"], "--since 'lately'"),
    ],
)
def test_bad_options_are_one_line_errors(home, args, message):
    proc = home.run("usage", *args, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith(f"Error: {message}")
    assert len(proc.stderr.strip().splitlines()) == 1
