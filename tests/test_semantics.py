"""Job semantics on a real daemon: priorities, hold, dependencies, arrays, time limits,
retries, drain, GPU constraints, placement policies, outside processes, per-user limits.

Jobs are real processes; the test decides when each one ends by creating the file it
waits for, and jobs report what they saw (environment, signals, times) in files.
Commands under test go through the real CLI; polling goes through the real socket with
the client library, which costs milliseconds instead of a Python start per look.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import time
from pathlib import Path

import pytest

from conftest import DEADLINE_S, REPO, Home, is_gone, wait_until
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths
from gpusched.core.errors import NotFound


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
        wait_until(lambda: not any(j["state"] in ("pending", "running")
                                   for j in jobs(shared).values()), "the shared queue to empty")


def client(home) -> Client:
    return Client(resolve_paths(home.env), autostart=False)


def stop_daemon(home) -> int:
    """Stop the daemon over the socket and wait until its process is gone; returns its pid."""
    pid = client(home).call("status")["pid"]
    client(home).call("stop")
    wait_until(lambda: is_gone(pid), "the daemon to stop")
    return pid


def change(home, command: str, *ids: int | str, **args) -> dict[str, str]:
    """A job command (cancel, hold, ...) over the socket: {id: outcome}. The CLI's own
    output is checked once per command; the client saves a Python start per call."""
    return client(home).call(command, ids=list(ids), **args)["results"]


def show(home, job_id: int) -> dict:
    return client(home).call("show", ids=[job_id])["jobs"][0]


def jobs(home) -> dict[int, dict]:
    return {j["id"]: j for j in client(home).call("list", all=True)["jobs"]}


def wait_state(home, job_id: int, *states: str, timeout: float = DEADLINE_S) -> dict:
    return wait_until(lambda: (j := show(home, job_id))["state"] in states and j,
                      f"job {job_id} to reach {states}", timeout)


def wait_reason(home, job_id: int, start: str) -> dict:
    """Wait until a pending job's reason starts with `start`: a scheduling pass saw it."""
    job = wait_until(lambda: (j := show(home, job_id))["pending_reason"].startswith(start) and j,
                     f"job {job_id} to wait because {start!r}")
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
        fields = "".join(f"{k} = {v!r}\n" if isinstance(v, str) else f"{k} = {v}\n"
                         for k, v in proc.items())
        blocks.append("[[process]]\n" + fields)
    target = home.state / "simulated_processes.toml"
    tmp = target.with_suffix(".tmp")
    tmp.write_text("\n".join(blocks))
    written = time.time()
    os.replace(tmp, target)
    return written


def outside_seen(home, gpu: int) -> set[int]:
    return {p["pid"] for p in client(home).call("gpus")["gpus"][gpu]["processes"] if p["job"] is None}


def stamp(path: Path) -> float:
    """The last time a job wrote into a file with `date +%s.%N`."""
    return float(path.read_text().split()[-1])


# -- priorities, hold and release ------------------------------------------------------
def test_the_highest_priority_job_takes_a_freed_gpu_and_update_reorders(box, tmp_path):
    home = box
    gpu0 = ("--gpus", "1", "--gpu-ids", "0")  # all four want the same GPU
    blocker = home.submit(*gpu0, *sh(gate(tmp_path / "blocker")))
    wait_state(home, blocker, "running")
    low = home.submit(*gpu0, *sh(gate(tmp_path / "low")))
    high = home.submit(*gpu0, "--priority", "5", *sh(gate(tmp_path / "high")))
    bumped = home.submit(*gpu0, "--priority", "1", *sh(gate(tmp_path / "bumped")))
    out = home.run("update", str(bumped), "--priority", "10").stdout
    assert out == f"job {bumped}: priority 10\n"
    assert show(home, bumped)["priority"] == 10

    # Each time the GPU frees up, the highest-priority waiting job takes it.
    for ended, starts, waiting in (("blocker", bumped, [high, low]), ("bumped", high, [low]),
                                   ("high", low, [])):
        (tmp_path / ended).touch()
        wait_state(home, starts, "running")
        assert [show(home, i)["state"] for i in waiting] == ["pending"] * len(waiting)
    (tmp_path / "low").touch()
    wait_state(home, low, "succeeded")
    assert client(home).call("update", ids=[low], priority=3)["refused"] == {
        str(low): "already succeeded; only pending and running jobs can be updated"}


