"""NVIDIA MPS for jobs that share a GPU (memory.mps): the job's MPS settings, and gpusched's
own control daemon, here a stand-in program that records what it is told."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path

import pytest

from conftest import Home, wait_until
from gpusched.client.paths import resolve_paths
from gpusched.core.models import GpuInfo, Job, Request
from gpusched.proc import jobenv
from gpusched.proc.mps import MpsControl
from processes import is_gone

GiB = 2**30
MPS_KEYS = {
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
}
# As nvidia-cuda-mps-control: `-d` leaves a daemon running, its pid in the pipe directory;
# `quit` on stdin stops it. Each call appends one JSON line: argv, environment, stdin.
STAND_IN = """#!/bin/sh
stdin=""
[ "$1" = -d ] || stdin="$(cat)"
{python} -c 'import json, os, sys
print(json.dumps({{"argv": sys.argv[2:], "stdin": sys.argv[1], "env": dict(os.environ)}}))' \\
  "$stdin" "$@" >> {record}
pidfile="$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
if [ "$1" = -d ]; then
  (while :; do sleep 0.2; done) </dev/null >/dev/null 2>&1 &
  echo $! > "$pidfile"
elif [ "$stdin" = quit ]; then
  kill "$(cat "$pidfile")" && rm -f "$pidfile"
