"""The daemon's queue decisions, in this process (tests/inproc.py): placement, pending
reasons, priorities, hold, dependencies, arrays, cancel, drain, per-user and host limits,
GPU constraints, policies and outside processes.

The real loop, handlers, job control, store and simulated GPUs; only the shims are fake,
and the clock moves when a test says. The end-to-end tests of each feature (through the
real CLI, daemon and jobs) are in test_semantics.py, test_daemon.py and test_host_resources.py.
"""

from __future__ import annotations

import getpass

import pytest

from gpusched.core.errors import NotFound, UsageError
from inproc import ME

GiB = 2**30


def others(uid: int) -> tuple[int, int, int]:
    """Credentials of another user (one with no name here: the daemon calls them by uid)."""
    return (ME[0], uid, uid)


# -- placement -------------------------------------------------------------------------------
def test_six_50g_jobs_on_four_80g_gpus(box):
    ids = box.submit_all("--gpus", "1", "--gpu-mem", "50G", "--from-file", "-", stdin="x\n" * 6)
    assert len(ids) == 6 and box.running() == set(ids[:4])
    jobs = {i: box.show(i) for i in ids}
    # Four at once, each on its own GPU; 50 + 50 GiB would not fit on 80.
    assert sorted(jobs[i]["gpu_indices"][0] for i in ids[:4]) == [0, 1, 2, 3]
    for i in ids[4:]:
        behind = "" if i == ids[4] else f"behind job {ids[4]}, which is next in line; "
        assert jobs[i]["pending_reason"] == (
            f"{behind}needs 1 GPU with 50.0 GiB free; most free is GPU 0 with 30.0 GiB"
        )
        assert jobs[i]["gpus"] == []
    # Free one GPU: exactly one waiting job (the older) takes it.
    assert box.exit(ids[0])["state"] == "succeeded"
    assert box.states(ids[4], ids[5]) == ["running", "pending"]
    assert box.show(ids[4])["gpus"] == jobs[ids[0]]["gpus"]
    for job_id in ids[1:]:
        assert box.exit(job_id)["state"] == "succeeded"
    assert all(g["jobs"] == [] for g in box.call("gpus")["gpus"])


def test_jobs_share_a_gpu_as_memory_allows_and_whole_gpus_are_never_shared(make_box):
    box = make_box("1x80GiB")
    ids = [box.submit("--gpu-mem", "30G", "--", "true") for _ in range(4)]
    assert box.states(*ids) == ["running", "running", "pending", "pending"]
    assert box.show(ids[2])["pending_reason"] == (
        "needs 1 GPU with 30.0 GiB free; most free is GPU 0 with 20.0 GiB"
    )
    (gpu,) = box.call("gpus")["gpus"]
    assert sorted(gpu["jobs"]) == ids[:2]
    for job_id in ids:
        assert box.exit(job_id)["state"] == "succeeded"

    x1, x2 = (box.submit("--gpus", "1", "--", "true") for _ in range(2))
    sharing = box.submit("--gpu-mem", "1G", "--", "true")
    assert box.states(x1, x2, sharing) == ["running", "pending", "pending"]
    assert "whole" in box.show(x2)["pending_reason"]  # not even 1 GiB beside a whole-GPU job
    assert box.call("gpus")["gpus"][0]["jobs"] == [x1]
    box.exit(x1)
    assert box.states(x2, sharing) == ["running", "pending"]
    assert box.call("gpus")["gpus"][0]["jobs"] == [x2]  # never two whole-GPU jobs at once
    box.exit(x2)
    assert box.exit(sharing)["state"] == "succeeded"


