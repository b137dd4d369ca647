"""The daemon's decisions about runs, in this process (tests/inproc.py): time limits,
retries and their delay, cancel, ends, restarts and re-adoption, lost and failed launches,
memory, fair share, wait and stop.

The clock moves only when a test says, so a time limit or a retry delay costs nothing;
the jobs' own view of the same features (the signals they get, the attempts they see)
is tested end to end in test_semantics.py, test_daemon.py, test_host_resources.py,
test_shim.py and test_fairshare.py.
"""

from __future__ import annotations

import getpass
import re
import signal

import pytest

from gpusched.core.errors import NotFound, UsageError
from gpusched.daemon.jobs.control import LAUNCH_TIMEOUT_S
from gpusched.proc import runfile
from inproc import ME

GiB = 2**30
TERM, KILL, USR1 = int(signal.SIGTERM), int(signal.SIGKILL), int(signal.SIGUSR1)


def poll(box, seconds: float = 0.0) -> None:
    """A turn of the loop once the next GPU poll (and liveness check) is due."""
    box.step(seconds + box.daemon.settings.gpu_poll_interval_s)


# -- time limits -----------------------------------------------------------------------------
def test_time_limit_warns_then_terminates_and_the_end_says_what_it_did(make_box):
    box = make_box(config='[daemon]\ncancel_grace = "0.5s"\n')
    warned = box.submit("--time", "3s", "--signal", "USR1@2", "--", "true")
    stubborn = box.submit("--time", "5s", "--", "true")
    started = box.show(warned)["started_at"]
    env = box.shims.launched[warned]["env"]
    assert env["GPUSCHED_WARN_SIGNAL"] == "SIGUSR1"
    assert float(env["GPUSCHED_TIME_LIMIT_END"]) == pytest.approx(started + 3, abs=0.01)
    # The shim sends SIGKILL this long after SIGTERM (cancel_grace).
    assert box.shims.launched[stubborn]["grace_s"] == 0.5

    box.step(0.9)
    assert box.shims.signals == []  # the warning is due 1 s after the start, not before
    box.step(0.2)
    assert box.shims.signals == [(warned, USR1)]
    box.step(1.8)
    assert box.shims.signalled(warned) == [USR1]  # SIGTERM is due at the 3 s limit
    box.step(0.2)
    assert box.shims.signalled(warned) == [USR1, TERM]
    job = box.exit(warned, 143)
    assert (job["state"], job["end_reason"]) == (
        "timeout",
        "time limit of 3s reached (it exited with status 143 after SIGTERM)",
    )

    box.step(2.0)
    assert box.shims.signalled(stubborn) == [TERM]
    box.step(10.0)
    assert box.shims.signalled(stubborn) == [TERM]  # once: the shim takes it from there
    job = box.exit(stubborn, None, TERM)
    assert (job["state"], job["signal"]) == ("timeout", TERM)
    assert job["end_reason"] == "time limit of 5s reached (SIGTERM)"


def test_a_job_killed_after_ignoring_term_at_its_limit_ends_timeout(box):
    job_id = box.submit("--time", "2s", "--", "true")
    box.step(2.0)
    assert box.shims.signalled(job_id) == [TERM]
    job = box.exit(job_id, None, KILL)
    assert (job["state"], job["signal"]) == ("timeout", KILL)
    assert job["end_reason"] == (
        "time limit of 2s reached (SIGKILL once the grace period after SIGTERM ran out)"
    )


