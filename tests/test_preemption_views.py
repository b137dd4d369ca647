"""How a job being preempted reads in `top` and `ls`, and what `show` says of a preemption."""

from __future__ import annotations

import re

from gpusched.cli.views.lsview import shown_state, state_human
from gpusched.cli.views.show import job_lines
from gpusched.core.models import Job, JobState, job_to_dict
from gpusched.tui.model import TopJob
from test_tui import NOW, _job, _jobs, frame


def test_a_job_being_preempted_says_so_in_tops_running_panel():
    victim = _job(
        20,
        "running",
        "me",
        1000,
        "victim",
        gpu_indices=(3,),
        gpus_requested=1,
        started_at=NOW - 30,
        preempting=True,
    )
    for width in (60, 80, 140):
        text = frame(width, jobs=_jobs() + (victim,))
        assert re.search(r"│ +20 +me +victim +preempting ", text), text
        assert re.search(r"│ +9 +me +eval +running ", text), text


def test_top_reads_preempting_from_the_daemons_job():
    job = job_to_dict(
        Job(id=3, command=("x",), cwd="/", uid=0, user="u", state=JobState.RUNNING, requeueing=True)
    )
    assert TopJob.from_dict(job).preempting is True


def test_ls_says_preempting_and_a_cancel_wins():
    row = {
        "state": "running",
        "preempting": True,
        "cancelling": False,
        "exit_code": None,
        "signal": None,
    }
    assert shown_state(row) == state_human(row) == "preempting"
    assert shown_state({**row, "cancelling": True}) == "cancelling"


def test_show_names_who_preempted_whom_and_when_on_both_jobs():
    victim = job_to_dict(
        Job(
            id=12,
            command=("x",),
            cwd="/",
            uid=0,
            user="u",
            preemptible=True,
            restarts=1,
            preemptions=1,
            preempted_by=14,
            preempted_at=NOW,
            requeue_reason="preempted by job 14 (bob, priority 10)",
        )
    )
    text = "\n".join(job_lines(victim, NOW))
    assert "preemptible=yes preempt_grace=1m00s restarts=1 preemptions=1" in text
    assert re.search(r"preempted_by=job 14 at \d{4}-\d\d-\d\dT", text)
    assert "requeue_reason=preempted by job 14 (bob, priority 10)" in text
    urgent = job_to_dict(
        Job(
            id=14,
            command=("x",),
            cwd="/",
            uid=0,
            user="u",
            preempted_jobs=(12, 13),
            preempted_jobs_at=NOW,
        )
    )
    assert re.search(r"preempted=jobs 12,13 at \d{4}-", "\n".join(job_lines(urgent, NOW)))
    plain = "\n".join(job_lines(job_to_dict(Job(id=1, command=("x",), cwd="/", uid=0, user="u"))))
    assert "preempt" not in plain  # a job that never met preemption shows nothing of it
