"""`ls --user/--me/--state/--name` select in the daemon; `ls --format` prints plain columns."""

from __future__ import annotations

import json
import os
import pwd

import pytest

from conftest import Home
from gpusched.cli import listing
from gpusched.core import jobfilter
from test_cli_errors import assert_one_error_line

ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    """Jobs in four states: a succeeded, a failed, a running and a held one."""
    root = tmp_path_factory.mktemp("ls")
    home = Home(root / "home")
    home.write_config()
    gate = root / "go"
    home.ok = home.submit("--name", "sweep-1", "--", "true")
    home.bad = home.submit("--name", "sweep-2", "--", "sh", "-c", "exit 4")
    home.busy = home.submit(
        "--gpus",
        "1",
        "--name",
        "train",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {gate} ]; do sleep 0.05; done",
    )
    home.held = home.submit("--hold", "--name", "eval", "--", "true")
    for job, state in ((home.ok, "succeeded"), (home.bad, "failed"), (home.busy, "running")):
        home.wait_state(job, state)
    yield home
    gate.touch()
    home.cleanup()


def ids(home: Home, *args: str) -> list[int]:
    return [job["id"] for job in json.loads(home.run("ls", "--json", *args).stdout)]


@pytest.mark.e2e
def test_state_filters_and_a_finished_state_implies_all(queue):
    assert ids(queue, "--state", "running") == [queue.busy]
    assert ids(queue, "--state", "pending,running") == [queue.busy, queue.held]
    assert ids(queue, "--state", "PD") == [queue.held]  # Slurm's codes too
    assert ids(queue, "--state", "failed") == [queue.bad]
    assert ids(queue, "-t", "succeeded,F") == [queue.ok, queue.bad]


def test_slurms_oom_selects_both_ways_to_run_out_of_memory():
    # ls shows host (oom) and GPU (gpu_oom) out of memory alike as OOM: the filter agrees.
    assert jobfilter.parse_states("OOM") == ["oom", "gpu_oom"]
    assert jobfilter.parse_states("out_of_memory,R") == ["oom", "gpu_oom", "running"]
    assert jobfilter.parse_states("gpu_oom") == ["gpu_oom"]


@pytest.mark.e2e
def test_a_wrong_state_lists_the_valid_ones(queue):
    err = assert_one_error_line(queue.run("ls", "--state", "done", check=False), 2, "'done'")
    assert "pending, running, succeeded, failed, cancelled, timeout, oom, lost" in err


@pytest.mark.e2e
def test_name_and_user_filters(queue):
    assert ids(queue, "--all", "--name", "sweep-*") == [queue.ok, queue.bad]
    assert ids(queue, "--name", "sweep-*") == []  # finished: only with --all
    assert ids(queue, "--name", "train,eval") == [queue.busy, queue.held]
    assert ids(queue, "--user", ME) == [queue.busy, queue.held]
    assert ids(queue, "--me", "--state", "running") == [queue.busy]
    other = next(p.pw_name for p in pwd.getpwall() if p.pw_uid != os.getuid())
    assert ids(queue, "--all", "--user", other) == []
    assert_one_error_line(
        queue.run("ls", "--user", "no-such-user-x", check=False), 2, "'no-such-user-x'"
    )
    assert "no jobs match" in queue.run("ls", "--name", "nothing-*").stdout


@pytest.mark.e2e
def test_format_prints_plain_columns_with_slurm_field_names(queue):
    out = queue.run(
        "ls",
        "--all",
        "--format",
        "JobID,user,name,state,st,exitcode,gpus,reason",
        "--name",
        "sweep-*,eval",
    ).stdout
    assert out.splitlines()[0].split() == [
        "JOBID",
        "USERNAME",
        "NAME",
        "STATE",
        "STATECOMPACT",
        "EXITCODE",
        "GPUS",
        "REASON",
    ]
    rows = [line.split(None, 7) for line in out.splitlines()[1:]]
    assert rows[0] == [str(queue.ok), ME, "sweep-1", "succeeded", "CD", "0:0", "0", "N/A"]
    assert rows[1] == [str(queue.bad), ME, "sweep-2", "failed", "F", "4:0", "0", "N/A"]
    assert rows[2][:5] == [str(queue.held), ME, "eval", "pending", "PD"]
    assert rows[2][7].startswith("held (")
    # Columns line up, for a person reading them too.
    header, *lines = out.splitlines()
    column = header.index("REASON")
    assert all(line[column - 1] == " " and line[column] != " " for line in lines)
    bare = queue.run("ls", "--format", "jobid,state", "--noheader", "--state", "running").stdout
    assert bare == f"{queue.busy}  running\n"


@pytest.mark.e2e
def test_format_errors_name_the_valid_fields(queue):
    err = assert_one_error_line(
        queue.run("ls", "--format", "jobid,colour", check=False), 2, "'colour'"
    )
    assert "jobid" in err and "timeused" in err
    assert_one_error_line(
        queue.run("ls", "--json", "--format", "jobid", check=False), 2, "--json", "--format"
    )


@pytest.mark.e2e
def test_json_respects_the_filters(queue):
    jobs = json.loads(queue.run("ls", "--json", "--all", "--state", "failed").stdout)
    assert [j["id"] for j in jobs] == [queue.bad] and jobs[0]["exit_code"] == 4


@pytest.mark.e2e
def test_the_daemon_checks_the_filters_it_is_sent(queue):
    from gpusched.client.connection import Client
    from gpusched.client.paths import resolve_paths
    from gpusched.core.errors import UsageError

    client = Client(resolve_paths(queue.env), autostart=False)
    for bad in ({"states": ["done"]}, {"users": "root"}, {"names": []}):
        with pytest.raises(UsageError):
            client.call("list", **bad)
    assert [j["id"] for j in client.call("list", states=["running"])["jobs"]] == [queue.busy]


def test_slurm_time_and_size_formats():
    assert [listing.slurm_duration(s) for s in (0, 59, 61, 3600, 3661, 90061, None)] == [
        "0:00",
        "0:59",
        "1:01",
        "1:00:00",
        "1:01:01",
        "1-01:01:01",
        "N/A",
    ]
    assert [listing.compact_size(b) for b in (None, 512, 2**20, 3 * 2**29, 20 * 2**30)] == [
        "N/A",
        "512B",
        "1M",
        "1.5G",
        "20G",
    ]