def test_hold_and_release(box, tmp_path):
    home = box
    # A CPU job would start at once; held, it waits with a reason that says how to go on.
    held = home.submit("--hold", *sh(f"touch {tmp_path / 'held-ran'}"))
    job = wait_reason(home, held, "held")
    assert job["pending_reason"] == f"held (`gpusched release {held}` lets it start)"
    assert job["held"] is True and not (tmp_path / "held-ran").exists()
    assert home.run("release", str(held)).stdout == f"job {held}: released\n"
    assert wait_state(home, held, "succeeded")["held"] is False
    assert (tmp_path / "held-ran").exists()

    # `hold` on a job waiting for the GPU: a later job takes the GPU when it frees up.
    gpu1 = ("--gpus", "1", "--gpu-ids", "1")
    blocker = home.submit(*gpu1, *sh(gate(tmp_path / "blocker")))
    wait_state(home, blocker, "running")
    waiting = home.submit(*gpu1, *sh(gate(tmp_path / "waiting")))
    assert home.run("hold", str(waiting)).stdout == f"job {waiting}: held\n"
    later = home.submit(*gpu1, *sh(gate(tmp_path / "later")))
    assert client(home).call("hold", ids=[blocker])["refused"] == {
        str(blocker): "running; only pending jobs can be held or released"}
    (tmp_path / "blocker").touch()
    wait_state(home, later, "running")
    assert show(home, waiting)["pending_reason"] == f"held (`gpusched release {waiting}` lets it start)"
    assert change(home, "release", waiting) == {str(waiting): "released"}
    (tmp_path / "later").touch()
    wait_state(home, waiting, "running")
    (tmp_path / "waiting").touch()
    wait_state(home, waiting, "succeeded")


# -- dependencies ---------------------------------------------------------------------------
def test_dependencies_order_starts_and_say_when_they_can_never_be_met(box, tmp_path):
    home = box
    ok = home.submit(*sh(gate(tmp_path / "ok")))
    bad = home.submit(*sh(gate(tmp_path / "bad") + "; exit 3"))
    after_ok = home.submit("--after", str(ok), "--", "true")
    any_bad = home.submit("--dependency", f"afterany:{bad}", "--", "true")
    notok_bad = home.submit("-d", f"afternotok:{bad}", "--", "true")
    both = home.submit("-d", f"afterok:{ok},afternotok:{bad}", "--", "true")
    never = home.submit("-d", f"afterok:{bad}", "--", "true")
    killed = home.submit("-d", f"afterok:{bad}", "--kill-on-invalid-dep", "--", "true")
    notok_ok = home.submit("-d", f"afternotok:{ok}", "--kill-on-invalid-dep", "--", "true")
    assert wait_reason(home, after_ok, "waiting")["pending_reason"] == f"waiting for afterok:{ok}"
    assert wait_reason(home, both, "waiting")["pending_reason"] == (
        f"waiting for afterok:{ok}, afternotok:{bad}")
    assert show(home, after_ok)["dependencies"] == [f"afterok:{ok}"]

    (tmp_path / "ok").touch()
    ok_job = wait_state(home, ok, "succeeded")
    assert wait_state(home, after_ok, "succeeded")["started_at"] >= ok_job["ended_at"]
    cancelled = wait_state(home, notok_ok, "cancelled")
    assert cancelled["end_reason"] == (f"dependency afternotok:{ok} can never be met: "
                                       f"job {ok} ended succeeded")
    assert show(home, any_bad)["state"] == "pending"

    (tmp_path / "bad").touch()
    bad_job = wait_state(home, bad, "failed")
    for job_id in (any_bad, notok_bad, both):
        assert wait_state(home, job_id, "succeeded")["started_at"] >= bad_job["ended_at"]
    reason = f"dependency afterok:{bad} can never be met: job {bad} ended failed"
    assert wait_reason(home, never, "dependency")["pending_reason"] == reason
    job = wait_state(home, killed, "cancelled")
    assert job["end_reason"] == reason and job["started_at"] is None

    # Only existing jobs can be depended on; a new job's id does not exist yet, so no job
    # can depend on a later one and a cycle can never form.
    unknown = refused(home, "submit", "--after", "99999", "--", "true")
    assert "dependency on job 99999, which does not exist" in unknown
    next_id = max(jobs(home)) + 1
    assert f"job {next_id}, which does not exist" in refused(
        home, "submit", "-d", f"afterany:{next_id}", "--", "true")
    assert max(jobs(home)) == next_id - 1  # nothing was queued
    assert "KIND one of afterok, afterany, afternotok" in refused(
        home, "submit", "-d", f"before:{ok}", "--", "true")


