"""A big queue in the daemon (issue 23): passes that stop early, reasons worked out when asked,
a restart that keeps a sweep's jobs compact; in process, and through the real CLI."""

from __future__ import annotations

from pathlib import Path

from gpusched.core.sched import scheduling
from inproc import Box

SWEEP = 3_000
CONFIG = "[host]\ncpus = 16\n[jobs]\nmax_running = 2\n"


def spied_passes(monkeypatch) -> list[scheduling.Plan]:
    """Each plan the daemon's passes make, as they make it."""
    plans = []
    real = scheduling.schedule

    def spy(*args, **kwargs):
        plans.append(real(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(scheduling, "schedule", spy)
    return plans


def test_passes_over_a_sweep_look_at_what_can_start_and_reasons_come_when_asked(
    tmp_path: Path, monkeypatch
):
    box = Box(tmp_path, config=CONFIG)
    plans = spied_passes(monkeypatch)
    ids = box.submit_all("--gpus", "0", "--from-file", "-", stdin="true\n" * SWEEP)
    assert box.running() == set(ids[:2])
    for _ in range(5):  # one job ends and the next starts, five times
        (first,) = sorted(box.running())[:1]
        box.exit(first)
    assert len(box.running()) == 2 and max(box.running()) == ids[6]
    # No pass looked at the sweep beyond what could start, plus the job finding the box full.
    assert plans and max(plan.considered for plan in plans) <= 3
    # Deep in the queue, a job's reason is the one a walk of the whole queue gives it.
    assert box.show(ids[-1])["pending_reason"] == "2 jobs are running (max_running = 2)"
    rows = box.call("list")["jobs"]
    assert {row["pending_reason"] for row in rows if row["state"] == "pending"} == {
        "2 jobs are running (max_running = 2)"
    }


def test_a_restart_on_a_sweep_shares_what_its_jobs_hold_alike(tmp_path: Path):
    box = Box(tmp_path, config=CONFIG)
    ids = box.submit_all("--gpus", "0", "--from-file", "-", stdin="true\n" * SWEEP)
    box.restart(crash=True)
    box.step()
    pending = box.daemon.state.pending()
    assert len(pending) == SWEEP - 2
    # One environment, one command and one request between them, not 3,000 copies.
    assert len({id(job.env) for job in pending}) == 1
    assert len({id(job.command) for job in pending}) == 1
    assert len({id(job.request) for job in pending}) == 1
    assert [job.id for job in box.daemon.state.pending_in_order()] == ids[2:]
    assert box.daemon.state.pending_count() == SWEEP - 2
    assert box.show(ids[-1])["pending_reason"] == "2 jobs are running (max_running = 2)"
    # Each job keeps its own id and log paths.
    assert len({job.stdout_path for job in pending}) == SWEEP - 2
    assert all(str(job.id) in job.stdout_path for job in pending)


def test_a_sweep_runs_through_a_restart_in_order(home):
    # The real CLI and daemon: a sweep behind one long job, max_running = 1; every job
    # deep in the queue says why it waits, before and after a restart, and then all run.
    home.write_config("[host]\ncpus = 16\n[jobs]\nmax_running = 1\n")
    home.start()
    blocker = home.submit("--gpus", "0", "--", "sleep", "600")
    home.wait_state(blocker, "running")
    lines = home.path / "sweep.txt"
    lines.write_text("true\n" * 400)
    ids = home.json("submit", "--gpus", "0", "--from-file", str(lines))["ids"]
    assert home.show(ids[-1])["pending_reason"] == "1 jobs are running (max_running = 1)"
    home.run("daemon", "stop")
    home.start()
    assert home.show(ids[-1])["pending_reason"] == "1 jobs are running (max_running = 1)"
    home.run("cancel", str(blocker))
    home.run("wait", str(ids[-1]), timeout=120)
    jobs = [home.show(i) for i in (ids[0], ids[len(ids) // 2], ids[-1])]
    assert [job["state"] for job in jobs] == ["succeeded"] * 3
    assert jobs[0]["started_at"] <= jobs[1]["started_at"] <= jobs[2]["started_at"]