def test_observed_gpu_memory_peak_is_kept_and_counted_in_placement(make_box):
    """A job that uses more than its --gpu-mem (seen per process, as NVML reports it) keeps
    its peak in `show`, and placement counts the larger figure from then on."""
    box = make_box("1x80GiB")
    hungry = box.submit(
        "--gpus", "1", "--gpu-mem", "10G", "--env", "GPUSCHED_SIM_MEM_USED=50G", "--", "true"
    )
    box.step(box.daemon.settings.gpu_poll_interval_s)  # the shim runs; the GPUs are read
    assert box.show(hungry)["gpu_mem_peak_bytes"] == 50 * GiB
    # 80 GiB - 50 GiB in use leaves 30: a 40 GiB job must wait.
    waiting = box.submit("--gpus", "1", "--gpu-mem", "40G", "--", "true")
    assert box.show(waiting)["pending_reason"].startswith(
        "needs 1 GPU with 40.0 GiB free; most free is GPU 0 with 30.0 GiB"
    )
    box.exit(hungry)
    assert box.exit(waiting)["state"] == "succeeded"


# -- priorities, hold and release --------------------------------------------------------------
def test_the_highest_priority_job_takes_a_freed_gpu_and_update_reorders(box):
    gpu0 = ("--gpus", "1", "--gpu-ids", "0")  # all four want the same GPU
    blocker = box.submit(*gpu0, "--", "true")
    low = box.submit(*gpu0, "--", "true")
    high = box.submit(*gpu0, "--priority", "5", "--", "true")
    bumped = box.submit(*gpu0, "--priority", "1", "--", "true")
    assert box.call("update", ids=[bumped], priority=10) == {
        "results": {str(bumped): "priority 10"},
        "refused": {},
    }
    assert box.show(bumped)["priority"] == 10
    # Each time the GPU frees up, the highest-priority waiting job takes it.
    for ended, starts, waiting in (
        (blocker, bumped, [high, low]),
        (bumped, high, [low]),
        (high, low, []),
    ):
        box.exit(ended)
        assert box.show(starts)["state"] == "running"
        assert box.states(*waiting) == ["pending"] * len(waiting)
    assert box.exit(low)["state"] == "succeeded"
    assert box.call("update", ids=[low], priority=3)["refused"] == {
        str(low): "already succeeded; only pending and running jobs can be updated"
    }
    with pytest.raises(UsageError, match="nothing to update; give --priority N"):
        box.call("update", ids=[low])


def test_hold_and_release(box):
    # A CPU job would start at once; held, it waits with a reason that says how to go on.
    held = box.submit("--hold", "--", "true")
    job = box.show(held)
    assert job["pending_reason"] == f"held (`gpusched release {held}` lets it start)"
    assert job["held"] is True and held not in box.shims.launched
    assert box.call("release", ids=[held])["results"] == {str(held): "released"}
    job = box.show(held)
    assert job["state"] == "running" and job["held"] is False

    # `hold` on a job waiting for the GPU: a later job takes the GPU when it frees up.
    gpu1 = ("--gpus", "1", "--gpu-ids", "1")
    blocker = box.submit(*gpu1, "--", "true")
    waiting = box.submit(*gpu1, "--", "true")
    assert box.call("hold", ids=[waiting])["results"] == {str(waiting): "held"}
    later = box.submit(*gpu1, "--", "true")
    assert box.call("hold", ids=[blocker])["refused"] == {
        str(blocker): "running; only pending jobs can be held or released"
    }
    box.exit(blocker)
    assert box.states(later, waiting) == ["running", "pending"]
    assert (
        box.show(waiting)["pending_reason"] == f"held (`gpusched release {waiting}` lets it start)"
    )
    assert box.call("release", ids=[waiting])["results"] == {str(waiting): "released"}
    box.exit(later)
    assert box.show(waiting)["state"] == "running"