# -- arrays ---------------------------------------------------------------------------------
ELEMENT = ('echo "$GPUSCHED_ARRAY_ID $GPUSCHED_ARRAY_INDEX $(date +%s.%N)" > {out}/start-$GPUSCHED_ARRAY_INDEX; '
           '{gate}; sleep 0.3; date +%s.%N > {out}/end-$GPUSCHED_ARRAY_INDEX')


def test_a_dependency_on_an_array_waits_for_every_element(box, tmp_path):
    home = box
    array = home.json("submit", "--array", "0-1", "--", "sh", "-c",
                      f"while [ ! -e {tmp_path}/go.$GPUSCHED_ARRAY_INDEX ]; do sleep 0.05; done")
    first, second = array["ids"]
    after = home.submit("--after", str(first), "--", "true")
    (tmp_path / "go.0").touch()
    wait_state(home, first, "succeeded")
    assert wait_reason(home, after, "waiting")["state"] == "pending"  # element 1 still runs
    (tmp_path / "go.1").touch()
    done = wait_state(home, second, "succeeded")
    assert wait_state(home, after, "succeeded")["started_at"] >= done["ended_at"]


def test_an_array_runs_at_most_its_throttle_at_once_and_folds_in_ls(box, tmp_path):
    home = box
    out = tmp_path / "array"
    out.mkdir()
    array_id = home.json("submit", "--array", "0-5%2", *sh(
        ELEMENT.format(out=out, gate=gate(tmp_path / "go"))))["ids"][0]
    ids = list(range(array_id, array_id + 6))
    wait_until(lambda: len(list(out.glob("start-*"))) == 2, "two elements to start")
    listed = jobs(home)
    assert sorted(listed[i]["array_index"] for i in ids) == [0, 1, 2, 3, 4, 5]
    assert [listed[i]["state"] for i in ids] == ["running"] * 2 + ["pending"] * 4
    assert wait_reason(home, ids[-1], "array")["pending_reason"] == (
        f"array {array_id} already runs 2 at once (%2)")

    folded = home.run("ls").stdout.splitlines()
    rows = [line for line in folded if line.startswith(f"{array_id}_")]
    assert len(rows) == 1 and rows[0].startswith(f"{array_id}_[0-5%2]"), folded
    assert "2 running, 4 pending" in rows[0]
    assert len(folded) == 2  # the header and the array
    expanded = home.run("ls", "-r").stdout.splitlines()
    assert sorted(int(line.split()[0]) for line in expanded[1:]) == ids

    (tmp_path / "go").touch()
    for job_id in ids:
        wait_state(home, job_id, "succeeded")
    spans = []
    for index in range(6):
        got_array, got_index, start = (out / f"start-{index}").read_text().split()
        assert (int(got_array), int(got_index)) == (array_id, index)
        spans.append((float(start), stamp(out / f"end-{index}")))
    for start, _ in spans:  # how many ran at each moment an element started
        assert sum(1 for s, e in spans if s <= start < e) <= 2, spans
    assert max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans) == 2


