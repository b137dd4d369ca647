"""`ls` and `show` as a person reads them: golden listings at 80 and 120 columns, the
reason column kept and cut (never wrapped), `show` in scontrol's shape, `cancelling`."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from conftest import DEADLINE_S, wait_until
from goldens import check_golden
from gpusched.cli.views import lsview
from gpusched.cli.views.plainout import Screen
from gpusched.cli.views.show import job_lines
from gpusched.core.models import Constraints, Job, JobState, Request, job_to_dict

GIB = 2**30
NOW = 1_700_000_000.0
HUGE_ARG = "x" * 100_000
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _job(job_id: int, user: str, state: JobState, command: tuple[str, ...], **fields) -> Job:
    return Job(
        id=job_id,
        command=command,
        cwd=f"/home/{user}/project",
        uid=1000 + job_id,
        user=user,
        state=state,
        submitted_at=NOW - 7200 + job_id * 60,
        stdout_path=f"/var/lib/gpusched/jobs/{job_id}.stdout.log",
        stderr_path=f"/var/lib/gpusched/jobs/{job_id}.stderr.log",
        **fields,
    )


def _running(job: Job, minutes: float, gpus: tuple[int, ...], **fields) -> Job:
    return replace(
        job,
        started_at=NOW - minutes * 60,
        gpu_indices=gpus,
        gpu_uuids=tuple(f"GPU-{i}aaaaaaa-0000-4000-8000-00000000000{i}" for i in gpus),
        master_port=29500 + job.id,
        **fields,
    )


def sample_jobs() -> list[dict]:
    """A queue with every kind of row: fixed times, nothing from the host or the clock."""
    train = _running(
        _job(
            17,
            "alice",
            JobState.RUNNING,
            ("python", "train.py", "--lr", "3e-4"),
            name="train.py",
            request=Request(1, 20 * GIB),
        ),
        62.1,
        (0,),
        mem_peak_bytes=int(1.5 * GIB),
    )
    sweep = _job(
        18,
        "bob",
        JobState.PENDING,
        ("python", "sweep.py"),
        name="sweep",
        request=Request(1, 40 * GIB),
        pending_reason="needs 1 GPU with 40.0 GiB free; most free is GPU 0 with 31.5 GiB",
    )
    stubborn = _running(
        _job(
            19,
            "carol",
            JobState.RUNNING,
            ("sh", "-c", "trap '' TERM; exec python serve.py"),
            name="serve",
            request=Request(1),
        ),
        4.2,
        (2,),
        cancel_requested=True,
        end_reason="cancelled by carol",
    )
    huge = _running(
        _job(20, "dave", JobState.RUNNING, ("python", "-c", HUGE_ARG), request=Request(0)), 0.5, ()
    )
    llm = _job(
        21,
        "erin",
        JobState.PENDING,
        ("torchrun", "--nproc-per-node", "4", "ft.py"),
        name="finetune-llama-70b-lora-r16",
        request=Request(4),
        priority=5,
        pending_reason="needs 4 whole GPUs; 1 is free (GPU 0 has job 17, GPU 2 has "
        "job 19, GPU 3 has an outside process)",
    )
    failed = replace(
        _running(
            _job(
                22,
                "alice",
                JobState.FAILED,
                ("python", "eval.py"),
                name="eval",
                request=Request(1, 8 * GIB),
            ),
            30,
            (1,),
        ),
        ended_at=NOW - 600,
        exit_code=2,
    )
    array = [
        _job(
            30 + i,
            "bob",
            JobState.RUNNING if i < 2 else JobState.PENDING,
            ("python", "grid.py", f"--seed={i}"),
            name="grid",
            request=Request(1, 10 * GIB),
            array_id=30,
            array_index=i,
            array_throttle=2,
            pending_reason="" if i < 2 else "array 30 already runs 2 at once (%2)",
        )
        for i in range(3)
    ]
    array = [_running(j, 3, (3,)) if j.state is JobState.RUNNING else j for j in array]
    rows = [job_to_dict(j) for j in (train, sweep, stubborn, huge, llm, failed, *array)]
    for row in rows:
        row["progress"] = None
    rows[0]["progress"] = {"fraction": 0.37, "message": "epoch 3/8", "updated_at": NOW - 4}
    return rows


def listing(width: int, jobs: list[dict] | None = None) -> str:
    """`ls` as a terminal of `width` columns shows it, without colour."""
    stream = io.StringIO()
    jobs = lsview.fold_arrays(sample_jobs() if jobs is None else jobs)
    Screen({}, stream).lines(lsview.ls_lines(jobs, width, now=NOW))
    return stream.getvalue()


@pytest.mark.parametrize("width", [80, 120])
def test_golden_listing(width):
    check_golden(f"ls_{width}.txt", listing(width))


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 160, 1000])
def test_listing_keeps_one_line_per_job_and_its_reason(width):
    jobs = lsview.fold_arrays(sample_jobs())
    lines = listing(width).splitlines()
    assert len(lines) == len(jobs) + 1  # the header, then one line per job: nothing wrapped
    assert all(len(line) <= width for line in lines), [len(line) for line in lines]
    assert all(line == line.rstrip() for line in lines)
    reasons = dict(zip((str(j["id"]) for j in jobs), lines[1:]))
    # Each row ends in its reason or command, at least its start.
    assert re.search(r" needs 1 G", reasons["18"]), reasons["18"]
    assert re.search(r" needs 4 ", reasons["21"]), reasons["21"]
    assert re.search(r" python -c", reasons["20"]), reasons["20"]
    assert "REASON" in lines[0]
    assert " cancelling " in reasons["19"]


def test_listing_cuts_long_fields_with_an_ellipsis_and_quotes_commands():
    rows = {line.split()[0]: line for line in listing(1000).splitlines()}
    assert re.search(r" python -c x+…$", rows["20"]) and len(rows["20"]) == 1000
    assert rows["19"].endswith(" sh -c 'trap '\"'\"''\"'\"' TERM; exec python serve.py'")
    rows = {line.split()[0]: line for line in listing(120).splitlines()}
    assert re.search(r" needs 4 whole GPUs; 1 is free .+…$", rows["21"]), rows["21"]


def test_listing_is_cheap_for_a_huge_argument():
    jobs = [dict(sample_jobs()[3]) for _ in range(200)]
    started = time.process_time()
    lines = listing(1000, jobs).splitlines()
    assert len(lines) == 201 and all(len(line) <= 1000 for line in lines)
    # Not a timing test: a listing that escaped and measured 100,000 characters per row
    # would take seconds; the bound is two orders of magnitude above what it takes.
    assert time.process_time() - started < 20


def show_text(job: dict) -> str:
    return "".join(line + "\n" for line in job_lines(job, now=NOW))


@pytest.fixture
def utc(monkeypatch):
    """Local time is UTC, so golden `show` output does not depend on the host's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_golden_show(utc):
    jobs = {j["id"]: j for j in sample_jobs()}
    limited = job_to_dict(
        replace(
            _running(
                _job(
                    40,
                    "alice",
                    JobState.TIMEOUT,
                    ("python", "long.py"),
                    request=Request(
                        2,
                        30 * GIB,
                        Constraints(gpu_ids=(0, 2), gpu_type="H100", min_compute_capability=(8, 0)),
                        cpus=8,
                        mem_bytes=64 * GIB,
                    ),
                    dependencies=(("afterok", 17),),
                    time_limit_s=60.0,
                    warn_signal=10,
                    warn_before_s=30.0,
                    retries=2,
                    attempt=3,
                ),
                1.05,
                (0, 2),
                cpu_ids=(4, 5),
                gpu_mem_peak_bytes=29 * GIB,
                mem_peak_bytes=70 * GIB,
                mem_over=True,
            ),
            ended_at=NOW - 60 + 3,
            signal=15,
            end_reason="time limit of 1m00s reached (SIGTERM)",
        )
    )
    limited["progress"] = None
    text = "\n".join(show_text(j) for j in (jobs[17], jobs[18], jobs[19], jobs[32], limited))
    check_golden("show.txt", text)