# -- retries ---------------------------------------------------------------------------------
def test_retries_requeue_failures_only_unless_asked(box):
    at_once = ("--retry-delay", "0")  # which ends retry is the point here, not when
    failing = box.submit("--retries", "2", *at_once, "--", "true")
    cancelled = box.submit("--retries", "2", *at_once, "--", "true")
    retried = box.submit(
        "--retries", "1", *at_once, "--retry-on", "timeout", "--time", "10s", "--", "true"
    )
    timed_out = box.submit("--retries", "1", *at_once, "--time", "1s", "--", "true")

    assert box.shims.launched[failing]["env"]["GPUSCHED_ATTEMPT"] == "1"
    for attempt in (1, 2):
        job = box.exit(failing, 3)  # eligible again at once: the same pass starts it
        assert (job["state"], job["attempt"]) == ("running", attempt + 1)
        assert box.shims.launched[failing]["env"]["GPUSCHED_ATTEMPT"] == str(attempt + 1)
    job = box.exit(failing, 3)
    assert (job["state"], job["attempt"], job["exit_code"]) == ("failed", 3, 3)
    assert box.shims.launches.count(failing) == 3

    box.step()
    assert box.call("cancel", ids=[cancelled])["results"] == {str(cancelled): "cancelling"}
    job = box.exit(cancelled, None, TERM)
    assert (job["state"], job["attempt"]) == ("cancelled", 1)
    assert box.shims.launches.count(cancelled) == 1

    box.step(1.0)  # timed_out's 1 s limit
    assert box.exit(timed_out, None, TERM)["state"] == "timeout"
    assert box.show(timed_out)["attempt"] == 1  # a timeout is retried only when asked
    box.step(9.0)  # retried's 10 s limit
    job = box.exit(retried, None, TERM)
    assert (job["state"], job["attempt"]) == ("running", 2)
    job = box.exit(retried, 0)
    assert (job["state"], job["attempt"]) == ("succeeded", 2)
    assert box.shims.launches.count(retried) == 2 and box.shims.launches.count(timed_out) == 1
    with pytest.raises(UsageError, match="--retry-on takes: failed, timeout"):
        box.submit("--retries", "1", "--retry-on", "sometimes", "--", "true")


def test_retries_wait_their_delay_doubling_and_say_when_they_may_start(box):
    """A job that fails at once does not spend its attempts in a moment."""
    failing = box.submit("--retries", "2", "--retry-delay", "1s", "--", "true")
    later = box.submit("--retries", "1", "--retry-delay", "1m", "--", "true")
    job = box.exit(later, 4)
    assert job["pending_reason"] == "retrying after attempt 1 failed; eligible in 60s"
    assert job["eligible_at"] == box.clock.time() + 60 and job["exit_code"] == 4
    assert box.call("cancel", ids=[later])["results"] == {str(later): "cancelled"}

    for delay in (1.0, 2.0):  # the delay, doubled after the second failure
        box.exit(failing, 3)
        box.step(delay - 0.01)
        assert box.show(failing)["state"] == "pending"
        box.step(0.01)
        assert box.show(failing)["state"] == "running"
    job = box.exit(failing, 3)
    assert (job["state"], job["attempt"], job["exit_code"]) == ("failed", 3, 3)


def test_a_retry_waiting_its_delay_keeps_it_across_a_restart(box):
    job_id = box.submit("--retries", "1", "--retry-delay", "30s", "--", "true")
    box.exit(job_id, 1)
    box.restart()
    box.step(29.0)
    assert box.show(job_id)["state"] == "pending"
    box.step(1.0)
    assert box.show(job_id)["state"] == "running"


# -- cancel ----------------------------------------------------------------------------------
def test_cancel_pending_and_running_jobs(make_box):
    box = make_box("2x80GiB", '[daemon]\ncancel_grace = "1s"\n')
    me = getpass.getuser()
    plain = box.submit("--gpus", "1", "--", "true")
    stubborn = box.submit("--gpus", "1", "--", "true")
    waiting = box.submit("--gpus", "2", "--", "true")
    box.step()  # the shims have forked: the daemon knows their pids

    assert box.call("cancel", ids=[waiting])["results"] == {str(waiting): "cancelled"}
    job = box.show(waiting)
    assert (job["state"], job["started_at"], job["gpus"]) == ("cancelled", None, [])
    assert job["end_reason"] == f"cancelled by {me} before it started"

    assert box.call("cancel", ids=[plain])["results"] == {str(plain): "cancelling"}
    assert box.shims.signalled(plain) == [TERM]
    job = box.show(plain)
    assert (job["state"], job["cancelling"]) == ("running", True)  # until its shim reports
    job = box.exit(plain, None, TERM)
    assert (job["state"], job["signal"]) == ("cancelled", TERM)
    assert job["end_reason"] == f"cancelled by {me} while running (SIGTERM)"

    assert box.call("cancel", ids=[stubborn])["results"] == {str(stubborn): "cancelling"}
    assert box.shims.signalled(stubborn) == [TERM]
    # It ignored SIGTERM, so its shim sent SIGKILL once the grace period was over.
    assert box.shims.launched[stubborn]["grace_s"] == 1.0
    job = box.exit(stubborn, None, KILL)
    assert (job["state"], job["signal"]) == ("cancelled", KILL)
    assert box.call("cancel", ids=[plain])["results"] == {str(plain): "already cancelled"}
    assert all(g["jobs"] == [] for g in box.call("gpus")["gpus"])


