"""Host resources: CPU cores, host memory and max_running as schedulable resources.

Real jobs on a real daemon, and the pure parts (schedule, placement, cgroups) below; the
daemon's decisions about each resource are tested in process in test_inproc_queue.py and
test_inproc_runs.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from conftest import wait_until
from gpusched.core.models import Inventory, Job, Request
from gpusched.core.sched.placement import PlacementRules, host_impossible_reason
from gpusched.core.sched.queuerules import HostCapacity, QueueRules
from gpusched.core.sched.scheduling import schedule
from gpusched.daemon.host import Host, pick_cpus
from gpusched.daemon.jobs.cgroups import CgroupJobs, own_cgroup


def test_max_running_caps_concurrent_jobs(home):
    """[jobs] max_running from the config file holds real jobs back (how the cap lets one
    more start at each end is in test_inproc_queue.py)."""
    home.write_config("[jobs]\nmax_running = 2\n")
    gate = "while [ ! -e go ]; do sleep 0.05; done"
    # One round trip for all three, so that they really compete for the two slots.
    first, second, third = home.json(
        "submit", "--gpus", "0", "--from-file", "-", input=f"{gate}\n{gate}\ntrue\n"
    )["ids"]
    for job_id in (first, second):
        home.wait_state(job_id, "running")
    job = wait_until(lambda: (j := home.show(third))["pending_reason"] and j, "a pending reason")
    assert job["pending_reason"] == "2 jobs are running (max_running = 2)"
    (home.path / "go").touch()
    started_at = home.wait_state(third, "succeeded")["started_at"]
    assert started_at >= min(home.wait_state(i, "succeeded")["ended_at"] for i in (first, second))


def test_pending_reason_names_the_missing_cores(home):
    """A real job waits for the cores [host] cpus leaves it, says so, and starts once they
    are free (every case of counting cores is in test_inproc_queue.py)."""
    home.write_config("[host]\ncpus = 4\n")
    blocker = home.submit("--cpus", "3", "--", "sh", "-c", "while [ ! -e go ]; do sleep 0.05; done")
    home.wait_state(blocker, "running")
    waiting = home.submit("--cpus", "2", "--", "true")
    job = wait_until(lambda: (j := home.show(waiting))["pending_reason"] and j, "a pending reason")
    assert job["pending_reason"] == "needs 2 CPUs; 1 of 4 free"
    (home.path / "go").touch()
    home.wait_state(waiting, "succeeded")


def test_gpu_jobs_do_not_queue_behind_cores_unless_they_ask_for_them(home):
    """On a box with one core, two memory-sharing GPU jobs run at once and `daemon status`
    shows the cores overcounted; a job of --cpus 0 still gets one thread (which jobs wait
    for cores is in test_inproc_queue.py)."""
    home.write_config("[host]\ncpus = 1\n")
    gate = "while [ ! -e go ]; do sleep 0.05; done"
    sharing = [home.submit("--gpu-mem", "10G", "--", "sh", "-c", gate) for _ in range(2)]
    for job_id in sharing:
        home.wait_state(job_id, "running")
    # Each counts as using a core (and gets one thread), but none waited for one.
    status = json.loads(home.run("daemon", "status", "--json").stdout)
    assert (status["host"]["cpus"], status["host"]["cpus_reserved"]) == (1, 2)
    assert "host: 0 of 1 CPUs free (2 reserved by jobs" in home.run("daemon", "status").stdout
    none = home.submit(
        "--gpu-mem", "10G", "--cpus", "0", "--", "sh", "-c", "echo $GPUSCHED_CPUS $OMP_NUM_THREADS"
    )
    assert home.wait_state(none, "succeeded")["cpus"] == 0
    assert home.run("logs", str(none)).stdout.split() == ["1", "1"]
    (home.path / "go").touch()
    for job_id in sharing:
        home.wait_state(job_id, "succeeded")


def test_more_cpus_than_the_box_has_is_refused_naming_its_size(home):
    home.write_config("[host]\ncpus = 4\n")
    before = home.jobs()
    proc = home.run("submit", "--cpus", "64", "--", "true", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "Error: job asks for 64 CPUs; this box has 4 usable; see `gpusched gpus`"
    ]
    assert home.jobs() == before


def test_thread_variables_follow_the_job_cores_unless_set(home):
    dump = ("sh", "-c", "echo $OMP_NUM_THREADS $MKL_NUM_THREADS $GPUSCHED_CPUS")
    default = home.submit("--cpus", "3", "--", *dump)
    own = home.submit("--cpus", "3", "--env", "OMP_NUM_THREADS=7", "--", *dump)
    for job_id in (default, own):
        home.wait_state(job_id, "succeeded")
    assert home.run("logs", str(default)).stdout.split() == ["3", "3", "3"]
    assert home.run("logs", str(own)).stdout.split() == ["7", "3", "3"]


def test_job_over_its_memory_ends_oom_and_others_keep_running(home):
    """A real process over its --mem is measured, killed with its group only, and told why
    in its stderr (the decisions about overuse, enforced or not, are in test_inproc_runs.py)."""
    home.write_config(
        '[host]\ncpus = 64\nenforce_mem = true\n[daemon]\ngpu_poll_interval = "0.2s"\n'
    )
    neighbour = home.submit("--", "sh", "-c", "while [ ! -e go ]; do sleep 0.05; done")
    hog = home.submit(
        "--mem",
        "50M",
        "--",
        sys.executable,
        "-c",
        "import time; x = b'x' * (400 * 2**20); time.sleep(60)",
    )
    job = home.wait_state(hog, "oom", "failed", "succeeded")
    assert job["state"] == "oom"
    assert job["mem_over"] is True and job["mem_peak_bytes"] > 55 * 2**20
    assert "over its --mem of 50 MiB" in home.run("logs", "--stderr", str(hog)).stdout
    assert home.show(neighbour)["state"] == "running"
    (home.path / "go").touch()
    assert home.wait_state(neighbour, "succeeded")["exit_code"] == 0


def test_cpu_binding_pins_the_job_to_its_cores(home):
    home.write_config("[host]\ncpu_binding = true\n")
    job_id = home.submit(
        "--cpus",
        "1",
        "--",
        sys.executable,
        "-c",
        "import os; print(sorted(os.sched_getaffinity(0)))",
    )
    job = home.wait_state(job_id, "succeeded")
    assert len(job["cpu_ids"]) == 1
    assert home.run("logs", str(job_id)).stdout.strip() == str(job["cpu_ids"])
    assert job["cpu_ids"][0] in os.sched_getaffinity(0)


def test_status_and_gpus_show_host_resources(home):
    home.write_config("[host]\ncpus = 6\n")
    home.start()
    status = json.loads(home.run("daemon", "status", "--json").stdout)
    assert status["host"]["cpus"] == 6
    assert status["mem_enforcement"].startswith("off")
    assert "host: 6 of 6 CPUs free" in home.run("gpus").stdout


def _job(job_id: int, cpus: int = 1, mem: int | None = None) -> Job:
    return Job(
        id=job_id,
        command=("true",),
        cwd="/",
        uid=0,
        user="u",
        request=Request(cpus=cpus, mem_bytes=mem),
    )


def test_schedule_counts_cores_memory_and_the_running_limit():
    host = HostCapacity(cpus=4, mem_bytes=10 * 2**30, max_running=3)
    pending = [_job(1, cpus=2), _job(2, cpus=2), _job(3, mem=2**30), _job(4)]
    plan = schedule(pending, [], {}, Inventory(), PlacementRules(), QueueRules(host=host), now=0.0)
    assert [job_id for job_id, _ in plan.starts] == [1, 2]
    assert plan.reasons[3] == "needs 1 CPU; 0 of 4 free"
    running = [_job(9, mem=9 * 2**30)]
    plan = schedule(
        [_job(5, mem=2 * 2**30), _job(6)],
        running,
        {},
        Inventory(),
        PlacementRules(),
        QueueRules(host=host),
        now=0.0,
    )
    assert plan.reasons[5] == "needs 2.0 GiB of host memory; 1.0 of 10.0 GiB free"
    assert [job_id for job_id, _ in plan.starts] == [6]
    plan = schedule(
        [_job(7)],
        [_job(i) for i in range(10, 13)],
        {},
        Inventory(),
        PlacementRules(),
        QueueRules(host=host),
        now=0.0,
    )
    assert plan.reasons[7] == "3 jobs are running (max_running = 3)"


def test_cores_limit_only_the_jobs_that_wait_for_them():
    host = HostCapacity(cpus=2, mem_bytes=2**40)
    counted = [
        Job(
            id=i,
            command=("true",),
            cwd="/",
            uid=0,
            user="u",
            request=Request(cpus=1, cpus_required=False),
        )
        for i in range(1, 5)
    ]
    pending = counted + [_job(5, cpus=2), _job(6, cpus=0), _job(7, cpus=1)]
    plan = schedule(pending, [], {}, Inventory(), PlacementRules(), QueueRules(host=host), now=0.0)
    assert [job_id for job_id, _ in plan.starts] == [1, 2, 3, 4, 6]
    assert plan.reasons[5] == "needs 2 CPUs; 0 of 2 free"
    assert plan.reasons[7] == "needs 1 CPU; 0 of 2 free"


def test_host_impossible_reason_names_the_box():
    assert (
        host_impossible_reason(Request(cpus=8), 4, 2**30)
        == "asks for 8 CPUs; this box has 4 usable"
    )
    assert "this box has 1.0 GiB usable" in host_impossible_reason(
        Request(mem_bytes=2**31), 4, 2**30
    )
    assert host_impossible_reason(Request(cpus=4, mem_bytes=2**30), 4, 2**30) is None


def test_pick_cpus_takes_the_lowest_free_cores_and_shares_when_overcounted():
    host = Host(cpu_ids=(2, 3, 5), cpus=3, mem_bytes=0)
    assert pick_cpus(host, 2, taken=[2]) == (3, 5)
    assert pick_cpus(host, 2, taken=[2, 3, 5]) == (2, 3)


def _fake_cgroup_tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    base = root / "user.slice/gpusched"
    base.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/user.slice/gpusched\n")
    return root, proc


def test_cgroup_v2_job_limits_against_a_fake_tree(tmp_path):
    root, proc = _fake_cgroup_tree(tmp_path)
    tree = CgroupJobs.detect(root, proc)
    assert tree is not None and tree.base == root / "user.slice/gpusched"
    assert tree.prepare(pid=4321)
    assert (tree.base / "daemon/cgroup.procs").read_text() == "4321"
    assert (tree.base / "cgroup.subtree_control").read_text() == "+memory"
    job_dir = tree.create(7, 123 * 2**20)
    assert (job_dir / "memory.max").read_text() == str(123 * 2**20)
    assert not tree.oom_killed(7)
    (job_dir / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert tree.oom_killed(7)


def test_cgroup_v1_or_no_memory_controller_means_no_cgroup_limits(tmp_path):
    root, proc = _fake_cgroup_tree(tmp_path)
    proc.write_text("4:memory:/x\n1:cpu:/\n")  # a v1-only machine has no 0:: line
    assert own_cgroup(proc) is None and CgroupJobs.detect(root, proc) is None
    proc.write_text("0::/user.slice/gpusched\n")
    (root / "user.slice/gpusched/cgroup.controllers").write_text("cpu pids\n")
    assert CgroupJobs.detect(root, proc) is None
