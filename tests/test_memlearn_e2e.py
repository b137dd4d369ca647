"""GPU memory that learns, end to end: a real daemon, real jobs, simulated GPUs. CUDA
out-of-memory retried with more memory, --gpu-mem auto from `gpusched history`, and idle
GPUs flagged in ls/show/metrics and cancelled. The decisions in detail are in
test_memlearn_inproc.py."""

from __future__ import annotations

import json
import sys

from conftest import wait_until
from metrics_scrape import metrics_url, scrape

GIB = 2**30
# A training script that runs out of GPU memory below 10 GiB per GPU, as torch says it.
TRAIN = """\
import os, sys
mem = int(os.environ.get("GPUSCHED_GPU_MEM", "0"))
print("attempt", os.environ["GPUSCHED_ATTEMPT"], "with", mem, flush=True)
if mem < 10 * 2**30:
    sys.stderr.write("Traceback (most recent call last):\\n"
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n")
    sys.exit(1)
"""
FAST_POLL = '[daemon]\ngpu_poll_interval = "0.2s"\n'


def test_cuda_oom_is_retried_with_more_gpu_memory(home):
    (home.path / "train.py").write_text(TRAIN)
    proc = home.run(
        "submit",
        "--wait",
        "--gpu-mem",
        "8G",
        "--retries",
        "2",
        "--retry-on",
        "gpu_oom",
        "--retry-delay",
        "0",
        "--",
        "python3",
        "train.py",
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    job = home.json("ls", "--all")[0]
    job = home.show(job["id"])
    # 8 GiB x1.25 = 10 GiB: the second attempt fits.
    assert (job["state"], job["attempt"], job["gpu_mem_bytes"]) == ("succeeded", 2, 10 * GIB)
    shown = home.run("show", str(job["id"])).stdout
    assert (
        "gpu_mem_reason=raised from 8.0 GiB to 10.0 GiB (x1.25) after attempt 1 ran out "
        "of GPU memory"
    ) in shown
    assert "attempt 2 with 10737418240" in (home.path / job["stdout_path"]).read_text()


def test_without_a_retry_the_job_ends_gpu_oom_and_wait_says_so(home):
    (home.path / "train.py").write_text(TRAIN)
    proc = home.run("submit", "--wait", "--gpu-mem", "4G", "--", "python3", "train.py", check=False)
    assert proc.returncode == 1  # the job's own exit status
    (job,) = home.json("ls", "--all")
    assert job["state"] == "gpu_oom" and "torch" in job["end_reason"]
    assert "gpu_oom" in home.run("ls", "--all").stdout
    assert home.json("ls", "--state", "gpu_oom")[0]["id"] == job["id"]
    assert [j["id"] for j in home.json("ls", "--state", "OOM")] == [job["id"]]  # as the docs say


def test_report_oom_from_the_job_api(home):
    code = "from gpusched.job import report_oom; report_oom('custom allocator')"
    job_id = home.submit("--gpus", "1", "--", sys.executable, "-c", code)
    job = home.wait_state(job_id, "gpu_oom", "failed", "succeeded")
    assert job["state"] == "gpu_oom" and "report_oom" in job["end_reason"]
    assert job["exit_code"] == 1


def test_gpu_mem_auto_learns_from_history(home):
    home.write_config(FAST_POLL)
    hold = "while [ ! -e go ]; do sleep 0.05; done"
    first = home.submit(
        "--name",
        "resnet",
        "--gpu-mem",
        "40G",
        "--env",
        "GPUSCHED_SIM_MEM_USED=12G",
        "--",
        "sh",
        "-c",
        hold,
    )
    wait_until(lambda: home.show(first)["gpu_mem_peak_bytes"], "a GPU memory peak recorded")
    (home.path / "go").touch()
    home.wait_state(first, "succeeded")
    listed = home.run("history", "resnet").stdout
    assert "12.0 GiB" in listed and "succeeded" in listed
    assert "--gpu-mem auto: estimated from 1 run: 13.2 GiB (p95 peak 12.0 GiB + 10%" in listed
    # Right-sizing: 40 GiB asked for, 12 GiB used.
    assert (
        "1 of 1 runs asked for over twice their GPU memory peak; peaks were 30% of asks" in listed
    )
    usage = home.run("usage").stdout.splitlines()
    assert usage[1].split()[-3:] == ["PEAK/ASK", "ASK>2X", "STATES"]
    assert usage[2].split()[-4:-2] == ["30%", "1/1"]
    report = home.json("history", "resnet")
    assert [r["gpu_mem_peak_bytes"] for r in report["runs"]] == [12 * GIB]
    job_id = home.submit("--name", "resnet", "--gpu-mem", "auto", "--", "true")
    job = home.wait_state(job_id, "succeeded")
    assert job["gpu_mem_bytes"] == 13 * GIB + GIB // 4  # 13.2 GiB rounded up to 256 MiB
    assert "gpu_mem_reason=estimated from 1 run: 13.2 GiB" in home.run("show", str(job_id)).stdout
    # Another job has no history: a whole GPU.
    fresh = home.submit("--gpu-mem", "auto", "--", "python3", "other.py")
    assert home.show(fresh)["gpu_mem_bytes"] is None
    assert home.show(fresh)["job_key"] == "python3 other.py"
    assert "no earlier successful run of this job" in home.show(fresh)["gpu_mem_reason"]


def test_idle_gpus_are_flagged_in_ls_show_and_metrics(home):
    home.write_config(FAST_POLL + '[idle]\nafter = "1s"\n[metrics]\nlisten = "127.0.0.1:0"\n')
    home.start()
    idle = home.submit("--gpus", "1", "--env", "GPUSCHED_SIM_UTIL_PCT=0", "--", "sleep", "600")
    busy = home.submit("--gpus", "1", "--", "sleep", "600")
    wait_until(lambda: home.show(idle)["gpu_idle_since"], "the idle job flagged")
    listing = {line.split()[0]: line for line in home.run("ls").stdout.splitlines()[1:]}
    assert "running (idle)" in listing[str(idle)] and "idle" not in listing[str(busy)]
    assert "idle=its GPUs have all been 0% busy for" in home.run("show", str(idle)).stdout
    assert home.show(busy)["gpu_idle_since"] is None
    metrics = scrape(metrics_url(home))
    assert metrics.value("gpusched_jobs_gpu_idle") == 1
    assert metrics.value("gpusched_job_gpu_idle_seconds", job_id=str(idle)) >= 1
    assert metrics.value("gpusched_job_gpu_idle_seconds", job_id=str(busy)) is None
    log = home.path / home.show(idle)["stderr_path"]
    wait_until(lambda: "0% busy" in log.read_text(), "a warning in the job's log")
    warning = next(line for line in log.read_text().splitlines() if "0% busy" in line)
    assert warning.startswith("gpusched: ") and "gpusched: gpusched:" not in warning
    assert home.show(idle)["state"] == "running"  # warn only: the default action


def test_idle_action_cancel_stops_idle_jobs_but_not_interactive_ones(home):
    home.write_config(FAST_POLL + '[idle]\nafter = "1s"\naction = "cancel"\nall_jobs = true\n')
    idle = home.submit("--gpus", "1", "--env", "GPUSCHED_SIM_UTIL_PCT=0", "--", "sleep", "600")
    notebook = home.submit(
        "--gpus", "1", "--interactive", "--env", "GPUSCHED_SIM_UTIL_PCT=0", "--", "sleep", "600"
    )
    job = home.wait_state(idle, "cancelled", "failed", "succeeded")
    assert job["state"] == "cancelled" and "idle GPUs" in job["end_reason"]
    # The notebook started after the idle job: on a loaded machine its own idle time may
    # not have passed yet when the first is cancelled.
    kept = wait_until(
        lambda: (j := home.show(notebook))["gpu_idle_since"] and j, "the notebook flagged idle"
    )
    assert kept["state"] == "running" and kept["interactive"] and not kept["cancelling"]
    assert json.loads(home.run("show", "--json", str(notebook)).stdout)["interactive"]


def test_idle_action_requeue_sends_a_preemptible_job_back_to_the_queue(home):
    home.write_config(FAST_POLL + '[idle]\nafter = "1s"\naction = "requeue"\n')
    job_id = home.submit(
        "--gpus",
        "1",
        "--preemptible",
        "--preempt-grace",
        "1s",
        "--env",
        "GPUSCHED_SIM_UTIL_PCT=0",
        "--",
        "sleep",
        "600",
    )
    job = wait_until(
        lambda: (j := home.show(job_id))["restarts"] >= 1 and j, "the idle job requeued"
    )
    assert "requeued for idle GPUs" in job["requeue_reason"]
    assert job["state"] in ("pending", "running", "preempted")