def test_a_cancel_before_the_shim_is_known_reaches_it_once_it_is(box):
    """A cancel may come before the launcher has forked the shim (its pid not yet known):
    it is passed on once the shim is there, and the job does not run on."""
    box.shims.hold_forks = True
    job_id = box.submit("--", "true")
    assert box.call("cancel", ids=[job_id])["results"] == {str(job_id): "cancelling"}
    assert box.shims.signals == []  # nothing to signal yet
    box.shims.fork(job_id)
    box.step()
    assert box.shims.signals == [(job_id, TERM)]
    assert box.exit(job_id, None, TERM)["state"] == "cancelled"


def test_only_the_owner_or_an_admin_changes_a_job(box):
    theirs = box.submit("--hold", "--", "true", creds=(ME[0], 54321, 54321))
    with pytest.raises(
        Exception, match=f"job {theirs} belongs to 54321; only they or an admin may cancel it"
    ):
        box.call("cancel", ids=[theirs], creds=(ME[0], 54322, 54322))
    assert box.call("cancel", ids=[theirs])["results"] == {str(theirs): "cancelled"}


# -- ends, restarts, lost shims ----------------------------------------------------------------
@pytest.mark.parametrize("crash", [True, False], ids=["killed", "stopped"])
def test_jobs_survive_a_daemon_restart_and_their_gpus_stay_reserved(make_box, crash):
    box = make_box("4x80GiB")
    ok, three, killed, vanished = ids = [box.submit("--gpus", "1", "--", "true") for _ in range(4)]
    box.step()
    before = {i: box.show(i) for i in ids}
    assert len({g for job in before.values() for g in job["gpus"]}) == 4
    held_ports = dict(box.shims.ports)

    box.stop(crash)
    # While no daemon runs, one job ends (its shim keeps the exit record for the next
    # daemon), and one shim dies without a record.
    box.shims.exit(ok, 0)
    box.shims.vanish(vanished)
    box.shims.ports.clear()  # the ports the old daemon held are free again
    box.start()
    job = box.show(ok)
    assert (job["state"], job["exit_code"], job["signal"]) == ("succeeded", 0, None)
    job = box.show(vanished)
    assert job["state"] == "lost" and "vanished" in job["end_reason"]
    for adopted in (three, killed):
        job = box.show(adopted)
        assert (job["state"], job["gpus"], job["started_at"]) == (
            "running",
            before[adopted]["gpus"],
            before[adopted]["started_at"],
        )
    # Their MASTER_PORTs are kept again.
    assert box.shims.ports == {i: held_ports[i] for i in (three, killed)}

    # The restarted daemon re-adopted the running jobs: their GPUs are not free.
    taker, other = (box.submit("--gpus", "1", "--", "true") for _ in range(2))
    waiter = box.submit("--gpus", "1", "--", "true")
    assert box.states(taker, other, waiter) == ["running", "running", "pending"]
    assert "whole" in box.show(waiter)["pending_reason"]
    gpus = {g["uuid"]: g["jobs"] for g in box.call("gpus")["gpus"]}
    assert {gpus[before[i]["gpus"][0]][0] for i in (ok, vanished)} == {taker, other}
    assert [gpus[before[i]["gpus"][0]] for i in (three, killed)] == [[three], [killed]]
    job = box.exit(three, 3)
    assert (job["state"], job["exit_code"], job["signal"]) == ("failed", 3, None)
    job = box.exit(killed, None, KILL)
    assert (job["state"], job["exit_code"], job["signal"]) == ("failed", None, KILL)
    assert box.show(waiter)["state"] == "running"
    # taker, other and waiter; no GPU given out twice.
    assert sorted(len(g["jobs"]) for g in box.call("gpus")["gpus"]) == [0, 1, 1, 1]


