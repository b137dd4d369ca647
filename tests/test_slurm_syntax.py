"""Slurm's syntax as users type it: job ids (12, 12_3) and `submit`'s Slurm-named options.

Pure parsing; tests/test_job_ids.py runs the important forms through the CLI and a daemon.
"""

from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.cli.commands.submit_cmds import fold_yes_no
from gpusched.client.submit.submitting import submit_json
from gpusched.core.errors import UsageError
from gpusched.core.models import Job, JobState
from gpusched.core.sched.scheduling import dependency_status
from gpusched.core.spec import syntax
from gpusched.daemon.jobs.arrays import array_state as _array_state

MiB, GiB = 2**20, 2**30


# -- job ids --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("12", (12, None)),
        ("12_3", (12, 3)),
        ("0", (0, None)),
        ("007_02", (7, 2)),
        (12, (12, None)),  # a number, as older clients send it
        (str(syntax.MAX_JOB_ID), (syntax.MAX_JOB_ID, None)),
    ],
)
def test_parse_job_id(text, expected):
    assert syntax.parse_job_id(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "5_",  # `cancel ${ARR}_${IDX}` with an empty IDX: never the whole array
        "_3",
        "5__3",
        "4_7_1",
        "-1",
        "+5",
        "12_-1",
        "x",
        "4.0",
        "1e3",
        "",
        " 5",
        "5 ",
        "\u0663",  # an Arabic-Indic three: a digit to str.isdigit, not a job id
        str(syntax.MAX_JOB_ID + 1),
        -3,
        True,
        None,
        4.0,
    ],
)
def test_parse_job_id_refuses_and_names_the_value(text):
    with pytest.raises(UsageError) as caught:
        syntax.parse_job_id(text)
    message = caught.value.message
    shown = repr(str(text)) if type(text) is int else repr(text)  # a number is read as text
    assert message.startswith(f"{shown} is not a job id; give an ID like 12, or ARRAY_INDEX")
    assert "\n" not in message


def test_a_job_id_is_sent_in_its_plain_form():
    assert syntax.job_id_text("012_03") == "12_3"
    assert syntax.job_id_text("12") == "12"
    assert syntax.job_id_text(12) == "12"


# -- --time ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 90 * 60),  # a bare number is minutes, as in Slurm
        ("1", 60),
        ("0:30", 30),  # M:S
        ("1:30", 90),
        ("1:02:03", 3723),  # H:M:S
        ("2-3", 2 * 86400 + 3 * 3600),  # D-H
        ("2-3:04", 2 * 86400 + 3 * 3600 + 4 * 60),  # D-H:M
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),  # D-H:M:S
        ("1:75", 135),  # as Slurm adds the fields up
        (" 5 ", 300),
        ("45s", 45),  # gpusched's own forms stay
        ("2h30m", 9000),
        ("1.5h", 5400),
        ("1d", 86400),
        ("2H", 7200),
    ],
)
def test_parse_time_limit(text, seconds):
    assert syntax.parse_time_limit(text) == seconds


@pytest.mark.parametrize(
    "text", ["0", "00", "0:00", "0-0", "0s", "UNLIMITED", "unlimited", "INFINITE", "Infinite"]
)
def test_zero_unlimited_and_infinite_mean_no_limit_as_in_slurm(text):
    assert syntax.parse_time_limit(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "1.5",  # Slurm refuses it too; a bare number is whole minutes
        "-1",
        "-5",
        "1-",
        "-1:00",
        "1:",
        ":30",
        "1:2:3:4",
        "1-2-3",
        "1-2:3:4:5",
        "abc",
        "",
        "1e3",
        "2h30",
        "1 d",
        "\u0663",
        "nan",
        "inf",
        "UNLIMITED2",
    ],
)
def test_parse_time_limit_refuses_and_names_the_value(text):
    with pytest.raises(UsageError) as caught:
        syntax.parse_time_limit(text)
    message = caught.value.message
    assert message.startswith(f"--time {text!r} is not a time limit; use minutes (90)")
    assert "as in Slurm" in message and "UNLIMITED" in message


def test_a_limit_under_a_second_is_refused():
    with pytest.raises(UsageError, match=r"--time '0.5s' is under the shortest limit, 1 s"):
        syntax.parse_time_limit("0.5s")


