"""Pending reasons as Slurm's Resources and Priority: the next job in line waits for GPUs,
the jobs after it wait behind it."""

from __future__ import annotations

from conftest import wait_until


def test_next_in_line_waits_for_gpus_the_rest_behind_it(make_home):
    home = make_home("2x80GiB")
    home.start()
    running, first, second = (home.submit("--gpus", "2", "--", "sleep", "60") for _ in range(3))
    home.wait_state(running, "running")
    reasons = wait_until(
        lambda: all(r := [home.show(i)["pending_reason"] for i in (first, second)]) and r,
        "both waiting jobs to have a reason",
    )
    assert reasons[0].startswith("needs 2 whole GPUs")
    # Before: the same "needs 2 whole GPUs" for both, as if either were next.
    assert reasons[1] == f"behind job {first}, which is next in line; {reasons[0]}"
    home.run("cancel", str(running), str(first), str(second))
