"""The job environment contract, exactly: what the submitter had, plus the scheduler's variables."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Home, wait_until
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths
from gpusched.core.models import GpuInfo, Job, Request
from gpusched.proc import jobenv

GiB = 2**30
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Every variable the scheduler owns: a submitter's copy never reaches the job.
SCHEDULER_KEYS = {
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "GPUSCHED_JOB_ID",
    "GPUSCHED_NUM_GPUS",
    "GPUSCHED_GPU_MEM",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_MASTER_PORT",
    # added by later features (retries, host resources, arrays, time limits,
    # progress reports)
    "GPUSCHED_ATTEMPT",
    "GPUSCHED_CPUS",
    "GPUSCHED_MEM",
    "GPUSCHED_ARRAY_ID",
    "GPUSCHED_ARRAY_INDEX",
    "GPUSCHED_TIME_LIMIT_END",
    "GPUSCHED_WARN_SIGNAL",
    "GPUSCHED_PROGRESS_FILE",
    "GPUSCHED_RUN_TOKEN",
    "GPUSCHED_RESTARTS",
    "GPUSCHED_ARRAY_COUNT",
    "GPUSCHED_ARRAY_MIN",
    "GPUSCHED_ARRAY_MAX",
    "GPUSCHED_ARRAY_STEP",
    "GPUSCHED_JOB_GPUS",
}


def submitter_env(home: Home, **extra: str) -> dict[str, str]:
    """Exactly the environment the submitting process has: nothing inherited by accident."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home.path),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO),
        "GPUSCHED_HOME": str(home.path),
        "GPUSCHED_SIMULATE": home.env["GPUSCHED_SIMULATE"],
        "ODD_VALUE": "spaces, = signs,\ttabs\nand a newline ✓",
        "EMPTY": "",
    }
    env.update(extra)
    return env