# -- dependencies ------------------------------------------------------------------------------
def test_dependencies_order_starts_and_say_when_they_can_never_be_met(box):
    ok, bad = box.submit("--", "true"), box.submit("--", "false")
    after_ok = box.submit("--after", str(ok), "--", "true")
    any_bad = box.submit("--dependency", f"afterany:{bad}", "--", "true")
    notok_bad = box.submit("-d", f"afternotok:{bad}", "--", "true")
    both = box.submit("-d", f"afterok:{ok},afternotok:{bad}", "--", "true")
    never = box.submit("-d", f"afterok:{bad}", "--", "true")
    killed = box.submit("-d", f"afterok:{bad}", "--kill-on-invalid-dep", "--", "true")
    notok_ok = box.submit("-d", f"afternotok:{ok}", "--kill-on-invalid-dep", "--", "true")
    assert box.show(after_ok)["pending_reason"] == f"waiting for afterok:{ok}"
    assert box.show(both)["pending_reason"] == f"waiting for afterok:{ok}, afternotok:{bad}"
    assert box.show(after_ok)["dependencies"] == [f"afterok:{ok}"]

    ok_job = box.exit(ok)
    assert box.show(after_ok)["state"] == "running"
    assert box.show(after_ok)["started_at"] >= ok_job["ended_at"]
    cancelled = box.show(notok_ok)
    assert cancelled["state"] == "cancelled"
    assert cancelled["end_reason"] == (
        f"dependency afternotok:{ok} can never be met: job {ok} ended succeeded"
    )
    assert box.show(any_bad)["state"] == "pending"

    bad_job = box.exit(bad, 1)
    assert bad_job["state"] == "failed"
    for job_id in (any_bad, notok_bad, both):
        job = box.show(job_id)
        assert job["state"] == "running" and job["started_at"] >= bad_job["ended_at"]
    reason = f"dependency afterok:{bad} can never be met: job {bad} ended failed"
    assert box.show(never)["pending_reason"] == reason and box.show(never)["state"] == "pending"
    job = box.show(killed)
    assert (job["state"], job["end_reason"], job["started_at"]) == ("cancelled", reason, None)

    # Only existing jobs can be depended on; a new job's id does not exist yet, so no job
    # can depend on a later one and a cycle can never form.
    with pytest.raises(UsageError, match="dependency on job 99999, which does not exist"):
        box.submit("--after", "99999", "--", "true")
    next_id = max(j["id"] for j in box.call("list", all=True)["jobs"]) + 1
    with pytest.raises(UsageError, match=f"job {next_id}, which does not exist"):
        box.submit("-d", f"afterany:{next_id}", "--", "true")
    assert max(j["id"] for j in box.call("list", all=True)["jobs"]) == next_id - 1
    with pytest.raises(UsageError, match="KIND one of afterok, afterany, afternotok"):
        box.submit("-d", f"before:{ok}", "--", "true")


def test_a_dependency_on_an_array_waits_for_every_element(box):
    first, second = box.submit_all("--array", "0-1", "--", "true")
    after = box.submit("--after", str(first), "--", "true")
    box.exit(first)
    assert box.show(after)["pending_reason"].startswith("waiting")  # element 1 still runs
    done = box.exit(second)
    job = box.show(after)
    assert job["state"] == "running" and job["started_at"] >= done["ended_at"]


# -- arrays and cancel -------------------------------------------------------------------------
def test_an_array_runs_at_most_its_throttle_at_once(box):
    ids = box.submit_all("--array", "0-5%2", "--", "true")
    array_id = ids[0]
    assert [box.show(i)["array_index"] for i in ids] == [0, 1, 2, 3, 4, 5]
    assert box.states(*ids) == ["running"] * 2 + ["pending"] * 4
    assert box.show(ids[-1])["pending_reason"] == f"array {array_id} already runs 2 at once (%2)"
    for job_id in ids:  # each end lets exactly one more start, in index order
        assert box.exit(job_id)["state"] == "succeeded"
        assert len(box.running()) == min(2, len([i for i in ids if i > job_id]))
    launched = box.shims.launched
    assert [launched[i]["env"]["GPUSCHED_ARRAY_INDEX"] for i in ids] == list("012345")
    assert {launched[i]["env"]["GPUSCHED_ARRAY_ID"] for i in ids} == {str(array_id)}


