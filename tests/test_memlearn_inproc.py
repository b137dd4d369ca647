"""GPU memory that learns, the daemon's decisions in process (tests/inproc.py): CUDA
out-of-memory ends and their retries with more, --gpu-mem auto from history, idle GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.core.errors import UsageError
from gpusched.core.sched import gpuoom, memestimate

GIB = 2**30
TORCH_OOM = (
    "Traceback (most recent call last):\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
)


def _run_and_fail(box, job_id: int, log_text: str, code: int = 1) -> dict:
    """The job runs, writes log_text to its stderr and exits with code."""
    box.step()
    Path(box.show(job_id)["stderr_path"]).write_text(log_text)
    return box.exit(job_id, code)


# -- CUDA out of memory ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, framework",
    [
        (TORCH_OOM, "torch"),
        ("RuntimeError: CUDA out of memory.\n", "torch"),
        (
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
            "tensor with shape[1024]\n",
            "TensorFlow",
        ),
        (
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying "
            "to allocate 123 bytes.\n",
            "JAX",
        ),
    ],
)
def test_a_failed_run_with_a_frameworks_oom_message_ends_gpu_oom(box, text, framework):
    job_id = box.submit("--gpu-mem", "10G", "--", "python", "train.py")
    job = _run_and_fail(box, job_id, "step 1\n" + text)
    assert job["state"] == "gpu_oom"
    assert framework in job["end_reason"] and "CUDA out of memory" in job["end_reason"]


def test_a_run_that_printed_oom_but_succeeded_is_succeeded(box):
    job_id = box.submit("--gpu-mem", "10G", "--", "python", "train.py")
    assert _run_and_fail(box, job_id, TORCH_OOM, code=0)["state"] == "succeeded"


def test_a_failure_without_an_oom_message_stays_failed(box):
    job_id = box.submit("--gpu-mem", "10G", "--", "python", "train.py")
    assert _run_and_fail(box, job_id, "ValueError: nope\n")["state"] == "failed"


def test_a_cpu_job_printing_cuda_oom_is_failed_not_gpu_oom(box):
    job_id = box.submit("--", "python", "train.py")
    assert _run_and_fail(box, job_id, TORCH_OOM)["state"] == "failed"


def test_report_oom_mark_ends_gpu_oom(box):
    job_id = box.submit("--gpus", "1", "--", "python", "train.py")
    job = _run_and_fail(box, job_id, gpuoom.REPORT_MARK.decode() + " my allocator\n")
    assert job["state"] == "gpu_oom" and "report_oom" in job["end_reason"]


def test_only_the_logs_tail_is_read(box):
    """An OOM message long before the end (a recovered one) does not count."""
    job_id = box.submit("--gpu-mem", "10G", "--", "python", "train.py")
    text = TORCH_OOM + "x" * (gpuoom.TAIL_BYTES + 10) + "\nValueError\n"
    assert _run_and_fail(box, job_id, text)["state"] == "failed"


def test_retry_on_gpu_oom_raises_gpu_mem_by_the_growth(box):
    job_id = box.submit(
        "--gpu-mem",
        "20G",
        "--retries",
        "2",
        "--retry-on",
        "gpu_oom",
        "--retry-delay",
        "60",
        "--",
        "python",
        "train.py",
    )
    job = _run_and_fail(box, job_id, TORCH_OOM)
    assert (job["state"], job["attempt"], job["gpu_mem_bytes"]) == ("pending", 2, 25 * GIB)
    assert job["gpu_mem_reason"] == (
        "raised from 20.0 GiB to 25.0 GiB (x1.25) after attempt 1 ran out of GPU memory"
    )
    assert "ran out of GPU memory" in job["pending_reason"]
    box.step(60)
    assert job_id in box.running()
    launched = box.shims.launched[job_id]["env"]
    assert launched["GPUSCHED_GPU_MEM"] == str(25 * GIB)
    # The raise is stored: a restarted daemon keeps it.
    box.restart()
    assert box.show(job_id)["gpu_mem_bytes"] == 25 * GIB


def test_mem_growth_and_the_largest_gpu_cap(make_box):
    box = make_box("2x40GiB")
    job_id = box.submit(
        "--gpu-mem",
        "16G",
        "--mem-growth",
        "2",
        "--retries",
        "3",
        "--retry-on",
        "gpu_oom",
        "--retry-delay",
        "0",
        "--",
        "python",
        "t.py",
    )
    job = _run_and_fail(box, job_id, TORCH_OOM)
    assert job["gpu_mem_bytes"] == 32 * GIB and "(x2)" in job["gpu_mem_reason"]
    # 64 GiB is more than a 40 GiB GPU can give: the next attempt gets a whole GPU.
    job = _run_and_fail(box, job_id, TORCH_OOM)
    assert (job["attempt"], job["gpu_mem_bytes"]) == (3, None)
    assert "to a whole GPU (the largest GPU's memory)" in job["gpu_mem_reason"]
    # Whole GPUs already: another OOM is final, and says why it is not retried.
    job = _run_and_fail(box, job_id, TORCH_OOM)
    assert (job["state"], job["attempt"]) == ("gpu_oom", 3)
    assert "not retried: it already had whole GPUs" in job["end_reason"]


def test_without_retry_on_gpu_oom_the_end_is_final(box):
    job_id = box.submit("--gpu-mem", "20G", "--retries", "2", "--", "python", "t.py")
    job = _run_and_fail(box, job_id, TORCH_OOM)
    assert (job["state"], job["gpu_mem_bytes"]) == ("gpu_oom", 20 * GIB)


def test_bad_mem_growth_is_one_clear_error(box):
    with pytest.raises(UsageError, match="--mem-growth wants a factor from 1 to 16"):
        box.submit("--gpu-mem", "2G", "--mem-growth", "0.5", "--", "true")


# -- estimates from history -------------------------------------------------------------------
def _succeed_with_peak(box, name: str, peak: str) -> int:
    job_id = box.submit(
        "--name",
        name,
        "--gpu-mem",
        "70G",
        "--env",
        f"GPUSCHED_SIM_MEM_USED={peak}",
        "--",
        "python",
        "train.py",
    )
    box.step()
    box.step(box.daemon.settings.gpu_poll_interval_s)  # a GPU reading records its peak
    assert box.exit(job_id, 0)["state"] == "succeeded"
    return job_id


def test_gpu_mem_auto_without_history_is_a_whole_gpu(box):
    job_id = box.submit("--name", "fresh", "--gpu-mem", "auto", "--", "python", "train.py")
    job = box.show(job_id)
    assert (job["gpus_requested"], job["gpu_mem_bytes"]) == (1, None)
    assert job["gpu_mem_reason"] == (
        "no earlier successful run of this job recorded a GPU peak: a whole GPU"
    )


def test_gpu_mem_auto_is_the_p95_of_peaks_plus_margin(box):
    for peak in ("10G", "12G", "20G"):
        _succeed_with_peak(box, "train", peak)
    job_id = box.submit("--name", "train", "--gpu-mem", "auto", "--", "python", "train.py")
    job = box.show(job_id)
    # p95 of three runs is the largest: 20 GiB, + 10% = 22 GiB, rounded up to 256 MiB.
    assert job["gpu_mem_bytes"] == gpuoom.round_up(22 * GIB)
    assert job["gpu_mem_reason"].startswith("estimated from 3 runs: 22.0 GiB")
    history = box.call("history", key="train")
    assert [r["gpu_mem_peak_bytes"] for r in history["runs"]] == [20 * GIB, 12 * GIB, 10 * GIB]


def test_an_estimate_reads_only_successful_runs_of_the_same_user_and_key(box):
    _succeed_with_peak(box, "train", "10G")
    failed = box.submit(
        "--name",
        "train",
        "--gpu-mem",
        "70G",
        "--env",
        "GPUSCHED_SIM_MEM_USED=60G",
        "--",
        "python",
        "train.py",
    )
    box.step()
    box.step(box.daemon.settings.gpu_poll_interval_s)
    box.exit(failed, 1)
    _succeed_with_peak(box, "other", "50G")
    other_user = (1, 4242, 4242)
    assert box.call("history", creds=other_user, key="train")["runs"] == []
    job_id = box.submit("--name", "train", "--gpu-mem", "auto", "--", "true")
    assert box.show(job_id)["gpu_mem_bytes"] == 11 * GIB


def test_an_unnamed_job_is_keyed_by_its_normalized_command(box):
    job_id = box.submit("--gpus", "1", "--", "/usr/bin/python", "a.py", "--lr", "0.1")
    assert box.show(job_id)["job_key"] == "python a.py --lr 0.1"
    assert memestimate.job_key("", ["python", "a.py  x"]) == "python a.py x"


def test_an_estimate_as_large_as_the_gpu_is_a_whole_gpu(make_box):
    box = make_box("1x40GiB")
    _succeed_with_peak_small = box.submit(
        "--name", "big", "--gpu-mem", "39G", "--env", "GPUSCHED_SIM_MEM_USED=39G", "--", "true"
    )
    box.step()
    box.step(box.daemon.settings.gpu_poll_interval_s)
    box.exit(_succeed_with_peak_small, 0)
    job = box.show(box.submit("--name", "big", "--gpu-mem", "auto", "--", "true"))
    assert job["gpu_mem_bytes"] is None and "as large as a whole GPU" in job["gpu_mem_reason"]


# -- idle GPUs ----------------------------------------------------------------------------
IDLE = '[idle]\nafter = "10m"\n'


def _idle_job(box, *options: str) -> int:
    job_id = box.submit(
        "--gpus", "1", "--env", "GPUSCHED_SIM_UTIL_PCT=0", *options, "--", "python", "nb.py"
    )
    box.step()
    assert job_id in box.running()
    return job_id


def _poll(box, minutes: int) -> None:
    """Minutes pass, the GPUs read each minute."""
    for _ in range(minutes):
        box.step(60)


def test_idle_gpus_are_flagged_after_idle_after_and_warned(make_box):
    box = make_box(config=IDLE)
    idle = _idle_job(box)
    busy = box.submit("--gpus", "1", "--", "python", "train.py")
    box.step()
    _poll(box, 5)
    assert box.show(idle)["gpu_idle_since"] is None
    _poll(box, 6)
    job = box.show(idle)
    assert job["gpu_idle_since"] is not None and job["state"] == "running"
    assert box.show(busy)["gpu_idle_since"] is None
    notes = [line for path, line in box.shims.notes if path == job["stderr_path"]]
    assert len(notes) == 1 and "0% busy for 10m00s ([idle] after = 10m00s)" in notes[0]
    _poll(box, 5)
    assert len([1 for path, _ in box.shims.notes if path == job["stderr_path"]]) == 1


def test_idle_is_off_by_default(box):
    job_id = _idle_job(box)
    _poll(box, 100)
    assert box.show(job_id)["gpu_idle_since"] is None and not box.shims.notes


def test_idle_cancel_applies_to_all_jobs_when_the_admin_says_so(make_box):
    box = make_box(config=IDLE + 'action = "cancel"\nall_jobs = true\n')
    job_id = _idle_job(box)
    notebook = _idle_job(box, "--interactive")
    _poll(box, 11)
    assert (job_id, 15) in box.shims.signals
    assert not [s for s in box.shims.signals if s[0] == notebook]
    job = box.exit(job_id, None, 15)
    assert job["state"] == "cancelled" and "idle GPUs" in job["end_reason"]
    assert box.show(notebook)["state"] == "running" and box.show(notebook)["interactive"]


def test_idle_cancel_leaves_jobs_that_are_not_preemptible_only_warned(make_box):
    box = make_box(config=IDLE + 'action = "cancel"\n')
    job_id = _idle_job(box)
    _poll(box, 11)
    assert not box.shims.signals and box.show(job_id)["state"] == "running"
    assert len(box.shims.notes) == 1


def test_idle_requeue_stops_a_preemptible_job_and_queues_it_again(make_box):
    box = make_box(config=IDLE + 'action = "requeue"\n')
    job_id = _idle_job(box, "--preemptible", "--preempt-grace", "30s")
    other = _idle_job(box)  # not preemptible: only warned
    _poll(box, 11)
    assert (job_id, 10) in box.shims.signals  # the checkpoint signal (SIGUSR1) first
    assert not [s for s in box.shims.signals if s[0] == other]
    assert box.show(job_id)["preempting"]
    job = box.exit(job_id, 0)  # it checkpointed and exited
    assert (job["restarts"], job["attempt"]) == (1, 2) and job["state"] in ("pending", "running")
    assert "requeued for idle GPUs" in box.show(job_id)["requeue_reason"]


def test_a_log_replaced_by_a_fifo_or_a_link_is_not_read(box, tmp_path):
    """The daemon (root, in system mode) reads the tail of a user's log: a FIFO put in
    its place must not block it, a link must not be followed."""
    import os

    fifo_job = box.submit("--gpu-mem", "10G", "--", "python", "train.py")
    link_job = box.submit("--gpu-mem", "10G", "--", "python", "train.py")
    box.step()
    fifo = Path(box.show(fifo_job)["stderr_path"])
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    target = tmp_path / "elsewhere.txt"
    target.write_text(TORCH_OOM)
    link = Path(box.show(link_job)["stderr_path"])
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    assert box.exit(fifo_job, 1)["state"] == "failed"
    assert box.exit(link_job, 1)["state"] == "failed"