@given(st.integers(0, 400), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_slurm_time_fields_add_up(d, h, m, s):
    total = d * 86400 + h * 3600 + m * 60 + s
    assert syntax.parse_time_limit(f"{d}-{h:02d}:{m:02d}:{s:02d}") == (total or None)
    assert syntax.parse_time_limit(f"{h}:{m}:{s}") == (h * 3600 + m * 60 + s or None)
    assert syntax.parse_time_limit(f"{m}:{s}") == (m * 60 + s or None)
    assert syntax.parse_time_limit(str(m)) == (m * 60 or None)


# -- --gpus, --mem, --kill-on-invalid-dep ---------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("2", (2, "")),
        ("0", (0, "")),
        (" 3 ", (3, "")),
        ("a100:2", (2, "a100")),  # Slurm's TYPE:N: two GPUs whose name contains a100
        ("H100:1", (1, "H100")),
        ("rtx_4090:1", (1, "rtx_4090")),
    ],
)
def test_parse_gpus(text, expected):
    assert syntax.parse_gpus(text) == expected


@pytest.mark.parametrize(
    "text, words",
    [
        ("-1", "--gpus must be 0 or more, not -1"),
        ("a100:2,v100:1", "--gpus 'a100:2,v100:1' names several GPU types; a job takes one"),
        ("two", "--gpus wants N or TYPE:N like 2 or a100:2, not 'two'"),
        ("1.5", "not '1.5'"),
        ("a100:", "not 'a100:'"),
        (":2", "not ':2'"),
        ("a100:x", "not 'a100:x'"),
        ("", "not ''"),
        ("a100:-1", "not 'a100:-1'"),
    ],
)
def test_parse_gpus_refuses_and_names_the_value(text, words):
    with pytest.raises(UsageError, match=words):
        syntax.parse_gpus(text)


@pytest.mark.parametrize(
    "text, mem_bytes",
    [
        ("16000", 16000 * MiB),  # a bare number is megabytes (MiB), as in Slurm
        ("1", MiB),
        ("1.5", int(1.5 * MiB)),
        ("512M", 512 * MiB),
        ("16G", 16 * GiB),
        ("1.5G", int(1.5 * GiB)),
        ("1T", 2**40),
        ("100K", 100 * 1024),
        ("2048MiB", 2 * GiB),
        ("16GB", 16 * 10**9),
        ("16g", 16 * GiB),
    ],
)
def test_parse_mem(text, mem_bytes):
    assert syntax.parse_mem(text) == mem_bytes


@pytest.mark.parametrize(
    "text, words",
    [
        ("0", "--mem 0: Slurm's 0 .all of a node's memory. is not supported"),
        ("0G", "is not supported"),
        (
            "abc",
            "--mem wants a size like 16G or 512M .a bare number is MiB, as in Slurm., not 'abc'",
        ),
        ("-5", "not '-5'"),
        ("", "not ''"),
        ("16X", "not '16X'"),
    ],
)
def test_parse_mem_refuses_and_names_the_value(text, words):
    with pytest.raises(UsageError, match=words):
        syntax.parse_mem(text)


@pytest.mark.parametrize(
    "text, value", [("yes", True), ("no", False), ("YES", True), ("No", False)]
)
def test_parse_yes_no(text, value):
    assert syntax.parse_yes_no(text, "--kill-on-invalid-dep") is value


@pytest.mark.parametrize("text", ["y", "", "true", "1", "maybe"])
def test_parse_yes_no_refuses(text):
    with pytest.raises(UsageError, match=f"--kill-on-invalid-dep takes yes or no, not {text!r}"):
        syntax.parse_yes_no(text, "--kill-on-invalid-dep")


@pytest.mark.parametrize(
    "argv, folded",
    [
        (["--kill-on-invalid-dep=yes", "--", "x"], ["--kill-on-invalid-dep", "--", "x"]),
        (["--kill-on-invalid-dep=no", "--", "x"], ["--", "x"]),
        (["-G", "1", "--kill-on-invalid-dep", "x"], ["--kill-on-invalid-dep", "-G", "1", "x"]),
        (["--kill-on-invalid-dep", "--kill-on-invalid-dep=no", "x"], ["x"]),  # the last one wins
        (["--name", "--kill-on-invalid-dep=no", "x"], ["--name", "--kill-on-invalid-dep=no", "x"]),
        (["--", "x", "--kill-on-invalid-dep=no"], ["--", "x", "--kill-on-invalid-dep=no"]),
        (["--bogus", "--kill-on-invalid-dep=no"], ["--bogus", "--kill-on-invalid-dep=no"]),
    ],
)
def test_fold_yes_no_gives_typer_a_bare_flag(argv, folded):
    assert fold_yes_no(argv) == folded


def test_fold_yes_no_refuses_other_values():
    with pytest.raises(UsageError, match="--kill-on-invalid-dep takes yes or no, not 'maybe'"):
        fold_yes_no(["--kill-on-invalid-dep=maybe", "--", "x"])