def test_show_reads_like_scontrol(utc):
    text = show_text(sample_jobs()[0])
    assert text.startswith("id=17 name=train.py user=alice uid=1017 state=running\n   ")
    assert "gpu_mem=20.0 GiB" in text and "run_time=1h02m" in text
    assert "submitted_at=2023-11-14T20:30:20" in text  # local time (here UTC)
    assert "progress=37% epoch 3/8 (4s ago)" in text
    assert "command=python train.py --lr 3e-4" in text
    for line in text.splitlines():
        assert line == line.rstrip() and len(line) <= 100, line
    assert "None" not in text and "{" not in text and "[" not in text and "_bytes" not in text


def test_show_says_when_an_end_is_not_yet_stored(utc):
    job = {
        **sample_jobs()[0],
        "state": "failed",
        "end_reason": "cannot start its shim: ENOSPC",
        "end_unstored": True,
    }
    assert (
        "end_reason=cannot start its shim: ENOSPC (not yet stored: the queue cannot be "
        "written; `gpusched daemon status` says why)"
    ) in show_text(job)


# -- through the real CLI and daemon ------------------------------------------------------
def run_in_terminal(home, *args: str, columns: int = 80) -> str:
    """The CLI's output when its standard output is a terminal `columns` wide (a pty)."""
    master, slave = pty.openpty()
    env = {**home.env, "COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpusched", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
        cwd=home.path,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=DEADLINE_S) == 0, proc.stderr.read()
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def test_ls_on_an_80_column_terminal_keeps_the_reason_on_one_line(home):
    home.start()
    blocker = home.submit("--gpus", "4", "--name", "blocker", "--", "sleep", "300")
    home.wait_state(blocker, "running")
    huge = home.submit("--name", "huge", "--", "sh", "-c", "sleep 300", "sh", HUGE_ARG)
    home.wait_state(huge, "running")
    waiting = home.submit(
        "--gpus", "1", "--gpu-mem", "70G", "--name", "waiting", "--", "sleep", "1"
    )
    wait_until(
        lambda: home.show(waiting)["pending_reason"].startswith("needs"), "the pending reason"
    )
    lines = run_in_terminal(home, "ls").splitlines()
    assert len(lines) == 4, lines  # the header and one line per job
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split()[-3:] == ["REASON", "/", "COMMAND"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert re.search(r" needs 1 GPU with 70\.0 GiB free;\S*…$", rows[str(waiting)]), rows
    assert re.search(r" sh -c 'sleep 300' sh x+…$", rows[str(huge)]), rows


def test_ls_into_a_pipe_keeps_a_job_a_line_and_cuts_a_huge_argument(home):
    home.start()
    huge = home.submit("--name", "huge", "--", "sh", "-c", "sleep 300", "sh", HUGE_ARG)
    home.wait_state(huge, "running")
    lines = home.run("ls").stdout.splitlines()
    assert len(lines) == 2 and len(lines[1]) <= 1000 and lines[1].endswith("…"), len(lines)


def test_show_of_a_job_is_human_without_reprs_or_padding(home):
    home.start()
    job_id = home.submit(
        "--gpus", "1", "--gpu-mem", "20G", "--gpu-ids", "1", "--name", "train", "--", "sleep", "300"
    )
    home.wait_state(job_id, "running")
    out = home.run("show", str(job_id)).stdout
    assert out.startswith(f"id={job_id} name=train user=")
    assert "state=running" in out and "gpu_mem=20.0 GiB" in out and "gpu_ids=1" in out
    assert re.search(r"started_at=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$", out, re.M), out
    assert "command=sleep 300" in out
    assert "None" not in out and "{" not in out and "21474836480" not in out
    assert all(line == line.rstrip() for line in out.splitlines())


def test_end_reason_says_who_cancelled_and_what_a_time_limit_did(home, tmp_path):
    home.start()
    started = tmp_path / "started"
    # The cancel must find the job itself running, not its shim still starting it.
    running = home.submit("--", "sh", "-c", f"touch {started}; exec sleep 300")
    timed = home.submit("--time", "5s", "--", "sleep", "300")
    pending = home.submit("--hold", "--", "sleep", "300")
    wait_until(started.exists, "the job to start")
    home.run("cancel", str(running), str(pending))
    me = home.show(running)["user"]
    job = home.wait_state(running, "cancelled")
    assert job["end_reason"] == f"cancelled by {me} while running (SIGTERM)"
    assert home.show(pending)["end_reason"] == f"cancelled by {me} before it started"
    job = home.wait_state(timed, "timeout")
    assert job["end_reason"] == "time limit of 5s reached (SIGTERM)"
    assert (
        f"end_reason=cancelled by {me} while running (SIGTERM)"
        in home.run("show", str(running)).stdout
    )


def test_a_job_that_ignores_sigterm_shows_cancelling_until_it_ends(home, tmp_path):
    home.write_config('[daemon]\ncancel_grace = "5m"\n')
    home.start()
    ready = tmp_path / "trapped"
    job_id = home.submit(
        "--name", "stubborn", "--", "sh", "-c", f"trap '' TERM; touch {ready}; sleep 600"
    )
    home.wait_state(job_id, "running")
    wait_until(ready.exists, "the job to ignore SIGTERM")
    assert home.show(job_id)["cancelling"] is False
    assert f"job {job_id}: cancelling" in home.run("cancel", str(job_id)).stdout
    shown = home.show(job_id)
    assert (shown["state"], shown["cancelling"]) == ("running", True)  # the JSON keeps its state
    row = next(line for line in home.run("ls").stdout.splitlines() if line.startswith(f"{job_id} "))
    assert row.split()[3] == "cancelling", row
    assert " state=cancelling" in home.run("show", str(job_id)).stdout
    top = home.run("top", "--once").stdout
    assert re.search(rf"│ +{job_id} +\S+ +stubborn +cancelling ", top), top
    assert next(j for j in home.json("ls") if j["id"] == job_id)["cancelling"] is True