def submit(home: Home, env: dict[str, str], *args: str, cwd: Path | None = None) -> int:
    proc = subprocess.run(
        [sys.executable, "-m", "gpusched", "submit", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or home.path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["id"]


def finished(home: Home, job_id: int) -> dict:
    client = Client(resolve_paths(home.env), autostart=False)

    def show():
        return client.call("show", ids=[job_id])["jobs"][0]

    job = wait_until(
        lambda: (j := show())["state"] not in ("pending", "running") and j, f"job {job_id} to end"
    )
    assert job["state"] == "succeeded", job
    return job


def job_environment(job: dict) -> dict[str, str]:
    """What `env -0` printed as the job: the environment the kernel gave it."""
    raw = Path(job["stdout_path"]).read_bytes()
    assert raw.endswith(b"\0")
    return dict(item.decode().split("=", 1) for item in raw[:-1].split(b"\0"))


def run_env_job(home: Home, env: dict[str, str], *args: str) -> tuple[dict, dict[str, str]]:
    job = finished(home, submit(home, env, *args, "--", "env", "-0"))
    return job, job_environment(job)


def expected(
    submitted: dict[str, str], job: dict, ids: list[str], mem: int | None, gpu_total: int = 80 * GiB
) -> dict:
    """The submitter's environment, less stale scheduler variables, plus the scheduler's."""
    out = {k: v for k, v in submitted.items() if k not in SCHEDULER_KEYS}
    out.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(ids),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "NVIDIA_VISIBLE_DEVICES": ",".join(ids) if ids else "none",
            "GPUSCHED_JOB_ID": str(job["id"]),
            "GPUSCHED_NUM_GPUS": str(len(ids)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(job["master_port"]),
            "PET_MASTER_PORT": str(job["master_port"]),  # torchrun's name for it
            # Names this attempt; finds the job's processes if its shim dies.
            "GPUSCHED_RUN_TOKEN": f"{job['id']}.{job['attempt']}.{job['started_at']!r}",
        }
    )
    if mem is not None:
        out["GPUSCHED_GPU_MEM"] = str(mem)
    if mem is not None and ids:  # it shares its GPUs: the frameworks' caps, unless set
        out.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{mem * 1000 // gpu_total / 1000:.3f}")
        out.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        out.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    if job["gpu_indices"]:
        out["GPUSCHED_JOB_GPUS"] = ",".join(map(str, job["gpu_indices"]))
    # Later features, for a job that asks for none of them: first attempt, one CPU, math
    # libraries told so unless the submitter said otherwise, and where to report progress.
    out.update(
        {
            "GPUSCHED_ATTEMPT": "1",
            "GPUSCHED_RESTARTS": "0",
            "GPUSCHED_CPUS": "1",
            "GPUSCHED_PROGRESS_FILE": str(
                Path(job["stdout_path"]).parent / f"{job['id']}.progress.json"
            ),
        }
    )
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        out.setdefault(var, "1")
    return out


def test_the_readme_lists_exactly_the_variables_gpusched_sets():
    """README.md's "What a job sees" table is what job authors read; jobenv.VARIABLES is
    what the daemon sets and gpusched.job reads."""
    section = (REPO / "README.md").read_text(encoding="utf-8").split("\n## What a job sees\n")[1]
    section = section.split("\n## ")[0]
    first_cells = [row.split("|")[1] for row in section.splitlines() if row.startswith("| `")]
    listed = [name for cell in first_cells for name in re.findall(r"`([A-Z_]+)`", cell)]
    assert sorted(listed) == sorted(jobenv.VARIABLES)
    # The scheduler's own ones are those this file's end-to-end tests expect replaced.
    assert set(jobenv.SCHEDULER_VARS) == SCHEDULER_KEYS


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One daemon on 4 simulated GPUs for the tests that do not need their own config."""
    home = Home(tmp_path_factory.mktemp("jobenv") / "home")
    home.path.mkdir()
    # Set only in the daemon's environment: it must never reach a job.
    home.env["DAEMON_ONLY_SECRET"] = "leak"
    home.start()
    yield home
    home.cleanup()


@pytest.mark.e2e
def test_environment_is_exactly_the_submitters_plus_the_schedulers(shared):
    # As a job that submits jobs would have them: every one is replaced or dropped.
    stale = dict.fromkeys(SCHEDULER_KEYS, "stale")
    env = submitter_env(shared, **stale)
    job, seen = run_env_job(shared, env, "--gpus", "2", "--gpu-mem", "20G")
    assert len(job["gpus"]) == 2 and all(UUID_RE.match(u) for u in job["gpus"])
    assert seen == expected(env, job, job["gpus"], 20 * GiB)
    assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250"  # 20 GiB of 80
    assert "DAEMON_ONLY_SECRET" not in seen
    assert not {k for k, v in seen.items() if v == "stale"}
    # The job sees the GPUs it was given, in the order it was given them.
    assert seen["CUDA_VISIBLE_DEVICES"].split(",") == job["gpus"]


@pytest.mark.e2e
@pytest.mark.parametrize("parser", [[], ["-G0"]], ids=["fast-path", "typer"])
def test_under_env_i_the_job_gets_only_what_was_exported(shared, parser):
    """As cron runs it: `env -i PATH=/usr/bin:/bin HOME=$HOME gpusched submit --wait ...`,
    through the console script. Without a locale Python adds LC_CTYPE=C.UTF-8 to its own
    environment as it starts (PEP 538): the job must not see it, nor anything else."""
    env = shared.user_env()
    assert not {k for k in env if k.startswith(("LC_", "LANG"))}
    proc = shared.script("submit", *parser, "--wait", "--", "env", "-0", env=env)
    job = finished(shared, int(proc.stdout))
    assert job_environment(job) == expected(env, job, [], None)


@pytest.mark.e2e
def test_whole_gpu_job_gets_no_gpu_mem_even_if_the_submitter_had_one(shared):
    env = submitter_env(shared, GPUSCHED_GPU_MEM="123", CUDA_VISIBLE_DEVICES="0,1")
    job, seen = run_env_job(shared, env, "--gpus", "1")
    assert seen == expected(env, job, job["gpus"], None)
    assert "GPUSCHED_GPU_MEM" not in seen


@pytest.mark.e2e
def test_the_submitters_thread_counts_win(shared):
    env = submitter_env(shared, OMP_NUM_THREADS="8")
    job, seen = run_env_job(shared, env, "--gpus", "0")
    assert seen == expected(env, job, [], None)
    assert (seen["OMP_NUM_THREADS"], seen["MKL_NUM_THREADS"]) == ("8", "1")


@pytest.mark.e2e
def test_a_sharing_job_gets_the_frameworks_caps_unless_it_sets_them(shared):
    """JAX takes 75% of a GPU and TensorFlow all of it at their start: a job that asked for
    10 GiB of an 80 GiB GPU would take its neighbours' memory. Its own setting wins."""
    env = submitter_env(shared, TF_FORCE_GPU_ALLOW_GROWTH="false")
    job, seen = run_env_job(shared, env, "--gpus", "1", "--gpu-mem", "10G")
    assert seen == expected(env, job, job["gpus"], 10 * GiB)
    assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.125"
    assert seen["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert seen["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in seen  # memory.mps is off by default


def test_framework_caps_follow_the_smallest_gpu_and_round_down():
    small = GpuInfo(index=0, uuid="GPU-a", name="A", mem_total_bytes=24 * GiB)
    big = GpuInfo(index=1, uuid="GPU-b", name="B", mem_total_bytes=80 * GiB)
    caps = jobenv.framework_caps(10 * GiB, [big, small])
    assert caps == {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.416",  # 10/24 = 0.4166..., never above it
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    assert jobenv.framework_caps(100 * GiB, [small])["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "1.000"
    assert jobenv.framework_caps(1, [small])["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.001"
    # A GPU whose total is unknown gives no fraction rather than a wrong one.
    unknown = GpuInfo(index=2, uuid="GPU-c", name="C", mem_total_bytes=0)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in jobenv.framework_caps(GiB, [unknown])


def test_whole_gpu_and_cpu_jobs_get_no_framework_caps():
    gpu = GpuInfo(index=0, uuid="GPU-a", name="A", mem_total_bytes=80 * GiB)
    whole = Job(id=1, command=("x",), cwd="/", uid=0, user="u", request=Request(gpus=1))
    env = jobenv.job_environment(whole, [gpu], 29500, "uuid", 0.0, "t")
    assert not set(env) & set(jobenv.FRAMEWORK_VARS)
    cpu = Job(id=2, command=("x",), cwd="/", uid=0, user="u", request=Request(gpu_mem_bytes=GiB))
    env = jobenv.job_environment(cpu, [], 29500, "uuid", 0.0, "t")
    assert not set(env) & set(jobenv.FRAMEWORK_VARS)


@pytest.mark.e2e
def test_a_cpu_job_sees_no_gpu(shared):
    env = submitter_env(shared, CUDA_VISIBLE_DEVICES="2", NVIDIA_VISIBLE_DEVICES="all")
    job, seen = run_env_job(shared, env, "--gpus", "0")
    assert seen == expected(env, job, [], None)
    assert seen["CUDA_VISIBLE_DEVICES"] == "" and seen["GPUSCHED_NUM_GPUS"] == "0"


@pytest.mark.e2e
def test_env_options_override_the_submitters(shared):
    env = submitter_env(shared, FOO="outer", KEEP="kept")
    job, seen = run_env_job(
        shared, env, "--env", "FOO=inner", "--env", "NEW=a=b", "--env", "CUDA_VISIBLE_DEVICES=5"
    )
    want = expected({**env, "FOO": "inner", "NEW": "a=b"}, job, [], None)
    assert seen == want
    # The scheduler's variables win: a job cannot pick its own GPUs through --env.
    assert seen["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.e2e
def test_cwd_is_the_submitters_or_the_one_asked_for(shared, tmp_path):
    here, there = tmp_path / "here", tmp_path / "there dir"
    here.mkdir()
    there.mkdir()
    env = submitter_env(shared)
    default = finished(shared, submit(shared, env, "--", "pwd", cwd=here))
    assert Path(default["stdout_path"]).read_text() == f"{here.resolve()}\n"
    assert default["cwd"] == str(here.resolve())
    chosen = finished(shared, submit(shared, env, "--cwd", str(there), "--", "pwd", cwd=here))
    assert Path(chosen["stdout_path"]).read_text() == f"{there.resolve()}\n"
    relative = finished(shared, submit(shared, env, "--cwd", "../there dir", "--", "pwd", cwd=here))
    assert relative["cwd"] == str(there.resolve())


@pytest.mark.e2e
def test_concurrent_jobs_get_distinct_master_ports(shared, tmp_path):
    go = tmp_path / "go"
    env = submitter_env(shared)
    script = f"echo $MASTER_PORT; while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done"
    ids = [submit(shared, env, "--gpus", "1", "--", "sh", "-c", script) for _ in range(2)]
    client = Client(resolve_paths(shared.env), autostart=False)
    jobs = wait_until(
        lambda: (
            (js := client.call("show", ids=ids)["jobs"])
            and all(
                j["state"] == "running"
                and Path(j["stdout_path"]).exists()
                and Path(j["stdout_path"]).read_text().endswith("\n")
                for j in js
            )
            and js
        ),
        "both jobs to run and print their port",
    )
    ports = [int(Path(j["stdout_path"]).read_text()) for j in jobs]
    assert ports == [j["master_port"] for j in jobs]
    assert ports[0] != ports[1]
    assert all(29500 <= p <= 29999 for p in ports)
    go.touch()
    for job_id in ids:
        finished(shared, job_id)


def test_index_mode_names_gpus_by_index(make_home):
    home = make_home("4x80GiB")
    home.write_config('[gpus]\nvisible_devices = "index"\n')
    env = submitter_env(home)
    job, seen = run_env_job(home, env, "--gpus", "2", "--gpu-mem", "1G")
    indices = [str(i) for i in job["gpu_indices"]]
    assert seen == expected(env, job, indices, GiB)
    assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(indices)
    assert all(i.isdigit() for i in seen["CUDA_VISIBLE_DEVICES"].split(","))


def test_config_env_defaults_reach_every_job_unless_the_job_sets_them(make_home):
    home = make_home("1x80GiB")
    home.write_config('[jobs]\nenv = { TF_FORCE_GPU_ALLOW_GROWTH = "true", MY_FLAG = "cfg" }\n')
    env = submitter_env(home, MY_FLAG="mine")
    job, seen = run_env_job(home, env, "--gpus", "0")
    assert seen == {**expected(env, job, [], None), "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert seen["MY_FLAG"] == "mine"