def test_cancel_takes_an_array_or_one_element(box):
    e0, e1, e2, e3 = ids = box.submit_all("--array", "0-3%2", "--", "true")
    box.step()  # the shims of e0 and e1 are known: a cancel reaches them
    assert box.call("cancel", ids=[f"{e0}_3"])["results"] == {str(e3): "cancelled"}
    assert box.states(e3, e2) == ["cancelled", "pending"]
    with pytest.raises(NotFound, match=f"array {e0} has no element 7"):
        box.call("cancel", ids=[f"{e0}_7"])
    assert box.call("cancel", ids=[e0])["results"] == {
        str(e0): "cancelling",
        str(e1): "cancelling",
        str(e2): "cancelled",
        str(e3): "already cancelled",
    }
    assert box.shims.signals == [(e0, 15), (e1, 15)]
    for job_id in (e0, e1):
        assert box.exit(job_id, None, 15)["state"] == "cancelled"
    assert box.states(*ids) == ["cancelled"] * 4 and not box.running()


# -- drain and per-user limits -----------------------------------------------------------------
def test_drain_and_per_user_limits_survive_a_restart(make_box):
    box = make_box("1x80GiB", "[scheduling]\nmax_running_per_user = 1\n")
    limit = f"quota default max_running_jobs=1: {getpass.getuser()} runs 1 job"
    draining = "the queue is draining (`gpusched resume` starts jobs again)"
    first, second = box.submit("--", "true"), box.submit("--", "true")
    assert box.show(first)["state"] == "running"
    assert box.show(second)["pending_reason"] == limit

    assert box.call("drain") == {"draining": True, "running": 1}
    third = box.submit("--", "true")
    assert box.show(third)["pending_reason"] == draining
    # The running job finishes; the job that waited for it now waits for the drain.
    box.exit(first)
    assert box.show(second)["pending_reason"] == draining

    # The drain is stored: a restarted daemon still starts nothing.
    box.restart()
    fourth = box.submit("--", "true")
    assert box.show(fourth)["pending_reason"] == draining
    assert box.call("status")["draining"] is True
    assert box.states(second, third) == ["pending", "pending"]

    assert box.call("resume") == {"draining": False, "running": 0}
    assert box.show(second)["state"] == "running"  # the oldest; the limit keeps the others
    assert box.show(third)["pending_reason"] == limit
    for earlier, later in ((second, third), (third, fourth)):  # one at a time
        ended = box.exit(earlier)
        assert box.show(later)["state"] == "running"
        assert box.show(later)["started_at"] >= ended["ended_at"]
    box.exit(fourth)
    assert box.call("status")["draining"] is False


def test_drain_and_resume_are_for_admins_only(box):
    with pytest.raises(Exception, match="drain or resume the queue"):
        box.call("drain", creds=others(54321))
    assert box.call("status")["draining"] is False


def test_max_gpus_per_user_counts_each_users_gpus(make_box):
    box = make_box("4x80GiB", "[scheduling]\nmax_gpus_per_user = 2\n")
    mine = [box.submit("--gpus", "1", "--", "true") for _ in range(3)]
    theirs = box.submit("--gpus", "2", "--", "true", creds=others(54321))
    assert box.states(*mine, theirs) == ["running", "running", "pending", "running"]
    assert box.show(mine[2])["pending_reason"] == (
        f"quota default max_running_gpus=2: {getpass.getuser()} holds 2 GPUs"
    )
    box.exit(mine[0])
    assert box.show(mine[2])["state"] == "running"


# -- host resources and max_running ------------------------------------------------------------
def test_max_running_caps_concurrent_jobs_at_four(make_box):
    box = make_box(config="[jobs]\nmax_running = 4\n")
    ids = box.submit_all("--gpus", "0", "--from-file", "-", stdin="true\n" * 20)
    assert box.running() == set(ids[:4])
    assert box.show(ids[4])["pending_reason"] == "4 jobs are running (max_running = 4)"
    for job_id in ids:
        assert box.exit(job_id)["state"] == "succeeded"
        assert len(box.running()) == min(4, len([i for i in ids if i > job_id]))


