"""Job semantics on a real daemon: priorities, hold, dependencies, arrays, time limits,
retries, drain, GPU constraints, placement policies, outside processes, per-user limits.

The daemon's decisions about each feature are tested in process (test_inproc_queue.py,
test_inproc_runs.py); here each feature goes once through the real CLI, daemon and jobs.
Jobs are real processes; the test decides when each one ends by creating the file it
waits for, and jobs report what they saw (environment, signals, times) in files.
Commands under test go through the real CLI; polling goes through the real socket with
the client library, which costs milliseconds instead of a Python start per look.
"""

from __future__ import annotations

import getpass
import itertools
import os
import re
import shlex
import time
from pathlib import Path

import pytest

from conftest import DEADLINE_S, REPO, Home, is_gone, wait_until
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths


# -- helpers --------------------------------------------------------------------------------
def configure(home, extra: str = "", daemon: str = "") -> None:
    """Every test home: a short SIGTERM-to-SIGKILL grace, and enough cores counted that the
    host's CPUs never limit how many of these sleeping shell jobs run at once."""
    home.write_config(f'[daemon]\ncancel_grace = "0.5s"\n{daemon}\n[host]\ncpus = 64\n\n{extra}')


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One daemon on 4 simulated 80 GiB GPUs, for the tests whose jobs stay out of each
    other's way (a daemon start and stop costs seconds on a loaded machine)."""
    home = Home(tmp_path_factory.mktemp("shared") / "home")
    home.path.mkdir()
    configure(home, "[scheduling]\ngpu_order = [2, 0, 3, 1]\n")
    yield home
    home.cleanup()


@pytest.fixture
def box(shared):
    """The shared daemon, left with nothing pending or running after each test."""
    yield shared
    active = [i for i, j in jobs(shared).items() if j["state"] in ("pending", "running")]
    if active:
        client(shared).call("cancel", ids=active)
        wait_until(
            lambda: not any(j["state"] in ("pending", "running") for j in jobs(shared).values()),
            "the shared queue to empty",
        )


def client(home) -> Client:
    return Client(resolve_paths(home.env), autostart=False)


def stop_daemon(home) -> int:
    """Stop the daemon over the socket and wait until its process is gone; returns its pid."""
    pid = client(home).call("status")["pid"]
    client(home).call("stop")
    wait_until(lambda: is_gone(pid), "the daemon to stop")
    return pid


def show(home, job_id: int) -> dict:
    return client(home).call("show", ids=[job_id])["jobs"][0]


def jobs(home) -> dict[int, dict]:
    return {j["id"]: j for j in client(home).call("list", all=True)["jobs"]}


def wait_state(home, job_id: int, *states: str, timeout: float = DEADLINE_S) -> dict:
    return wait_until(
        lambda: (j := show(home, job_id))["state"] in states and j,
        f"job {job_id} to reach {states}",
        timeout,
    )


def wait_reason(home, job_id: int, start: str) -> dict:
    """Wait until a pending job's reason starts with `start`: a scheduling pass saw it."""
    job = wait_until(
        lambda: (j := show(home, job_id))["pending_reason"].startswith(start) and j,
        f"job {job_id} to wait because {start!r}",
    )
    assert job["state"] == "pending"
    return job


def gate(path: Path) -> str:
    """Shell that blocks until `path` exists: the test decides when a job may end."""
    return f"while [ ! -e {shlex.quote(str(path))} ]; do sleep 0.05; done"


def sh(script: str) -> list[str]:
    return ["--", "sh", "-c", script]


