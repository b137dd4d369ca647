"""Pure job lifecycle and job specs: how runs end, retries, time limits, Slurm-style syntax."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import replace

import pytest

from gpusched.core import lifecycle
from gpusched.core.errors import UsageError
from gpusched.core.lifecycle import TERMINATE, WARN
from gpusched.core.models import Constraints, IllegalTransition, Inventory, Job, JobState, Request
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import QueueRules
from gpusched.core.sched.scheduling import schedule
from gpusched.core.spec import jobspec, syntax
from gpusched.proc import spawn

POLICIES = ["pack", "spread", "round-robin", "weighted-round-robin", "order"]


def running(**changes) -> Job:
    job = Job(
        id=7,
        command=("python", "train.py"),
        cwd="/",
        uid=1000,
        user="alice",
        state=JobState.RUNNING,
        started_at=1000.0,
        gpu_uuids=("GPU-a",),
        gpu_indices=(0,),
        master_port=29500,
        runner_pid=4242,
        runner_start_time=999.5,
    )
    return replace(job, **changes)


# -- end_state ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "exit_code, error, flags, expected",
    [
        (0, "", {}, JobState.SUCCEEDED),
        (1, "", {}, JobState.FAILED),
        (None, "", {}, JobState.FAILED),  # killed by a signal
        (0, "cannot start: No such file", {}, JobState.FAILED),
        (None, "", {"cancel_requested": True}, JobState.CANCELLED),
        (0, "", {"cancel_requested": True}, JobState.CANCELLED),  # it caught TERM and exited 0
        (None, "", {"timed_out": True}, JobState.TIMEOUT),
        (0, "", {"timed_out": True}, JobState.TIMEOUT),
        # Cancelled while it was being stopped for its limit: the limit came first.
        (None, "", {"timed_out": True, "cancel_requested": True}, JobState.TIMEOUT),
    ],
)
def test_end_state(exit_code, error, flags, expected):
    assert lifecycle.end_state(running(**flags), exit_code, error) is expected


# -- end_reason -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "state, exit_code, signum, error, flags, expected",
    [
        (
            JobState.CANCELLED,
            None,
            signal.SIGTERM,
            "",
            {"end_reason": "cancelled by bob"},
            "cancelled by bob while running (SIGTERM)",
        ),
        (
            JobState.CANCELLED,
            None,
            signal.SIGKILL,
            "",
            {"end_reason": "cancelled by bob"},
            "cancelled by bob while running (SIGKILL once the grace period after SIGTERM ran out)",
        ),
        (
            JobState.CANCELLED,
            0,
            None,
            "",
            {"end_reason": "cancelled by bob"},
            "cancelled by bob while running (it exited with status 0 after SIGTERM)",
        ),
        (JobState.CANCELLED, None, signal.SIGTERM, "", {}, "cancelled while running (SIGTERM)"),
        (
            JobState.TIMEOUT,
            None,
            signal.SIGTERM,
            "",
            {"time_limit_s": 60.0},
            "time limit of 1m00s reached (SIGTERM)",
        ),
        (
            JobState.TIMEOUT,
            None,
            signal.SIGKILL,
            "",
            {"time_limit_s": 5400.0},
            "time limit of 1h30m reached (SIGKILL once the grace period after SIGTERM ran out)",
        ),
        (
            JobState.OOM,
            None,
            signal.SIGKILL,
            "",
            {"request": Request(mem_bytes=2**30)},
            "used more host memory than its --mem of 1.0 GiB (enforce_mem) (SIGKILL)",
        ),
        (JobState.FAILED, 1, None, "", {}, ""),
        (JobState.SUCCEEDED, 0, None, "", {}, ""),
        (
            JobState.FAILED,
            127,
            None,
            "cannot start: no such command",
            {},
            "cannot start: no such command",
        ),
    ],
)
def test_end_reason_says_what_ended_the_run(state, exit_code, signum, error, flags, expected):
    assert lifecycle.end_reason(running(**flags), state, exit_code, signum, error) == expected


# -- finish and retries -------------------------------------------------------------------
def test_a_run_without_retries_ends_for_good():
    job = lifecycle.finish(
        running(), JobState.FAILED, 2000.0, exit_code=3, signal=None, end_reason=""
    )
    assert job.state is JobState.FAILED
    assert (job.ended_at, job.exit_code, job.attempt) == (2000.0, 3, 1)
    assert job.gpu_uuids == ("GPU-a",)  # a finished job keeps the record of where it ran


def test_a_failed_run_is_requeued_while_retries_last():
    job = running(retries=2, warned=True, cancel_requested=False)
    for attempt in (1, 2):
        job = replace(
            job,
            attempt=attempt,
            state=JobState.RUNNING,
            started_at=1000.0 + attempt,
            gpu_uuids=("GPU-a",),
            gpu_indices=(0,),
            runner_pid=4242,
            warned=True,
        )
        job = lifecycle.finish(job, JobState.FAILED, 2000.0 + attempt, exit_code=1, signal=None)
        assert job.state is JobState.PENDING
        assert job.attempt == attempt + 1
        # The next attempt waits: 10 s after the first failure, doubling after each.
        delay = 10.0 * 2 ** (attempt - 1)
        assert job.eligible_at == 2000.0 + attempt + delay
        assert (
            job.pending_reason
            == f"retrying after attempt {attempt} failed; eligible in {delay:.0f}s"
        )
        # Everything about the old run is gone, so the next one starts clean.
        assert (job.started_at, job.gpu_uuids, job.gpu_indices, job.runner_pid) == (
            None,
            (),
            (),
            None,
        )
        assert (job.master_port, job.runner_start_time, job.ended_at) == (None, None, None)
        assert not job.warned and not job.timed_out and not job.cancel_requested
        assert job.exit_code == 1  # the last attempt's status stays visible
    job = replace(job, state=JobState.RUNNING, started_at=1003.0)
    final = lifecycle.finish(job, JobState.FAILED, 2003.0, exit_code=1, signal=None)
    assert (final.state, final.attempt, final.ended_at) == (JobState.FAILED, 3, 2003.0)


@pytest.mark.parametrize(
    "delay_s, attempt, expected_s",
    [
        (10.0, 1, 10.0),
        (10.0, 2, 20.0),
        (10.0, 5, 160.0),
        (10.0, 6, 300.0),
        (10.0, 1000, 300.0),
        (1.0, 3, 4.0),
        (0.0, 4, 0.0),
        (3600.0, 1, 3600.0),
        (3600.0, 3, 3600.0),
    ],
)
def test_the_retry_delay_doubles_up_to_five_minutes_or_its_own_length(delay_s, attempt, expected_s):
    job = running(retries=1000, attempt=attempt, retry_delay_s=delay_s)
    assert lifecycle.retry_delay_s(job) == expected_s
    again = lifecycle.finish(job, JobState.FAILED, 2000.0)
    assert again.eligible_at == 2000.0 + expected_s


def test_a_retry_waits_for_its_time_with_the_reason_counting_down():
    job = lifecycle.finish(
        running(retries=1, retry_on=("failed", "timeout")), JobState.TIMEOUT, 2000.0
    )
    pending = [job, replace(job, id=8, eligible_at=None)]
    plan = schedule(pending, [], {}, Inventory(), PlacementRules(), QueueRules(), now=2003.5)
    assert [job_id for job_id, _ in plan.starts] == [8]
    assert plan.reasons[7] == "retrying after attempt 1 timed out; eligible in 7s"
    plan = schedule(pending[:1], [], {}, Inventory(), PlacementRules(), QueueRules(), now=2010.0)
    assert [job_id for job_id, _ in plan.starts] == [7]


@pytest.mark.parametrize(
    "state", [JobState.CANCELLED, JobState.TIMEOUT, JobState.LOST, JobState.SUCCEEDED]
)
def test_only_failures_are_retried_by_default(state):
    job = lifecycle.finish(running(retries=5), state, 2000.0)
    assert job.state is state and job.attempt == 1


@pytest.mark.parametrize("state", [JobState.TIMEOUT, JobState.CANCELLED, JobState.LOST])
def test_retry_on_names_the_ends_that_requeue(state):
    job = running(retries=1, retry_on=(state.value,), timed_out=True, cancel_requested=True)
    again = lifecycle.finish(job, state, 2000.0)
    assert again.state is JobState.PENDING and again.attempt == 2
    assert not again.timed_out and not again.cancel_requested
    # ...and with retry_on given, a plain failure is no longer retried.
    assert lifecycle.finish(job, JobState.FAILED, 2000.0).state is JobState.FAILED


def test_success_is_never_retried_even_if_asked():
    with pytest.raises(UsageError):
        jobspec.check_job_spec({"command": ["true"], "retry_on": ["succeeded"]}, POLICIES)


def test_finish_goes_through_the_state_machine():
    pending = running(state=JobState.PENDING, retries=3)
    with pytest.raises(IllegalTransition):
        lifecycle.finish(pending, JobState.FAILED, 2000.0)
    with pytest.raises(IllegalTransition):
        lifecycle.finish(running(state=JobState.SUCCEEDED), JobState.FAILED, 2000.0)


# -- time limits ----------------------------------------------------------------------------
def test_no_limit_means_no_action():
    assert lifecycle.next_limit_action(running()) is None
    assert lifecycle.limit_deadline(running()) is None
    # Not started yet: the clock has not begun.
    assert lifecycle.next_limit_action(running(time_limit_s=60.0, started_at=None)) is None


def test_a_limit_without_a_warning_terminates_at_the_deadline():
    job = running(time_limit_s=60.0)
    assert lifecycle.limit_deadline(job) == 1060.0
    assert lifecycle.next_limit_action(job) == (1060.0, TERMINATE)
    after, signum = lifecycle.apply_limit_action(job, TERMINATE)
    assert signum == signal.SIGTERM and after.timed_out
    assert lifecycle.next_limit_action(after) is None  # TERM once; the shim sends KILL later


def test_the_warning_comes_first_then_the_termination():
    job = running(time_limit_s=3600.0, warn_signal=int(signal.SIGUSR1), warn_before_s=120.0)
    assert lifecycle.next_limit_action(job) == (4480.0, WARN)
    warned, signum = lifecycle.apply_limit_action(job, WARN)
    assert signum == signal.SIGUSR1 and warned.warned and not warned.timed_out
    assert lifecycle.next_limit_action(warned) == (4600.0, TERMINATE)
    ended, signum = lifecycle.apply_limit_action(warned, TERMINATE)
    assert signum == signal.SIGTERM and ended.timed_out
    assert lifecycle.next_limit_action(ended) is None


def test_a_warning_longer_than_the_limit_is_due_at_once():
    job = running(time_limit_s=30.0, warn_signal=int(signal.SIGUSR2), warn_before_s=120.0)
    when, action = lifecycle.next_limit_action(job)
    assert action == WARN and when < job.started_at


# -- --signal -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("USR1@120", (signal.SIGUSR1, 120.0)),
        ("SIGUSR2@60", (signal.SIGUSR2, 60.0)),
        ("usr1@2.5", (signal.SIGUSR1, 2.5)),
        (f"{int(signal.SIGUSR1)}@30", (signal.SIGUSR1, 30.0)),
        ("USR1", (signal.SIGUSR1, 60.0)),  # Slurm's default: 60 s before the limit
        ("B:USR2@10", (signal.SIGUSR2, 10.0)),  # Slurm's batch-shell prefix is accepted
        ("INT@0", (signal.SIGINT, 0.0)),
        ("TERM@30", (signal.SIGTERM, 30.0)),
    ],
)
def test_parse_signal_spec(text, expected):
    assert syntax.parse_signal_spec(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "@30",
        "FOO@30",
        "USR1@soon",
        "USR1@-5",
        "0@30",
        "999@30",
        "USR1@30@4",
        "USR1@nan",
        "USR1@inf",
        "SIG_IGN@5",
        "SIG_SETMASK",
        # Signals the job's shim does not pass on: the warning must reach the job, and must
        # neither stop nor kill the shim (SIGALRM is its own SIGKILL timer).
        "KILL@10",
        "STOP@10",
        "ALRM@10",
        "CHLD@10",
        "WINCH@10",
        "9@10",
    ],
)
def test_parse_signal_spec_refuses_bad_input(text):
    with pytest.raises(ValueError, match="--signal"):
        syntax.parse_signal_spec(text)


def test_every_warning_signal_is_one_the_shim_forwards():
    assert set(syntax.warn_signals()) <= set(spawn.FORWARDED)
    for signum in syntax.warn_signals():
        assert syntax.parse_signal_spec(signal.Signals(signum).name)[0] == signum


# -- --array --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, indices, throttle",
    [
        ("0-5", tuple(range(6)), None),
        ("0-99%8", tuple(range(100)), 8),
        ("7", (7,), None),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("0-15:4", (0, 4, 8, 12), None),
        ("1-10:3%2", (1, 4, 7, 10), 2),
        ("5-7,1,6", (1, 5, 6, 7), None),  # sorted, duplicates once
        (" 1 , 2 ", (1, 2), None),
        ("3-3", (3,), None),
    ],
)
def test_parse_array(text, indices, throttle):
    assert syntax.parse_array(text) == (indices, throttle)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "--array wants"),
        ("a-b", "--array wants"),
        ("-1", "--array wants"),
        ("1,,2", "--array wants"),
        ("0-5:", "--array wants"),
        ("5-3", "is empty"),
        ("0-10:0", "the step after .:. must be 1 or more"),
        ("0-5%0", "positive count"),
        ("0-5%x", "positive count"),
        ("0-5%-1", "positive count"),
        ("0-1000000", "more than 1000000"),
        ("0-999999,1000000-1000005", "more than 1000000"),
        ("1099511627776", "an index is at most 999,999"),  # issue 32: 2**40 was queued
        ("0-2000000:1000000", "an index is at most 999,999"),
    ],
)
def test_parse_array_refuses_bad_specs(text, words):
    with pytest.raises(UsageError, match=words):
        syntax.parse_array(text)


def test_a_huge_array_range_is_refused_without_building_it():
    started = time.monotonic()
    with pytest.raises(UsageError, match="more than 1000000"):
        syntax.parse_array("0-999999999999")
    assert time.monotonic() - started < 1.0


# -- dependencies ---------------------------------------------------------------------------
def test_parse_dependencies():
    assert syntax.parse_dependencies(["3,4", "5"], []) == [
        ("afterok", 3),
        ("afterok", 4),
        ("afterok", 5),
    ]
    assert syntax.parse_dependencies([], ["afterok:3:4,afterany:5", "afternotok:6"]) == [
        ("afterok", 3),
        ("afterok", 4),
        ("afterany", 5),
        ("afternotok", 6),
    ]
    assert syntax.parse_dependencies([" 3 , 4 "], []) == [("afterok", 3), ("afterok", 4)]
    assert syntax.parse_dependencies([], []) == []


@pytest.mark.parametrize(
    "after, dependency, words",
    [
        (["x"], [], "--after: 'x' is not a job id"),
        (["-3"], [], "is not a job id"),
        ([], ["before:3"], "KIND one of afterok, afterany, afternotok, after"),
        ([], ["afterok"], "KIND:ID"),
        ([], ["afterok:"], "is not a job id"),
        ([], ["afterok:3:y"], "--dependency: 'y' is not a job id"),
        ([], ["afterok:3?afterok:4", "afterany:5"], "mixes '.' .any of."),
    ],
)
def test_parse_dependencies_refuses_bad_input(after, dependency, words):
    with pytest.raises(UsageError, match=words):
        syntax.parse_dependencies(after, dependency)


# -- check_job_spec -------------------------------------------------------------------------
def test_a_full_job_spec_is_checked_into_job_fields():
    spec = {
        "command": ["python", "train.py"],
        "name": "t",
        "gpus": 2,
        "gpu_mem_bytes": 2**30,
        "priority": -5,
        "hold": True,
        "dependencies": [["afterok", 3], ["afterany", 4]],
        "kill_on_invalid_dep": True,
        "time_limit_s": 90,
        "warn_signal": 10,
        "warn_before_s": 30,
        "retries": 2,
        "retry_on": ["failed", "timeout"],
        "policy": "spread",
        "constraints": {
            "gpu_ids": [0, 2],
            "exclude_gpus": [1],
            "gpu_type": "H100",
            "min_gpu_total_mem_bytes": 40 * 2**30,
            "min_compute_capability": [8, 0],
        },
    }
    fields = jobspec.check_job_spec(spec, POLICIES)
    # A GPU job that did not ask for cores is counted as using one, and never waits for it.
    assert fields["request"] == Request(
        2, 2**30, Constraints((0, 2), (1,), "H100", 40 * 2**30, (8, 0)), cpus=1, cpus_required=False
    )
    assert fields["command"] == ("python", "train.py")
    assert fields["dependencies"] == (("afterok", 3), ("afterany", 4))
    assert fields["held"] and fields["kill_on_invalid_dep"]
    assert (fields["time_limit_s"], fields["warn_signal"], fields["warn_before_s"]) == (
        90.0,
        10,
        30.0,
    )
    assert (fields["retries"], fields["retry_on"], fields["policy"]) == (
        2,
        ("failed", "timeout"),
        "spread",
    )
    assert fields["priority"] == -5
    Job(id=1, cwd="/", uid=0, user="root", **fields)  # every field is one of Job's


def test_a_minimal_job_spec_gets_the_defaults():
    fields = jobspec.check_job_spec({"command": ["true"]}, POLICIES)
    assert fields["request"] == Request()
    assert (fields["priority"], fields["held"], fields["dependencies"]) == (0, False, ())
    assert (fields["time_limit_s"], fields["warn_signal"], fields["retries"]) == (None, None, 0)
    assert fields["retry_on"] == ("failed",) and fields["policy"] == ""
    assert fields["retry_delay_s"] == 10.0


@pytest.mark.parametrize(
    "spec, cpus, required",
    [
        ({}, 1, True),  # a job without GPUs needs its core
        ({"gpus": 1}, 1, False),
        ({"gpus": 1, "cpus": 1}, 1, True),
        ({"gpus": 1, "cpus": 0}, 0, True),
        ({"cpus": 0}, 0, True),
    ],
)
def test_cores_are_a_limit_when_asked_for_or_without_gpus(spec, cpus, required):
    request = jobspec.check_job_spec({"command": ["true"], **spec}, POLICIES)["request"]
    assert (request.cpus, request.cpus_required) == (cpus, required)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"command": []}, "no command"),
        ({"command": "true"}, "no command"),
        ({"command": ["true", 3]}, "no command"),
        ({"command": [""]}, "no command"),
        ({"name": 5}, "name must be a string"),
        ({"name": "x\0y"}, "without NUL"),
        ({"gpus": True}, "gpus must be a whole number"),
        ({"gpus": 1.5}, "gpus must be a whole number"),
        ({"gpus": -1}, "gpus must be a whole number"),
        ({"gpus": 65}, "gpus must be a whole number"),
        ({"gpus": "2"}, "gpus must be a whole number"),
        ({"gpu_mem_bytes": 2**30}, "needs at least one GPU"),
        ({"gpus": 1, "gpu_mem_bytes": 0}, "--gpu-mem (in bytes) must be"),
        ({"priority": 10**7}, "priority must be"),
        ({"priority": "high"}, "priority must be"),
        ({"constraints": {"gpu_type": "H100"}}, "need --gpus 1 or more"),
        ({"gpus": 1, "constraints": "H100"}, "constraints must be a JSON object"),
        ({"gpus": 1, "constraints": {"gpu_ids": [-1]}}, "gpu-ids must be a list"),
        ({"gpus": 1, "constraints": {"exclude_gpus": "3"}}, "exclude-gpus must be a list"),
        ({"gpus": 1, "constraints": {"gpu_type": 5}}, "--gpu-type must be a string"),
        ({"gpus": 1, "constraints": {"min_compute_capability": [8]}}, "MAJOR.MINOR"),
        ({"gpus": 1, "constraints": {"min_compute_capability": "8.0"}}, "MAJOR.MINOR"),
        (
            {"gpus": 1, "constraints": {"min_gpu_total_mem_bytes": -1}},
            "--min-gpu-total-mem (in bytes)",
        ),
        (
            {"policy": "fastest"},
            "unknown policy 'fastest'; choose one of: pack, spread, round-robin, "
            "weighted-round-robin, order",
        ),
        ({"retry_on": ["sometimes"]}, "--retry-on takes: failed, timeout"),
        ({"retry_on": "failed"}, "--retry-on takes"),
        ({"dependencies": [["afterok", "3"]]}, "dependencies must be"),
        ({"dependencies": [["afterok", True]]}, "dependencies must be"),
        ({"dependencies": [["before", 3]]}, "dependencies must be"),
        ({"dependencies": [["afterok", 3, 4]]}, "dependencies must be"),
        ({"dependencies": "afterok:3"}, "dependencies must be"),
        ({"time_limit_s": 0.5}, "--time (in seconds) must be a number of at least 1"),
        ({"time_limit_s": "1h"}, "--time (in seconds) must be a number"),
        ({"time_limit_s": True}, "--time (in seconds) must be a number"),
        ({"time_limit_s": math.nan}, "--time (in seconds) must be a number"),
        ({"time_limit_s": math.inf}, "--time (in seconds) must be a number"),
        ({"time_limit_s": 60, "warn_signal": 0}, "--signal must be"),
        ({"time_limit_s": 60, "warn_signal": 65}, "--signal must be"),
        ({"time_limit_s": 60, "warn_signal": int(signal.SIGKILL)}, "--signal must be"),
        ({"time_limit_s": 60, "warn_signal": int(signal.SIGALRM)}, "--signal must be"),
        (
            {"time_limit_s": 60, "warn_signal": 10, "warn_before_s": -1},
            "--signal's @SECONDS (in seconds) must be",
        ),
        (
            {"time_limit_s": 60, "warn_signal": 10, "warn_before_s": math.nan},
            "--signal's @SECONDS (in seconds) must be",
        ),
        ({"retries": -1}, "retries must be"),
        ({"retries": 1001}, "retries must be"),
        ({"retry_delay_s": -1}, "--retry-delay (in seconds) must be"),
        ({"retry_delay_s": math.inf}, "--retry-delay (in seconds) must be"),
        ({"cpus": -1}, "cpus must be"),
    ],
)
def test_check_job_spec_rejects_bad_values(change, words):
    spec = {"command": ["true"], **change}
    with pytest.raises(UsageError) as caught:
        jobspec.check_job_spec(spec, POLICIES)
    assert words in caught.value.message


def test_check_job_spec_rejects_what_is_not_an_object():
    for spec in (None, [], "true", 3):
        with pytest.raises(UsageError, match="JSON object"):
            jobspec.check_job_spec(spec, POLICIES)