def test_jobs_needing_three_of_four_cores_never_overlap_and_say_why(make_box):
    box = make_box(config="[host]\ncpus = 4\n")
    first, second = (box.submit("--cpus", "3", "--", "true") for _ in range(2))
    small = box.submit("--cpus", "2", "--", "true")
    assert box.states(first, second, small) == ["running", "pending", "pending"]
    assert box.show(second)["pending_reason"] == "needs 3 CPUs; 1 of 4 free"
    assert box.show(small)["pending_reason"] == "needs 2 CPUs; 1 of 4 free"
    box.exit(first)
    assert box.states(second, small) == ["running", "pending"]
    box.exit(second)
    assert box.show(small)["state"] == "running"
    with pytest.raises(
        UsageError,
        match=r"^job asks for 64 CPUs; this box has 4 usable; "
        r"see `gpusched gpus`$",
    ):
        box.submit("--cpus", "64", "--", "true")


def test_gpu_jobs_do_not_queue_behind_cores_unless_they_ask_for_them(make_box):
    """Four GPUs on a box with two cores: four memory-sharing jobs run at once."""
    box = make_box(config="[host]\ncpus = 2\n")
    sharing = [box.submit("--gpu-mem", "10G", "--", "true") for _ in range(4)]
    assert box.running() == set(sharing)
    # Each counts as using a core (and gets one thread), but none waited for one.
    host = box.call("status")["host"]
    assert (host["cpus"], host["cpus_reserved"]) == (2, 4)
    assert {box.show(i)["cpus_required"] for i in sharing} == {False}
    assert {box.shims.launched[i]["env"]["GPUSCHED_CPUS"] for i in sharing} == {"1"}
    # A job that asks for cores waits for them; one that asks for none does not.
    asking = box.submit("--gpu-mem", "10G", "--cpus", "2", "--", "true")
    none = box.submit("--gpu-mem", "10G", "--cpus", "0", "--", "true")
    assert box.show(none)["state"] == "running" and box.show(none)["cpus"] == 0
    none_env = box.shims.launched[none]["env"]  # it still runs a thread
    assert (none_env["GPUSCHED_CPUS"], none_env["OMP_NUM_THREADS"]) == ("1", "1")
    assert box.show(asking)["pending_reason"] == "needs 2 CPUs; 0 of 2 free"
    for job_id in sharing[:-1]:
        box.exit(job_id)
        assert box.show(asking)["state"] == "pending"
    ended = box.exit(sharing[-1])
    assert box.show(asking)["state"] == "running"
    assert box.show(asking)["started_at"] >= ended["ended_at"]


def test_no_job_id_past_the_largest_is_given_out(box):
    """A pending job's place in line holds its id in 48 bits (core/sched/pendingqueue.py): an id
    past MAX_JOB_ID once crashed the daemon at each start. None is given out."""
    from gpusched.core.errors import GpuschedError
    from gpusched.core.spec.syntax import MAX_JOB_ID

    with box.daemon.state.write():
        box.daemon.state.store.reserve_ids(MAX_JOB_ID - 2)
    with pytest.raises(GpuschedError, match="no job ids left: the next is 281,474,976,710,654"):
        box.submit_all("--array", "0-2", "--", "true")
    assert box.submit_all("--array", "0-1", "--", "true") == [MAX_JOB_ID - 1, MAX_JOB_ID]
    with pytest.raises(GpuschedError, match="no job ids left"):
        box.submit("--", "true")
    box.restart()  # the largest id is a job like any other
    box.step()
    assert {MAX_JOB_ID - 1, MAX_JOB_ID} <= box.running()
    assert box.exit(MAX_JOB_ID, 0)["state"] == "succeeded"