fi
"""


def gpu(index: int, total: int = 80 * GiB) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", name="A", mem_total_bytes=total)


def sharing_job(**env: str) -> Job:
    request = Request(gpus=2, gpu_mem_bytes=10 * GiB)
    return Job(id=1, command=("x",), cwd="/", uid=0, user="u", request=request, env=env)


def test_a_sharing_job_under_mps_gets_its_limit_on_each_gpu_as_it_numbers_them():
    stale = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=999999M", "CUDA_MPS_PIPE_DIRECTORY": "/x"}
    env = jobenv.job_environment(
        sharing_job(**stale), [gpu(3), gpu(1)], 29500, "uuid", 0.0, "t", mps=("/p", 100)
    )
    # Numbered 0.. as CUDA_VISIBLE_DEVICES lists them, whatever nvidia-smi's indices.
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M,1=10240M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/p"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # 100: no compute limit
    env = jobenv.job_environment(sharing_job(), [gpu(0)], 29500, "uuid", 0.0, "t", mps=("/p", 40))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"


def test_without_gpuscheds_mps_a_users_own_mps_settings_stand():
    own = {"CUDA_MPS_PIPE_DIRECTORY": "/mine", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G"}
    env = jobenv.job_environment(sharing_job(**own), [gpu(0)], 29500, "uuid", 0.0, "t")
    assert {k: env[k] for k in own} == own


def test_a_whole_gpu_job_is_never_an_mps_client():
    # A stale copy, from a sharing job that submitted it, would make it a client too.
    stale = {"CUDA_MPS_PIPE_DIRECTORY": "/p", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M"}
    whole = Job(id=1, command=("x",), cwd="/", uid=0, user="u", request=Request(gpus=1), env=stale)
    env = jobenv.job_environment(whole, [gpu(0)], 29500, "uuid", 0.0, "t", mps=("", 100))
    assert not set(env) & MPS_KEYS
    # Nor is a sharing job the daemon keeps out of MPS (in a container, or MPS unavailable).
    shared = sharing_job(**stale)
    env = jobenv.job_environment(shared, [gpu(0)], 29500, "uuid", 0.0, "t", mps=("", 100))
    assert not set(env) & MPS_KEYS


# -- the control daemon, against the stand-in ------------------------------------------------


def mps_home(make_home, program: str | None = None) -> tuple[Home, Path]:
    home = make_home("3x80GiB")  # a whole GPU is left, whatever sharing jobs take
    record = home.path / "mps-calls.jsonl"
    if program is None:
        stand_in = home.path / "nvidia-cuda-mps-control"
        stand_in.write_text(
            STAND_IN.format(record=shlex.quote(str(record)), python=shlex.quote(sys.executable))
        )
        stand_in.chmod(0o755)
        program = str(stand_in)
    home.write_config(f'[memory]\nmps = true\nmps_control = "{program}"\n')
    return home, record


def calls(record: Path) -> list[dict]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


READY = "GPUSCHED_TEST_READY=1\\0"  # after a waiting job's whole environment


def job_env(job: dict) -> dict[str, str]:
    raw = Path(job["stdout_path"]).read_bytes()
    env = dict(item.decode().split("=", 1) for item in raw.split(b"\0") if item)
    env.pop("GPUSCHED_TEST_READY", None)
    return env


def printed_env(job: dict) -> bool:
    """Whether a waiting job has printed its whole environment."""
    path = Path(job["stdout_path"])
    return path.exists() and b"GPUSCHED_TEST_READY=1\0" in path.read_bytes()


def control_pid(home: Home) -> int | None:
    pidfile = Path(resolve_paths(home.env).mps_pipe_dir) / "nvidia-cuda-mps-control.pid"
    return int(pidfile.read_text()) if pidfile.exists() else None


def status_of(home: Home) -> dict:
    return json.loads(home.run("daemon", "status", "--json").stdout)["mps"]


def waiting_job(home: Home, go: Path, *args: str) -> int:
    script = f"env -0; printf '{READY}'; while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done"
    return home.submit(*args, "--", "sh", "-c", script)


@pytest.mark.e2e
def test_sharing_jobs_run_under_one_control_daemon_that_quits_with_the_daemon(make_home):
    home, record = mps_home(make_home)
    paths = resolve_paths(home.env)
    go = home.path / "go"
    home.start()
    assert status_of(home)["state"] == "idle"
    shared = [waiting_job(home, go, "--gpus", "1", "--gpu-mem", "10G") for _ in range(2)]
    # A stale copy, as from a sharing job that submitted it, is dropped.
    whole = waiting_job(
        home, go, "--gpus", "1", "--env", f"CUDA_MPS_PIPE_DIRECTORY={paths.mps_pipe_dir}"
    )
    jobs = [home.wait_state(i, "running") for i in (*shared, whole)]
    wait_until(lambda: all(printed_env(j) for j in jobs), "the jobs' environments")
    started = calls(record)
    assert [c["argv"] for c in started] == [["-d"]]  # once, for the first sharing job
    assert started[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == paths.mps_pipe_dir
    assert started[0]["env"]["CUDA_MPS_LOG_DIRECTORY"] == paths.mps_log_dir
    assert "CUDA_VISIBLE_DEVICES" not in started[0]["env"]  # it serves every GPU
    for job in jobs[:2]:
        env = job_env(job)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == paths.mps_pipe_dir
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert not set(job_env(jobs[2])) & MPS_KEYS
    # gpus and daemon status say which GPUs are under MPS: those the sharing jobs are on.
    under = sorted({i for job in jobs[:2] for i in job["gpu_indices"]})
    status = status_of(home)
    assert (status["state"], status["gpus"], status["pid"]) == ("running", under, control_pid(home))
    rows = home.json("gpus")["gpus"]
    assert [row["index"] for row in rows if row["mps"]] == under
    assert "GPUs under MPS: " + ", ".join(map(str, under)) in home.run("daemon", "status").stdout
    assert "(MPS)" in home.run("gpus").stdout
    go.touch()
    for job_id in (*shared, whole):
        home.wait_state(job_id, "succeeded")
    pid = control_pid(home)
    home.run("daemon", "stop")
    assert [c["stdin"] for c in calls(record)] == ["", "quit"]
    assert calls(record)[1]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == paths.mps_pipe_dir
    assert pid is not None and wait_until(lambda: is_gone(pid), "the control daemon to quit")


@pytest.mark.e2e
def test_a_restarted_daemon_uses_the_running_control_daemon_again(make_home):
    home, record = mps_home(make_home)
    go = home.path / "go"
    home.start()
    first = waiting_job(home, go, "--gpus", "1", "--gpu-mem", "10G")
    home.wait_state(first, "running")
    wait_until(lambda: control_pid(home), "the control daemon to start")
    pid = control_pid(home)
    try:
        # Its client still runs: the control daemon stays for the next daemon.
        home.run("daemon", "stop")
        assert [c["argv"] for c in calls(record)] == [["-d"]]
        assert pid is not None and not is_gone(pid)
        home.start()
        status = status_of(home)
        assert (status["state"], status["pid"], status["reused"]) == ("running", pid, True)
        second = waiting_job(home, go, "--gpus", "1", "--gpu-mem", "10G")
        job = home.wait_state(second, "running")
        wait_until(lambda: printed_env(job), "its environment")
        assert job_env(job)["CUDA_MPS_PIPE_DIRECTORY"] == resolve_paths(home.env).mps_pipe_dir
        assert [c["argv"] for c in calls(record)] == [["-d"]]  # never a second start
        go.touch()
        for job_id in (first, second):
            home.wait_state(job_id, "succeeded")
        home.run("daemon", "stop")
        assert [c["stdin"] for c in calls(record)] == ["", "quit"]
    finally:
        if pid and not is_gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.e2e
def test_without_the_control_program_it_says_so_once_and_jobs_run_without_mps(make_home):
    home, _ = mps_home(make_home, program="no-such-mps-control")
    home.start()
    ids = [home.submit("--gpus", "1", "--gpu-mem", "10G", "--", "env", "-0") for _ in range(2)]
    for job_id in ids:
        job = home.wait_state(job_id, "succeeded")
        assert not set(job_env(job)) & MPS_KEYS
        assert job_env(job)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.125"  # still capped
    status = status_of(home)
    assert status["state"] == "unavailable"
    assert "'no-such-mps-control' is not found" in status["problem"]
    assert "MPS: unavailable (the MPS control program" in home.run("daemon", "status").stdout
    log = Path(resolve_paths(home.env).daemon_log).read_text()
    assert log.count("MPS unavailable") == 1
    assert not any(row["mps"] for row in home.json("gpus")["gpus"])


def test_a_pid_file_naming_another_program_is_not_taken_for_the_control_daemon(tmp_path):
    """After a reboot the pid in the file may be any process's: this test's own here."""
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")
    control = MpsControl("nvidia-cuda-mps-control", str(pipe), str(tmp_path / "log"), True)
    control.adopt()
    assert (control.state, control.pid, control.reused) == ("idle", None, False)


def test_in_system_mode_mps_is_refused_and_says_why(tmp_path):
    control = MpsControl(
        "nvidia-cuda-mps-control", str(tmp_path), str(tmp_path), True, refused="not here"
    )
    assert control.pipe_for_job() == ""
    assert control.to_dict()["state"] == "unavailable"
    assert control.to_dict()["problem"] == "not here"
    off = MpsControl("nvidia-cuda-mps-control", str(tmp_path), str(tmp_path), False, "not here")
    assert (off.state, off.problem) == ("off", "")


@pytest.mark.e2e
def test_a_control_daemon_left_running_quits_after_mps_is_turned_off(make_home):
    home, record = mps_home(make_home)
    go = home.path / "go"
    home.start()
    job_id = waiting_job(home, go, "--gpus", "1", "--gpu-mem", "10G")
    home.wait_state(job_id, "running")
    wait_until(lambda: control_pid(home), "the control daemon to start")
    pid = control_pid(home)
    try:
        home.run("daemon", "stop")  # its client still runs
        stand_in = home.path / "nvidia-cuda-mps-control"
        home.write_config(f'[memory]\nmps = false\nmps_control = "{stand_in}"\n')
        home.start()
        assert status_of(home)["state"] == "off"
        go.touch()
        home.wait_state(job_id, "succeeded")
        home.run("daemon", "stop")
        assert [c["stdin"] for c in calls(record)] == ["", "quit"]
        assert pid is not None and wait_until(lambda: is_gone(pid), "the control daemon to quit")
    finally:
        if pid and not is_gone(pid):
            os.kill(pid, signal.SIGKILL)