def test_cancel_takes_an_array_or_one_element(box, tmp_path):
    home = box
    array_id = home.json("submit", "--array", "0-3%2", *sh(gate(tmp_path / "never")))["ids"][0]
    e0, e1, e2, e3 = range(array_id, array_id + 4)
    wait_state(home, e1, "running")
    assert home.run("cancel", f"{array_id}_3").stdout == f"job {e3}: cancelled\n"
    assert show(home, e3)["state"] == "cancelled"
    assert show(home, e2)["state"] == "pending"
    with pytest.raises(NotFound, match=f"array {array_id} has no element 7"):
        change(home, "cancel", f"{array_id}_7")
    out = home.run("cancel", str(array_id)).stdout
    assert out == (f"job {e0}: cancelling\njob {e1}: cancelling\njob {e2}: cancelled\n"
                   f"job {e3}: already cancelled\n")
    for job_id in (e0, e1, e2):
        wait_state(home, job_id, "cancelled")
    assert not any(j["state"] in ("pending", "running") for j in jobs(home).values())


# -- time limits ----------------------------------------------------------------------------
def test_time_limit_warns_then_terminates_and_kills_a_job_that_ignores_term(box, tmp_path):
    home = box
    t = tmp_path
    warned = home.submit("--time", "3s", "--signal", "USR1@2", *sh(
        f"trap 'date +%s.%N > {t}/usr1' USR1; trap 'date +%s.%N > {t}/term; exit 143' TERM; "
        f"env > {t}/env; while :; do sleep 0.05; done"))
    stubborn = home.submit("--time", "2s", *sh(
        f"trap '' TERM; touch {t}/stubborn; while :; do sleep 0.05; done"))

    job = wait_state(home, warned, "timeout", "failed", "succeeded", timeout=30)
    assert job["state"] == "timeout"
    # The job wrote down when each signal reached it; the daemon sends them at the
    # latest possible moment after they are due (the slack is for a loaded machine).
    started = job["started_at"]
    assert 0.95 <= stamp(t / "usr1") - started <= 2.5  # due 1 s after the start
    assert 2.95 <= stamp(t / "term") - started <= 5.0  # due at the 3 s limit
    env = dict(line.split("=", 1) for line in (t / "env").read_text().splitlines() if "=" in line)
    assert env["GPUSCHED_WARN_SIGNAL"] == "SIGUSR1"
    assert abs(float(env["GPUSCHED_TIME_LIMIT_END"]) - (job["started_at"] + 3)) < 0.01

    job = wait_state(home, stubborn, "timeout", "failed", "succeeded", timeout=30)
    assert job["state"] == "timeout" and job["signal"] == 9
    # TERM at 2 s was ignored; SIGKILL came cancel_grace (0.5 s) later.
    assert 2.4 <= job["ended_at"] - job["started_at"] <= 7.0


# -- retries --------------------------------------------------------------------------------
def test_retries_requeue_failures_only_unless_asked(box, tmp_path):
    home = box
    t = tmp_path
    record = 'echo "$GPUSCHED_ATTEMPT" >> {}'.format
    at_once = ("--retry-delay", "0")  # which ends retry is the point here, not when
    failing = home.submit("--retries", "2", *at_once, *sh(f"{record(t / 'failing')}; exit 3"))
    cancelled = home.submit("--retries", "2", *at_once,
                            *sh(f"{record(t / 'cancelled')}; {gate(t / 'never')}"))
    # Its second attempt must end within the time limit too, counted from when the daemon
    # started it: on a loaded machine the shim and shell take more than a second to start.
    retried = home.submit("--retries", "1", *at_once, "--retry-on", "timeout", "--time", "10s", *sh(
        f'{record(t / "retried")}; [ "$GPUSCHED_ATTEMPT" -ge 2 ] || exec sleep 60'))
    timed_out = home.submit("--retries", "1", *at_once, "--time", "1s", *sh(
        f"{record(t / 'timed_out')}; exec sleep 30"))

    job = wait_state(home, failing, "failed")
    assert (job["attempt"], job["exit_code"]) == (3, 3)
    assert (t / "failing").read_text().split() == ["1", "2", "3"]

    wait_until(lambda: (t / "cancelled").exists(), "the cancellable job to start")
    assert change(home, "cancel", cancelled) == {str(cancelled): "cancelling"}
    job = wait_state(home, cancelled, "cancelled")
    assert job["attempt"] == 1 and (t / "cancelled").read_text().split() == ["1"]

    job = wait_state(home, retried, "succeeded")
    assert job["attempt"] == 2 and (t / "retried").read_text().split() == ["1", "2"]
    job = wait_state(home, timed_out, "timeout")
    assert job["attempt"] == 1 and (t / "timed_out").read_text().split() == ["1"]
    assert "--retry-on takes: failed, timeout" in refused(
        home, "submit", "--retries", "1", "--retry-on", "sometimes", "--", "true")