def refused(home, *args: str) -> str:
    """Run a command that must be refused as a bad command line; return its one-line error."""
    proc = home.run(*args, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("Error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc.stderr


def declare_outside(home, *processes: dict) -> float:
    """Outside processes on the simulated GPUs; returns when the file was written."""
    home.state.mkdir(parents=True, exist_ok=True)
    blocks = []
    for proc in processes:
        fields = "".join(
            f"{k} = {v!r}\n" if isinstance(v, str) else f"{k} = {v}\n" for k, v in proc.items()
        )
        blocks.append("[[process]]\n" + fields)
    target = home.state / "simulated_processes.toml"
    tmp = target.with_suffix(".tmp")
    tmp.write_text("\n".join(blocks))
    written = time.time()
    os.replace(tmp, target)
    return written


def outside_seen(home, gpu: int) -> set[int]:
    return {
        p["pid"] for p in client(home).call("gpus")["gpus"][gpu]["processes"] if p["job"] is None
    }


def stamp(path: Path) -> float:
    """The last time a job wrote into a file with `date +%s.%N`."""
    return float(path.read_text().split()[-1])


# -- priorities, hold and release ------------------------------------------------------
def test_the_highest_priority_job_takes_a_freed_gpu_and_update_reorders(box, tmp_path):
    """`submit --priority` and `gpusched update` reach the real daemon's order: three jobs
    that want one GPU run one after another, highest priority first (each turn of the
    order, and the refusals, are in test_inproc_queue.py)."""
    home = box
    gpu0 = ("--gpus", "1", "--gpu-ids", "0")  # all four want the same GPU
    blocker = home.submit(*gpu0, *sh(gate(tmp_path / "blocker")))
    wait_state(home, blocker, "running")
    low = home.submit(*gpu0, "--", "true")
    high = home.submit(*gpu0, "--priority", "5", "--", "true")
    bumped = home.submit(*gpu0, "--priority", "1", "--", "true")
    out = home.run("update", str(bumped), "--priority", "10").stdout
    assert out == f"job {bumped}: priority 10\n"
    (tmp_path / "blocker").touch()
    ran = [wait_state(home, i, "succeeded") for i in (bumped, high, low)]
    for earlier, later in itertools.pairwise(ran):
        assert later["started_at"] >= earlier["ended_at"]


def test_hold_and_release(box, tmp_path):
    """A job submitted with --hold does not run until `gpusched release` (holding a waiting
    job, and what a held job lets pass, are in test_inproc_queue.py)."""
    home = box
    # A CPU job would start at once; held, it waits with a reason that says how to go on.
    held = home.submit("--hold", *sh(f"touch {tmp_path / 'held-ran'}"))
    job = wait_reason(home, held, "held")
    assert job["pending_reason"] == f"held (`gpusched release {held}` lets it start)"
    assert job["held"] is True and not (tmp_path / "held-ran").exists()
    assert home.run("release", str(held)).stdout == f"job {held}: released\n"
    assert wait_state(home, held, "succeeded")["held"] is False
    assert (tmp_path / "held-ran").exists()


# -- dependencies ---------------------------------------------------------------------------
def test_a_job_after_another_starts_once_it_ended_and_bad_dependencies_are_refused(box, tmp_path):
    """One dependency through the CLI on a real job, and the refusals as a user sees them
    (every kind of dependency, and those that can never be met, are in test_inproc_queue.py)."""
    home = box
    ok = home.submit(*sh(gate(tmp_path / "ok")))
    after_ok = home.submit("--after", str(ok), "--", "true")
    assert wait_reason(home, after_ok, "waiting")["pending_reason"] == f"waiting for afterok:{ok}"
    (tmp_path / "ok").touch()
    ok_job = wait_state(home, ok, "succeeded")
    assert wait_state(home, after_ok, "succeeded")["started_at"] >= ok_job["ended_at"]

    unknown = refused(home, "submit", "--after", "99999", "--", "true")
    assert "dependency on job 99999, which does not exist" in unknown
    assert "KIND one of afterok, afterany, afternotok" in refused(
        home, "submit", "-d", f"before:{ok}", "--", "true"
    )


# -- arrays ---------------------------------------------------------------------------------
def test_an_array_runs_at_most_its_throttle_folds_in_ls_and_cancels(box, tmp_path):
    """An array through the CLI: each element sees its own index, `ls` folds the array, an
    element that ends lets exactly one more start, and `cancel` takes one element or the
    rest (every step of the throttle and of cancel is in test_inproc_queue.py)."""
    home = box
    out = tmp_path / "array"
    out.mkdir()
    array_id = home.json(
        "submit",
        "--array",
        "0-5%2",
        *sh(
            f'echo "$GPUSCHED_ARRAY_ID $GPUSCHED_ARRAY_INDEX" > {out}/start-$GPUSCHED_ARRAY_INDEX; '
            f"while [ ! -e {tmp_path}/go.$GPUSCHED_ARRAY_INDEX ]; do sleep 0.05; done"
        ),
    )["ids"][0]
    ids = list(range(array_id, array_id + 6))
    wait_until(lambda: len(list(out.glob("start-*"))) == 2, "two elements to start")
    listed = jobs(home)
    assert [listed[i]["array_index"] for i in ids] == [0, 1, 2, 3, 4, 5]
    assert [listed[i]["state"] for i in ids] == ["running"] * 2 + ["pending"] * 4
    assert wait_reason(home, ids[-1], "array")["pending_reason"] == (
        f"array {array_id} already runs 2 at once (%2)"
    )

    folded = home.run("ls").stdout.splitlines()
    rows = [line for line in folded if line.startswith(f"{array_id}_")]
    assert len(rows) == 1 and rows[0].startswith(f"{array_id}_[0-5%2]"), folded
    assert "2 running, 4 pending" in rows[0]
    assert len(folded) == 2  # the header and the array
    expanded = home.run("ls", "-r").stdout.splitlines()
    # Each element by its ARRAY_INDEX, as squeue -r names them (not its bare job id).
    assert sorted(line.split()[0] for line in expanded[1:]) == [f"{array_id}_{i}" for i in range(6)]

    (tmp_path / "go.0").touch()
    wait_state(home, ids[0], "succeeded")
    wait_until(lambda: (out / "start-2").exists(), "element 2 to take element 0's place")
    assert sorted(p.name for p in out.iterdir()) == ["start-0", "start-1", "start-2"]
    for index in range(3):
        assert (out / f"start-{index}").read_text().split() == [str(array_id), str(index)]

    assert home.run("cancel", f"{array_id}_5").stdout == f"job {ids[5]}: cancelled\n"
    assert home.run("cancel", str(array_id)).stdout == (
        f"job {ids[0]}: already succeeded\njob {ids[1]}: cancelling\njob {ids[2]}: cancelling\n"
        f"job {ids[3]}: cancelled\njob {ids[4]}: cancelled\njob {ids[5]}: already cancelled\n"
    )
    for job_id in ids[1:]:
        wait_state(home, job_id, "cancelled")
    assert sorted(p.name for p in out.iterdir()) == ["start-0", "start-1", "start-2"]


# -- time limits ----------------------------------------------------------------------------
def test_time_limit_warns_then_terminates_and_kills_a_job_that_ignores_term(box, tmp_path):
    """A real job gets its time limit's signals on time: the warning (B:, so the shell that
    traps it gets it), SIGTERM at the limit, and SIGKILL cancel_grace later as it ignores
    SIGTERM (when each is due, and what the end says, are in test_inproc_runs.py)."""
    home = box
    t = tmp_path
    job_id = home.submit(
        "--time",
        "2s",
        "--signal",
        "B:USR1@1",
        *sh(
            f"trap 'date +%s.%N > {t}/usr1' USR1; trap 'date +%s.%N > {t}/term' TERM; "
            f"env > {t}/env; while :; do sleep 0.05; done"
        ),
    )

    job = wait_state(home, job_id, "timeout", "failed", "succeeded", timeout=30)
    assert (job["state"], job["signal"]) == ("timeout", 9)
    # The job wrote down when each signal reached it; the daemon sends them at the
    # latest possible moment after they are due (the slack is for a loaded machine).
    started = job["started_at"]
    assert 0.95 <= stamp(t / "usr1") - started <= 2.5  # due 1 s after the start
    assert 1.95 <= stamp(t / "term") - started <= 4.0  # due at the 2 s limit
    # SIGTERM was trapped, not obeyed; SIGKILL came cancel_grace (0.5 s) later.
    assert 2.4 <= job["ended_at"] - started <= 7.0
    env = dict(line.split("=", 1) for line in (t / "env").read_text().splitlines() if "=" in line)
    assert env["GPUSCHED_WARN_SIGNAL"] == "SIGUSR1"
    assert abs(float(env["GPUSCHED_TIME_LIMIT_END"]) - (started + 2)) < 0.01


# -- retries --------------------------------------------------------------------------------
def test_a_failing_job_is_retried_after_its_delay_and_ls_says_when(box, tmp_path):
    """A real job that fails runs again after its --retry-delay and sees its attempt; `ls`
    shows a retry that waits (which ends retry, the doubling and the exact delays are in
    test_inproc_runs.py)."""
    home = box
    attempts = tmp_path / "attempts"  # each attempt writes its number and its start
    failing = home.submit(
        "--retries",
        "1",
        "--retry-delay",
        "1s",
        *sh(f'echo "$GPUSCHED_ATTEMPT $(date +%s.%N)" >> {attempts}; exit 3'),
    )
    later = home.submit("--retries", "1", "--retry-delay", "1m", *sh("exit 4"))
    job = wait_reason(home, later, "retrying")
    found = re.fullmatch(
        r"retrying after attempt 1 failed; eligible in (\d+)s", job["pending_reason"]
    )
    assert found and 1 <= int(found.group(1)) <= 60, job["pending_reason"]
    assert job["eligible_at"] > time.time() and job["exit_code"] == 4
    assert "retrying after attempt 1 failed" in home.run("ls").stdout
    assert home.run("cancel", str(later)).stdout == f"job {later}: cancelled\n"

    job = wait_state(home, failing, "failed")
    assert (job["attempt"], job["exit_code"]) == (2, 3)
    (first, first_s), (second, second_s) = (
        line.split() for line in attempts.read_text().splitlines()
    )
    assert (first, second) == ("1", "2")
    assert float(second_s) - float(first_s) >= 1.0  # the delay, on the job's own clock
    assert "--retry-on takes: failed, timeout" in refused(
        home, "submit", "--retries", "1", "--retry-on", "sometimes", "--", "true"
    )


# -- drain ----------------------------------------------------------------------------------
def test_drain_and_per_user_limits_survive_a_restart(make_home, tmp_path):
    """The per-user limit from the config file, `drain` and `resume` through the CLI, and a
    drain that a new daemon process reads back from the queue (each case of the drain and
    the limits is in test_inproc_queue.py)."""
    home = make_home("1x80GiB")
    configure(home, "[scheduling]\nmax_running_per_user = 1\n")
    user = getpass.getuser()
    draining = "the queue is draining (`gpusched resume` starts jobs again)"
    first = home.submit(*sh(gate(tmp_path / "first")))
    second = home.submit("--", "true")
    wait_state(home, first, "running")
    assert wait_reason(home, second, "quota ")["pending_reason"] == (
        f"quota default max_running_jobs=1: {user} runs 1 job"
    )

    assert home.run("drain").stdout == "draining: nothing new starts; 1 job(s) still running\n"
    # The running job finishes; the job that waited for it now waits for the drain.
    (tmp_path / "first").touch()
    wait_state(home, first, "succeeded")
    assert wait_reason(home, second, "the queue")["pending_reason"] == draining

    # The drain is stored: a restarted daemon still starts nothing.
    pid = stop_daemon(home)
    third = home.submit("--", "true")  # starts a new daemon; its pass sees every job
    assert client(home).call("status")["pid"] != pid
    assert wait_reason(home, third, "the queue")["pending_reason"] == draining
    assert client(home).call("status")["draining"] is True
    assert show(home, second)["state"] == "pending"

    assert home.run("resume").stdout == "resumed: jobs start again\n"
    ended = [wait_state(home, i, "succeeded") for i in (second, third)]
    assert ended[1]["started_at"] >= ended[0]["ended_at"]  # the limit holds after the restart
    assert client(home).call("status")["draining"] is False


# -- GPU constraints ------------------------------------------------------------------------
MIXED = "2xH100-80GiB,2xA100-40GiB"


def test_gpu_constraints_on_a_mixed_box(make_home):
    home = make_home(MIXED)
    configure(home)
    # The very first command starts the daemon: even then the GPUs are known at submit.
    error = refused(home, "submit", "--gpus", "1", "--gpu-type", "V100", "--", "true")
    assert error == (
        "Error: job asks for 1 GPU that meets its constraints; none of the 4 GPUs "
        "here meet them (GPU 0: NVIDIA H100, 80.0 GiB, sm 9.0; GPU 1: NVIDIA H100, "
        "80.0 GiB, sm 9.0; GPU 2: NVIDIA A100, 40.0 GiB, sm 8.0; GPU 3: NVIDIA A100, "
        "40.0 GiB, sm 8.0); see `gpusched gpus`\n"
    )
    for args in (
        ["--gpus", "3", "--min-compute-capability", "9.0"],
        ["--gpus", "1", "--min-gpu-total-mem", "100G"],
        ["--gpus", "4", "--exclude-gpus", "3"],
    ):
        error = refused(home, "submit", *args, "--", "true")
        assert "its constraints; " in error and "of the 4 GPUs here meet them (" in error
        assert "NVIDIA A100" in error
    error = refused(home, "submit", "--gpus", "1", "--gpu-ids", "7", "--", "true")
    assert "this box has no GPU 7: it has GPUs 0-3" in error
    error = refused(home, "submit", "--gpu-mem", "50G", "--gpu-type", "A100", "--", "true")
    assert "asks for 50.0 GiB on each of 1 GPU(s); the largest here have 40.0 GiB" in error
    assert "need --gpus 1 or more" in refused(
        home, "submit", "--gpus", "0", "--gpu-type", "A100", "--", "true"
    )

    cases = {
        ("--gpus", "2", "--gpu-ids", "0,2"): [[0, 2]],
        ("--gpus", "1", "--exclude-gpus", "0,1,2"): [[3]],
        ("--gpus", "2", "--gpu-type", "a100"): [[2, 3]],  # any case, part of the name
        ("--gpus", "2", "--min-gpu-total-mem", "60G"): [[0, 1]],
        ("--gpus", "1", "--min-compute-capability", "9.0"): [[0], [1]],
        ("--gpu-mem", "10G", "--gpu-type", "H100", "--gpu-ids", "1,2"): [[1]],
    }
    ids = {home.submit(*args, "--", "true"): allowed for args, allowed in cases.items()}
    for job_id, allowed in ids.items():
        job = wait_state(home, job_id, "succeeded", "failed")
        assert job["state"] == "succeeded" and sorted(job["gpu_indices"]) in allowed, job
    assert show(home, next(iter(ids)))["constraints"]["gpu_ids"] == [0, 2]


# -- placement policies ---------------------------------------------------------------------
def test_spread_pack_and_order_policies(box, tmp_path):
    home = box  # its config: gpu_order = [2, 0, 3, 1]

    def two(*args: str) -> list[int]:
        sweep = tmp_path / f"sweep{len(list(tmp_path.glob('sweep*')))}"
        sweep.write_text(f"{gate(tmp_path / 'go')}\n" * 2)
        ids = home.json("submit", "--gpu-mem", "10G", *args, "--from-file", str(sweep))["ids"]
        return [wait_state(home, i, "running")["gpu_indices"] for i in ids]

    # spread: most free memory first, so the two jobs take two GPUs.
    assert two("--policy", "spread") == [[3], [2]]
    # pack (best fit, the default): both onto one already-used GPU, leaving others whole.
    assert two() == [[3], [3]]
    # order: GPU 2 before 0, 3 and 1, for as long as it has room.
    assert two("--policy", "order") == [[2], [2]]
    assert client(home).call("status")["policy"] == "pack"
    error = refused(home, "submit", "--gpus", "1", "--policy", "fastest", "--", "true")
    assert error == (
        "Error: unknown policy 'fastest'; choose one of: pack, spread, round-robin, "
        "weighted-round-robin, order\n"
    )
    (tmp_path / "go").touch()


def test_round_robin_policies(make_home):
    home = make_home("3x80GiB")
    configure(home, '[scheduling]\npolicy = "round-robin"\ngpu_weights = [2, 1, 1]\n')

    def placed(count: int, *args: str) -> list[int]:
        ids = home.json("submit", "--gpu-mem", "1G", *args, "--array", f"1-{count}", "--", "true")[
            "ids"
        ]
        return [wait_state(home, i, "succeeded")["gpu_indices"][0] for i in ids]

    # Weighted: GPU 0 (weight 2) takes twice the jobs of GPUs 1 and 2.
    assert placed(8, "--policy", "weighted-round-robin") == [0, 1, 2, 0, 0, 1, 2, 0]
    # Round-robin (from the config) fills the least-used GPUs until all are even again.
    assert placed(4) == [1, 2, 1, 2]
    assert placed(3) == [0, 1, 2]


# -- custom policies from entry points -----------------------------------------------------
POLICY_MODULE = '''
"""An example gpusched placement policy: the highest GPU index first, whatever its load."""


def last_first(request, candidates, ctx):
    return sorted(candidates, key=lambda load: load.gpu.index, reverse=True)


def twice(request, candidates, ctx):
    """A buggy policy: it offers its favourite GPU again and again."""
    return [candidates[0]] * len(candidates)


def broken(request, candidates, ctx):
    raise RuntimeError("this policy is broken")
'''


def install_example_policy(root: Path) -> None:
    """An installed distribution as importlib.metadata sees one: a module and its dist-info."""
    root.mkdir()
    (root / "example_gpusched_policy.py").write_text(POLICY_MODULE)
    info = root / "example_gpusched_policy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: example-gpusched-policy\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[gpusched.policies]\nlast-first = example_gpusched_policy:last_first\n"
        "twice = example_gpusched_policy:twice\nbroken = example_gpusched_policy:broken\n"
    )


def test_a_custom_policy_from_an_installed_package(home, tmp_path):
    install_example_policy(tmp_path / "site")
    home.env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path / "site")])
    configure(home, '[scheduling]\npolicy = "last-first"\n')
    # Someone else's process holds 20 GiB of GPU 1 (the daemon reads it before placing).
    declare_outside(home, {"gpu": 1, "pid": 4242, "user": "alice", "memory": "20GiB"})
    # Best fit would put a 10 GiB job on GPU 1, the fullest that fits; last-first takes 3.
    first = home.submit("--gpu-mem", "10G", *sh(gate(tmp_path / "go")))
    assert wait_state(home, first, "running")["gpu_indices"] == [3]
    assert client(home).call("status")["policy"] == "last-first"
    packed = home.submit("--gpu-mem", "10G", "--policy", "pack", *sh(gate(tmp_path / "go")))
    assert wait_state(home, packed, "running")["gpu_indices"] == [1]
    again = home.submit("--gpu-mem", "10G", "--policy", "last-first", *sh(gate(tmp_path / "go")))
    assert wait_state(home, again, "running")["gpu_indices"] == [3]
    assert refused(home, "submit", "--gpus", "1", "--policy", "fastest", "--", "true") == (
        "Error: unknown policy 'fastest'; choose one of: pack, spread, round-robin, "
        "weighted-round-robin, order, last-first, twice, broken\n"
    )

    # Policies are third-party code. One that offers a GPU twice cannot give a job the same
    # GPU twice, and one that fails places nothing; the daemon goes on placing other jobs.
    doubled = home.submit("--gpus", "2", "--policy", "twice", "--", "true")
    failing = home.submit("--gpus", "1", "--policy", "broken", "--", "true")
    later = home.submit("--gpus", "1", "--", "true")
    assert wait_state(home, later, "succeeded")["gpu_indices"] == [2]
    assert show(home, doubled)["state"] == "pending" and show(home, failing)["state"] == "pending"
    (tmp_path / "go").touch()
    for job_id in (first, packed, again):
        wait_state(home, job_id, "succeeded")

    # A policy the config names must exist, or the daemon does not start; it says why.
    stop_daemon(home)
    configure(home, '[scheduling]\npolicy = "fastest"\n')
    proc = home.run("submit", "--", "true", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        "scheduling.policy: unknown policy 'fastest'; choose one of: pack, spread, "
        "round-robin, weighted-round-robin, order, last-first, twice, broken"
    ) in proc.stderr


