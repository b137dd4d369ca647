"""Fair share counts every GPU-second users' runs used, and a restarted daemon goes on from it."""

from __future__ import annotations

import getpass
import json

import pytest

from gpusched.core.models import Job, JobState, Request
from gpusched.daemon.jobs.fairshare import UsageLedger
from gpusched.store.database import Store

HOUR_S = 3600.0


def usage(home) -> dict[str, float]:
    return json.loads(home.run("daemon", "status", "--json").stdout)["fairshare_usage"]


def test_runs_count_while_nothing_is_pending_and_the_count_survives_a_restart(home):
    """A real run's GPU time shows in `daemon status`, and a daemon stopped and started
    again goes on from it (the count as a run goes, and who it puts first, are in
    test_inproc_runs.py)."""
    home.write_config('[scheduling]\ndiscipline = "fairshare"\n')
    user = getpass.getuser()
    job_id = home.submit("--gpus", "2", "--", "sh", "-c", "while [ ! -e go ]; do sleep 0.05; done")
    home.wait_state(job_id, "running")
    (home.path / "go").touch()
    job = home.wait_state(job_id, "succeeded")
    ran_gpu_s = 2 * (job["ended_at"] - job["started_at"])
    # Every GPU-second of the run, less a week's half-life over the run.
    assert usage(home)[user] == pytest.approx(ran_gpu_s, rel=1e-3)
    assert (
        f"GPU time used (fair share, halving every 7d00h): {user} "
        in home.run("daemon", "status").stdout
    )

    home.run("daemon", "stop")
    home.start()
    assert usage(home)[user] == pytest.approx(ran_gpu_s, rel=1e-3)


def _job(user: str, gpus: int, started_at: float) -> Job:
    return Job(
        id=1,
        command=("true",),
        cwd="/",
        uid=0,
        user=user,
        request=Request(gpus=gpus),
        state=JobState.RUNNING,
        started_at=started_at,
    )


def test_the_ledger_counts_each_run_to_its_end_and_decays_the_rest(tmp_path):
    store = Store(tmp_path / "queue.db")
    ledger = UsageLedger(half_life_s=HOUR_S, now=1000.0)  # the last count
    ada, bob = _job("ada", 2, 900.0), _job("bob", 1, 1700.0)
    with store.write():
        ledger.account([ada], 1600.0, store)  # ada's 2 GPUs from the last count on
        ledger.account([ada, bob], 2000.0, store)  # and bob's one from his start
    # bob's end is noticed late: he is counted up to his recorded end, not to 2000.
    ledger.run_ended(bob, 1800.0)
    with store.write():
        ledger.account([ada], 2000.0 + HOUR_S, store)  # an hour: half of the old counts
    decay = 0.5 ** (400 / HOUR_S)
    assert ledger.usage["ada"] == pytest.approx((2 * 600 * decay + 2 * 400) * 0.5 + 2 * HOUR_S)
    assert ledger.usage["bob"] == pytest.approx(100 * 0.5)

    restarted = UsageLedger(half_life_s=HOUR_S, now=0.0)
    restarted.load(store)
    assert (restarted.at, restarted.usage) == (ledger.at, ledger.usage)
    store.close()