def test_retries_wait_their_delay_doubling_and_say_when_they_may_start(box, tmp_path):
    """A job that fails at once does not spend its attempts in a moment."""
    home = box
    starts = tmp_path / "starts"  # each attempt writes its start, on the job's own clock
    failing = home.submit("--retries", "2", "--retry-delay", "1s",
                          *sh(f"date +%s.%N >> {starts}; exit 3"))
    later = home.submit("--retries", "1", "--retry-delay", "1m", *sh("exit 4"))
    job = wait_reason(home, later, "retrying")
    found = re.fullmatch(r"retrying after attempt 1 failed; eligible in (\d+)s", job["pending_reason"])
    assert found and 1 <= int(found.group(1)) <= 60, job["pending_reason"]
    assert job["eligible_at"] > time.time() and job["exit_code"] == 4
    assert "retrying after attempt 1 failed" in home.run("ls").stdout
    assert change(home, "cancel", later) == {str(later): "cancelled"}

    job = wait_state(home, failing, "failed")
    assert (job["attempt"], job["exit_code"]) == (3, 3)
    first, second, third = map(float, starts.read_text().split())
    assert second - first >= 1.0  # the delay...
    assert third - second >= 2.0  # ...doubled after the second failure


# -- drain ----------------------------------------------------------------------------------
def test_drain_and_per_user_limits_survive_a_restart(make_home, tmp_path):
    home = make_home("1x80GiB")
    configure(home, "[scheduling]\nmax_running_per_user = 1\n")
    user = getpass.getuser()
    limit = f"{user} already runs 1 jobs (max_running_per_user)"
    draining = "the queue is draining (`gpusched resume` starts jobs again)"
    first = home.submit(*sh(gate(tmp_path / "first")))
    second = home.submit(*sh(gate(tmp_path / "second")))
    wait_state(home, first, "running")
    assert wait_reason(home, second, user)["pending_reason"] == limit

    assert home.run("drain").stdout == "draining: nothing new starts; 1 job(s) still running\n"
    third = home.submit("--", "true")
    assert wait_reason(home, third, "the queue")["pending_reason"] == draining
    # The running job finishes; the job that waited for it now waits for the drain.
    (tmp_path / "first").touch()
    wait_state(home, first, "succeeded")
    assert wait_reason(home, second, "the queue")["pending_reason"] == draining

    # The drain is stored: a restarted daemon still starts nothing.
    pid = stop_daemon(home)
    fourth = home.submit("--", "true")  # starts a new daemon; its pass sees every job
    assert client(home).call("status")["pid"] != pid
    assert wait_reason(home, fourth, "the queue")["pending_reason"] == draining
    assert client(home).call("status")["draining"] is True
    assert [show(home, i)["state"] for i in (second, third)] == ["pending", "pending"]

    assert home.run("resume").stdout == "resumed: jobs start again\n"
    wait_state(home, second, "running")  # the oldest; the limit keeps the others waiting
    assert wait_reason(home, third, user)["pending_reason"] == limit
    (tmp_path / "second").touch()
    ended = [wait_state(home, i, "succeeded") for i in (second, third, fourth)]
    for before, after in zip(ended, ended[1:]):  # one at a time
        assert after["started_at"] >= before["ended_at"]
    assert client(home).call("status")["draining"] is False


# -- GPU constraints ------------------------------------------------------------------------
MIXED = "2xH100-80GiB,2xA100-40GiB"