# -- outside processes ----------------------------------------------------------------------
def test_outside_processes_block_unless_small_or_idle(make_home, tmp_path):
    home = make_home("2x80GiB")
    configure(
        home,
        '[gpus]\noutside = "block"\noutside_ignore_below = "1GiB"\noutside_idle_after = "3s"\n',
        daemon='gpu_poll_interval = "0.2s"\n',
    )
    # Declared before the daemon starts: it reads the GPUs before it places a job.
    declare_outside(home, {"gpu": 0, "pid": 4242, "user": "alice", "memory": "5GiB", "util": 40})
    # Best fit would choose GPU 0, the fuller one; "block" keeps every job off it.
    anywhere = home.submit("--gpu-mem", "1G", "--", "true")
    assert wait_state(home, anywhere, "succeeded")["gpu_indices"] == [1]
    pinned = home.submit("--gpu-mem", "1G", "--gpu-ids", "0", "--", "true")
    assert wait_reason(home, pinned, "GPU 0")["pending_reason"] == (
        "GPU 0 is in use by pid 4242 (alice)"
    )
    # Under outside_ignore_below the process no longer counts.
    declare_outside(home, {"gpu": 0, "pid": 4242, "user": "alice", "memory": "512MiB", "util": 40})
    assert wait_state(home, pinned, "succeeded")["gpu_indices"] == [0]

    # A big process idle (0% busy) for outside_idle_after is ignored too, not before.
    written = declare_outside(
        home, {"gpu": 0, "pid": 4343, "user": "bob", "memory": "20GiB", "util": 0}
    )
    wait_until(lambda: outside_seen(home, 0) == {4343}, "the daemon to see the idle process")
    idle = home.submit("--gpu-mem", "1G", "--gpu-ids", "0", "--", "true")
    job = wait_state(home, idle, "succeeded")
    assert job["gpu_indices"] == [0] and job["started_at"] >= written + 3.0