def test_a_job_whose_shim_vanishes_is_lost_and_its_gpu_freed(make_box):
    box = make_box("1x80GiB")
    job_id = box.submit("--gpus", "1", "--", "true")
    box.step()
    box.shims.vanish(job_id)
    box.step()
    assert box.show(job_id)["state"] == "running"  # liveness is checked at each GPU poll
    poll(box)
    job = box.show(job_id)
    assert job["state"] == "lost" and "vanished" in job["end_reason"]
    assert box.show(box.submit("--gpus", "1", "--", "true"))["state"] == "running"


def test_a_shim_not_forked_within_the_launch_timeout_counts_as_dead(box):
    """A job whose launcher died with the request unread: no shim record ever comes."""
    box.shims.hold_forks = True
    job_id = box.submit("--", "true")
    poll(box, LAUNCH_TIMEOUT_S - 5)
    assert box.show(job_id)["state"] == "running"  # being launched
    poll(box, 5)
    job = box.show(job_id)
    assert (job["state"], job["end_reason"]) == (
        "lost",
        "its shim never started (the shim launcher died?)",
    )


def test_a_shim_that_dies_before_its_run_file_is_found_at_the_next_liveness_check(box):
    """Its pid came with the start's acknowledgement: no launch timeout to wait out, and
    the reason is still that it never started."""
    box.shims.hold_forks = True
    job_id = box.submit("--", "true")
    box.shims.die_unstarted(job_id)
    poll(box)
    job = box.show(job_id)
    assert (job["state"], job["end_reason"]) == (
        "lost",
        "its shim never started (the shim launcher died?)",
    )


def test_a_job_whose_shim_cannot_start_fails_and_the_daemon_carries_on(box):
    box.shims.hold_forks = True
    failed = box.submit("--", "true")
    # The shim could not create its run file: it says so in its wake-up datagram.
    box.daemon.wake(runfile.launch_failure(failed, "cannot create its run file: EISDIR"))
    box.step()
    job = box.show(failed)
    assert (job["state"], job["end_reason"]) == (
        "failed",
        "cannot start its shim: cannot create its run file: EISDIR",
    )
    box.shims.hold_forks = False
    assert box.exit(box.submit("--", "true"))["state"] == "succeeded"


def test_a_launcher_that_takes_no_request_fails_the_job(box):
    box.shims.refuse_launches = True
    job = box.show(box.submit("--", "true"))
    assert (job["state"], job["end_reason"]) == (
        "failed",
        "cannot start its shim: the shim launcher does not take requests",
    )


# -- memory ----------------------------------------------------------------------------------
def test_memory_overuse_is_reported_but_not_stopped_by_default(box):
    job_id = box.submit("--mem", "20M", "--", "true")
    box.step()
    box.shims.rss_bytes[job_id] = 100 * 2**20
    poll(box)
    job = box.show(job_id)
    assert (job["state"], job["mem_over"], job["mem_peak_bytes"]) == ("running", True, 100 * 2**20)
    assert box.shims.notes == [
        (
            job["stderr_path"],
            f"job {job_id} uses 100 MiB of host memory, "
            "over its --mem of 20 MiB plus margin (22 MiB)",
        )
    ]
    assert box.shims.killed == []
    poll(box)
    assert len(box.shims.notes) == 1  # said once
    assert box.exit(job_id, 0)["state"] == "succeeded"