# -- --dependency ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "after, dependency, expected",
    [
        ([], ["afterok:3:4,afterany:5"], [("afterok", 3), ("afterok", 4), ("afterany", 5)]),
        ([], ["after:7"], [("after", 7)]),  # once 7 started
        ([], ["AFTEROK:3"], [("afterok", 3)]),
        ([], ["afterok:12_3"], [("afterok", "12_3")]),  # the daemon finds the element's job id
        ([], ["afternotok:012_03:5"], [("afternotok", "12_3"), ("afternotok", 5)]),
        (["12_3,4"], [], [("afterok", "12_3"), ("afterok", 4)]),
    ],
)
def test_parse_dependencies_slurm_forms(after, dependency, expected):
    assert syntax.parse_dependencies(after, dependency) == expected


@pytest.mark.parametrize(
    "text, words",
    [
        ("afterok:3?afterok:4,afterany:5", r"mixes '\?' \(any of\) with ','"),
        ("after:5+10", r"a delay after the start \(after:ID\+MINUTES\) is not supported"),
        (
            "singleton:5",
            "KIND one of afterok, afterany, afternotok, after, aftercorr, or "
            "singleton, not 'singleton:5'",
        ),
        ("aftercorr", "KIND:ID"),
        ("afterok:5_", r"--dependency: '5_' is not a job id; give an ID like 12, or ARRAY_INDEX"),
        ("afterok:_3", "'_3' is not a job id"),
        ("afterok:-1", "'-1' is not a job id"),
        ("afterok:3:", "'' is not a job id"),
    ],
)
def test_parse_dependencies_refuses_clearly(text, words):
    with pytest.raises(UsageError, match=words):
        syntax.parse_dependencies([], [text])


# -- --signal and --array -------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("R:USR1@30", (signal.SIGUSR1, 30.0)),  # Slurm's [{R|B}:] prefixes
        ("b:usr2@120", (signal.SIGUSR2, 120.0)),
        ("BR:USR1", (signal.SIGUSR1, 60.0)),
        ("RB:10@5", (signal.SIGUSR1, 5.0)),
    ],
)
def test_parse_signal_spec_takes_slurms_prefixes(text, expected):
    assert syntax.parse_signal_spec(text) == expected


@pytest.mark.parametrize("text", ["X:USR1@30", "USR1@1_0", "R:B:USR1", "USR1@1e3"])
def test_parse_signal_spec_refuses_other_prefixes_and_numbers(text):
    with pytest.raises(ValueError, match="--signal wants"):
        syntax.parse_signal_spec(text)


def test_parse_array_slurm_forms():
    assert syntax.parse_array("0-15:4") == ((0, 4, 8, 12), None)
    assert syntax.parse_array("1,3,5-7") == ((1, 3, 5, 6, 7), None)
    assert syntax.parse_array("0-15:4%2") == ((0, 4, 8, 12), 2)


# -- submit --json --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ids, array_ids, printed",
    [
        ([5], [], {"id": 5}),
        ([5, 6, 7], [], {"ids": [5, 6, 7]}),
        ([5, 6, 7], [5], {"ids": [5, 6, 7], "array_id": 5}),
        ([9], [9], {"id": 9, "array_id": 9}),  # --array 4: an array of one
        ([1, 2, 3, 4], [1, 3], {"ids": [1, 2, 3, 4], "array_ids": [1, 3]}),  # --from-file --array
    ],
)
def test_submit_json(ids, array_ids, printed):
    assert submit_json(ids, array_ids) == printed


# -- after: met once the job started --------------------------------------------------------
@pytest.mark.parametrize(
    "state, why",
    [
        (JobState.PENDING, "waiting for after:3"),
        (JobState.RUNNING, ""),
        (JobState.FAILED, ""),
        (JobState.CANCELLED, ""),  # cancelled while pending: met, as in Slurm
    ],
)
def test_after_is_met_once_the_job_is_no_longer_pending(state, why):
    job = Job(id=9, command=("true",), cwd="/", uid=0, user="u", dependencies=(("after", 3),))
    assert dependency_status(job, {3: state}) == (False, why)


@pytest.mark.parametrize(
    "states, expected",
    [
        ([JobState.RUNNING, JobState.PENDING], JobState.PENDING),  # `after` waits for every start
        ([JobState.RUNNING, JobState.SUCCEEDED], JobState.RUNNING),
        ([JobState.SUCCEEDED, JobState.FAILED], JobState.FAILED),
        ([JobState.SUCCEEDED, JobState.SUCCEEDED], JobState.SUCCEEDED),
    ],
)
def test_an_array_as_one_dependency(states, expected):
    assert _array_state(states) == expected