def test_gpu_constraints_on_a_mixed_box(make_home):
    home = make_home(MIXED)
    configure(home)
    # The very first command starts the daemon: even then the GPUs are known at submit.
    error = refused(home, "submit", "--gpus", "1", "--gpu-type", "V100", "--", "true")
    assert error == ("Error: job asks for 1 GPU that meets its constraints; none of the 4 GPUs "
                     "here meet them (GPU 0: NVIDIA H100, 80.0 GiB, sm 9.0; GPU 1: NVIDIA H100, "
                     "80.0 GiB, sm 9.0; GPU 2: NVIDIA A100, 40.0 GiB, sm 8.0; GPU 3: NVIDIA A100, "
                     "40.0 GiB, sm 8.0); see `gpusched gpus`\n")
    for args in (["--gpus", "3", "--min-compute-capability", "9.0"],
                 ["--gpus", "1", "--min-gpu-total-mem", "100G"],
                 ["--gpus", "4", "--exclude-gpus", "3"]):
        error = refused(home, "submit", *args, "--", "true")
        assert "its constraints; " in error and "of the 4 GPUs here meet them (" in error
        assert "NVIDIA A100" in error
    error = refused(home, "submit", "--gpus", "1", "--gpu-ids", "7", "--", "true")
    assert "this box has no GPU 7: it has GPUs 0-3" in error
    error = refused(home, "submit", "--gpu-mem", "50G", "--gpu-type", "A100", "--", "true")
    assert "asks for 50.0 GiB on each of 1 GPU(s); the largest here have 40.0 GiB" in error
    assert "need --gpus 1 or more" in refused(home, "submit", "--gpus", "0", "--gpu-type", "A100",
                                              "--", "true")

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
    assert error == ("Error: unknown policy 'fastest'; choose one of: pack, spread, round-robin, "
                     "weighted-round-robin, order\n")
    (tmp_path / "go").touch()


def test_round_robin_policies(make_home):
    home = make_home("3x80GiB")
    configure(home, '[scheduling]\npolicy = "round-robin"\ngpu_weights = [2, 1, 1]\n')

    def placed(count: int, *args: str) -> list[int]:
        ids = home.json("submit", "--gpu-mem", "1G", *args, "--array", f"1-{count}", "--", "true")["ids"]
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
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: example-gpusched-policy\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gpusched.policies]\nlast-first = example_gpusched_policy:last_first\n"
        "twice = example_gpusched_policy:twice\nbroken = example_gpusched_policy:broken\n")


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
        "weighted-round-robin, order, last-first, twice, broken\n")

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
    assert ("scheduling.policy: unknown policy 'fastest'; choose one of: pack, spread, "
            "round-robin, weighted-round-robin, order, last-first, twice, broken") in proc.stderr


# -- outside processes ----------------------------------------------------------------------
def test_outside_processes_block_unless_small_or_idle(make_home, tmp_path):
    home = make_home("2x80GiB")
    configure(home, '[gpus]\noutside = "block"\noutside_ignore_below = "1GiB"\n'
                    'outside_idle_after = "3s"\n', daemon='gpu_poll_interval = "0.2s"\n')
    # Declared before the daemon starts: it reads the GPUs before it places a job.
    declare_outside(home, {"gpu": 0, "pid": 4242, "user": "alice", "memory": "5GiB", "util": 40})
    # Best fit would choose GPU 0, the fuller one; "block" keeps every job off it.
    anywhere = home.submit("--gpu-mem", "1G", "--", "true")
    assert wait_state(home, anywhere, "succeeded")["gpu_indices"] == [1]
    pinned = home.submit("--gpu-mem", "1G", "--gpu-ids", "0", "--", "true")
    assert wait_reason(home, pinned, "GPU 0")["pending_reason"] == (
        "GPU 0 is in use by pid 4242 (alice)")
    # Under outside_ignore_below the process no longer counts.
    declare_outside(home, {"gpu": 0, "pid": 4242, "user": "alice", "memory": "512MiB", "util": 40})
    assert wait_state(home, pinned, "succeeded")["gpu_indices"] == [0]

    # A big process idle (0% busy) for outside_idle_after is ignored too, not before.
    written = declare_outside(home, {"gpu": 0, "pid": 4343, "user": "bob", "memory": "20GiB",
                                     "util": 0})
    wait_until(lambda: outside_seen(home, 0) == {4343}, "the daemon to see the idle process")
    idle = home.submit("--gpu-mem", "1G", "--gpu-ids", "0", "--", "true")
    job = wait_state(home, idle, "succeeded")
    assert job["gpu_indices"] == [0] and job["started_at"] >= written + 3.0