def test_job_over_its_memory_ends_oom_and_others_keep_running(make_box):
    box = make_box(config="[host]\ncpus = 64\nenforce_mem = true\n")
    neighbour = box.submit("--", "true")
    hog = box.submit("--mem", "50M", "--", "true")
    box.step()
    box.shims.rss_bytes[hog] = 400 * 2**20
    poll(box)
    assert box.shims.killed == [hog]  # its processes, not its shim, which records the end
    assert box.shims.notes == [
        (
            box.show(hog)["stderr_path"],
            f"job {hog} uses 400 MiB of host memory, over its --mem of 50 MiB plus margin (55 MiB)",
        )
    ]
    job = box.exit(hog, None, KILL)
    assert (job["state"], job["mem_over"], job["mem_peak_bytes"]) == ("oom", True, 400 * 2**20)
    assert (
        job["end_reason"]
        == "used more host memory than its --mem of 50.0 MiB (enforce_mem) (SIGKILL)"
    )
    assert box.show(neighbour)["state"] == "running"


# -- fair share ------------------------------------------------------------------------------
def test_runs_count_every_gpu_second_and_the_count_survives_a_restart(make_box):
    box = make_box(config='[scheduling]\ndiscipline = "fairshare"\n')
    user = getpass.getuser()
    job_id = box.submit("--gpus", "2", "--", "true")
    box.step(100.0)
    # Nothing else is queued: the run still counts, as it goes.
    assert box.call("status")["fairshare_usage"][user] == pytest.approx(200.0, rel=1e-3)
    job = box.exit(job_id)
    ran_gpu_s = 2 * (job["ended_at"] - job["started_at"])
    # Every GPU-second of the run, less a week's half-life over 100 s.
    assert box.call("status")["fairshare_usage"][user] == pytest.approx(ran_gpu_s, rel=1e-3)
    box.restart()
    assert box.call("status")["fairshare_usage"][user] == pytest.approx(ran_gpu_s, rel=1e-3)


def test_fairshare_starts_the_user_with_less_usage_first(make_box):
    box = make_box("1x80GiB", '[scheduling]\ndiscipline = "fairshare"\n')
    heavy, light = (ME[0], 54321, 54321), (ME[0], 54322, 54322)
    box.exit(box.submit("--gpus", "1", "--", "true", creds=heavy), seconds=3600.0)
    blocker = box.submit("--gpus", "1", "--", "true", creds=light)
    first = box.submit("--gpus", "1", "--", "true", creds=heavy)
    second = box.submit("--gpus", "1", "--", "true", creds=light)
    box.exit(blocker, seconds=60.0)
    # The heavy user queued first, but used an hour of GPU time: the light user goes first.
    assert box.states(first, second) == ["pending", "running"]


# -- wait and stop ---------------------------------------------------------------------------
def test_wait_is_answered_when_its_jobs_end_or_at_its_deadline(box):
    ended = box.submit("--", "true")
    box.exit(ended, 3)
    assert box.call("wait", ids=[ended])["done"] is True  # at once: nothing runs
    running = box.submit("--", "true")
    call = box.send("wait", ids=[ended, running])
    assert not call.done.is_set()  # answered later, by the loop
    box.step(5.0)
    assert not call.done.is_set()
    box.exit(running, 0)
    assert call.done.is_set() and call.result["done"] is True
    assert [j["state"] for j in call.result["jobs"]] == ["failed", "succeeded"]

    still = box.submit("--", "true")
    call = box.send("wait", ids=[still], timeout_s=2)
    box.step(1.9)
    assert not call.done.is_set()
    box.step(0.1)
    assert call.done.is_set() and call.result["done"] is False  # the client asks again
    with pytest.raises(NotFound, match="no job 999"):
        box.call("wait", ids=[still, 999])  # unknown ids fail now, not after the wait


def test_stop_is_for_admins_and_leaves_running_jobs(box):
    box.submit("--", "true")
    with pytest.raises(Exception, match="stop the daemon"):
        box.call("stop", creds=(ME[0], 54321, 54321))
    assert box.daemon.state.stopping is False
    assert box.call("stop") == {"stopping": True, "running_jobs_left": 1}
    assert box.daemon.state.stopping is True


def test_a_failing_request_is_answered_and_the_daemon_goes_on(box, monkeypatch):
    def broken(request):
        raise RuntimeError("a bug")

    monkeypatch.setitem(box.daemon.handlers._table, "status", broken)
    call = box.send("status")
    assert re.fullmatch("the daemon failed on this request; see its log", call.error.message)
    assert box.show(box.submit("--", "true"))["state"] == "running"
