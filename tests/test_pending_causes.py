"""Pending reasons that name their cause, as `show` gives them from the daemon (in this
process, tests/inproc.py): a custom policy's veto names the policy and why, a job that
backfill keeps back says it would delay the reserved start, and a hold beats a drain."""

from __future__ import annotations

import pytest

from gpusched.core.sched.placement import Veto
from gpusched.core.sched.policies import _guarded
from gpusched.daemon import loop


def too_hot(request, candidates, ctx):
    raise Veto("every GPU is over 80 C")


def not_gpu_0(request, candidates, ctx):
    return [load for load in candidates if load.gpu.index != 0]


def broken(request, candidates, ctx):
    raise KeyError("temperature")


@pytest.fixture
def policies(monkeypatch):
    """Installed policies, as the gpusched.policies entry points load them (guarded)."""
    found = {
        name: _guarded(name, fn)
        for name, fn in (("too-hot", too_hot), ("not-gpu-0", not_gpu_0), ("broken", broken))
    }
    monkeypatch.setattr(loop, "load_custom_policies", lambda: found)


def test_a_custom_policys_veto_names_the_policy_and_why(make_box, policies):
    box = make_box("1x80GiB")
    hot = box.submit("--gpus", "1", "--policy", "too-hot", "--", "true")
    picky = box.submit("--gpus", "1", "--policy", "not-gpu-0", "--", "true")
    failing = box.submit("--gpus", "1", "--policy", "broken", "--", "true")
    reasons = {job_id: box.show(job_id)["pending_reason"] for job_id in (hot, picky, failing)}
    assert reasons == {
        hot: "turned down by policy too-hot: every GPU is over 80 C",
        picky: "turned down by policy not-gpu-0: it chose none of the GPUs that can take "
        "the job (GPU 0)",
        failing: "turned down by policy broken: it failed (KeyError; the daemon's log has "
        "the traceback)",
    }
    # Vetoed jobs hold nobody back: a job of the built-in policy starts behind them.
    assert box.show(box.submit("--gpus", "1", "--", "true"))["state"] == "running"


def test_a_job_backfill_keeps_back_says_it_would_delay_the_reserved_start(make_box):
    box = make_box("2x80GiB", '[scheduling]\ndiscipline = "backfill"\n')
    first = box.submit("--gpus", "1", "--time", "1h", "--", "true")
    big = box.submit("--gpus", "2", "--", "true")
    endless = box.submit("--gpus", "1", "--", "true")  # no --time: it would run past 1h
    short = box.submit("--gpus", "1", "--time", "30m", "--", "true")
    assert box.states(first, big, endless, short) == ["running", "pending", "pending", "running"]
    assert box.show(big)["pending_reason"].startswith("needs 2 whole GPUs")
    assert (
        box.show(endless)["pending_reason"] == f"would delay job {big}'s reserved start (backfill)"
    )


def test_a_held_job_says_held_while_the_queue_drains(make_box):
    box = make_box("1x80GiB")
    held_before = box.submit("--hold", "--", "true")
    box.call("drain")
    held_during = box.submit("--hold", "--", "true")
    plain = box.submit("--", "true")
    box.step()
    for job_id in (held_before, held_during):
        assert (
            box.show(job_id)["pending_reason"]
            == f"held (`gpusched release {job_id}` lets it start)"
        )
    assert (
        box.show(plain)["pending_reason"]
        == "the queue is draining (`gpusched resume` starts jobs again)"
    )
    box.call("resume")
    assert box.show(plain)["state"] == "running"
    assert (
        box.show(held_during)["pending_reason"]
        == f"held (`gpusched release {held_during}` lets it start)"
    )
