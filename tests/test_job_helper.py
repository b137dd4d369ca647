"""gpusched.job: info, progress (down to `show --json` and `ls`), on_preempt, limit_torch_memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from conftest import REPO, wait_until
from gpusched import job

PY = sys.executable


def run_python(code: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """A child interpreter running `code` with the repository importable."""
    return subprocess.Popen(
        [PY, "-c", textwrap.dedent(code)],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        **kwargs,
    )


# -- import cost ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_import_pulls_in_no_torch_and_nothing_outside_the_standard_library():
    code = """
        import json, sys
        before = set(sys.modules)
        import gpusched.job
        new = {m.split(".")[0] for m in set(sys.modules) - before}
        print(json.dumps(sorted(new - set(sys.stdlib_module_names))))
    """
    proc = run_python(code)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert json.loads(out) == ["gpusched"]  # so certainly not torch


# -- info -------------------------------------------------------------------------------------


def test_info_reads_the_whole_gpusched_environment():
    got = job.info(
        {
            "GPUSCHED_JOB_ID": "17",
            "GPUSCHED_ARRAY_INDEX": "3",
            "GPUSCHED_ATTEMPT": "2",
            "GPUSCHED_NUM_GPUS": "2",
            "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
            "GPUSCHED_GPU_MEM": str(20 * 2**30),
            "GPUSCHED_TIME_LIMIT_END": "1000.5",
            "GPUSCHED_WARN_SIGNAL": "SIGUSR2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29501",
        }
    )
    assert (got.job_id, got.array_index, got.attempt, got.num_gpus) == (17, 3, 2, 2)
    assert got.gpu_ids == ("GPU-a", "GPU-b") and got.gpu_mem_bytes == 20 * 2**30
    assert got.time_left_s(now=990.0) == pytest.approx(10.5)
    assert got.time_left_s(now=2000.0) == 0.0  # past the limit: nothing left, never negative
    assert got.warn_signal == signal.SIGUSR2
    assert (got.master_addr, got.master_port, got.is_under_gpusched) == ("127.0.0.1", 29501, True)


def test_info_outside_gpusched_or_with_garbage_is_none_not_a_crash():
    assert job.info({}) == job.JobInfo(None, None, None, 0, (), None, None, None, None, None)
    got = job.info(
        {
            "GPUSCHED_JOB_ID": "x",
            "GPUSCHED_TIME_LIMIT_END": "nan",
            "GPUSCHED_ATTEMPT": "",
            "CUDA_VISIBLE_DEVICES": "",
            "GPUSCHED_WARN_SIGNAL": "SIGNOPE",
        }
    )
    assert (got.job_id, got.time_limit_end, got.attempt, got.gpu_ids) == (None, None, None, ())
    assert got.warn_signal is None
    assert job.info({"GPUSCHED_WARN_SIGNAL": "USR1"}).warn_signal == signal.SIGUSR1
    assert got.time_left_s() is None and not got.is_under_gpusched


# -- progress ---------------------------------------------------------------------------------


@pytest.fixture
def progress_file(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv(job.PROGRESS_FILE_VAR, str(path))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(job, "_progress", job._Progress())  # no rate-limit state from others
    return path


def test_progress_writes_a_small_json_file_and_rate_limits(progress_file):
    assert job.progress(0.25, "step 25") is True
    data = json.loads(progress_file.read_text())
    assert (data["fraction"], data["message"]) == (0.25, "step 25")
    assert abs(data["updated_at"] - time.time()) < 60
    assert job.progress(0.5, "step 50") is False  # within the interval: not written
    assert json.loads(progress_file.read_text())["fraction"] == 0.25
    assert job.progress(1.0, "done") is True  # the end always gets through
    assert job.progress(7, min_interval_s=0.0) is True
    assert json.loads(progress_file.read_text())["fraction"] == 1.0  # clamped
    assert not list(progress_file.parent.glob("*.tmp"))  # the temp file was renamed


def test_progress_is_cheap_enough_for_every_step(progress_file):
    calls, started_s = 20_000, time.perf_counter()
    writes = sum(job.progress(i / calls, f"step {i}") for i in range(calls))
    elapsed_s = time.perf_counter() - started_s
    # One write per second at most (plus the first): a write per call would be 20,000.
    assert writes <= 2 + elapsed_s / job.PROGRESS_MIN_INTERVAL_S
    assert elapsed_s / calls < 200e-6  # well under a training step


def test_progress_outside_gpusched_or_off_rank_0_does_nothing(progress_file, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert job.progress(0.5) is False and not progress_file.exists()
    monkeypatch.delenv(job.PROGRESS_FILE_VAR)
    monkeypatch.delenv("RANK")
    assert job.progress(0.5) is False
    with pytest.raises(ValueError, match="finite"):
        job.progress(float("nan"))


@pytest.mark.e2e
def test_the_last_rate_limited_report_is_written_at_exit(tmp_path):
    path = tmp_path / "progress.json"
    proc = run_python(
        """
        from gpusched import job
        job.progress(0.1, "first")
        job.progress(0.9, "last")  # rate-limited now, flushed by atexit
    """,
        env={job.PROGRESS_FILE_VAR: str(path)},
    )
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert json.loads(path.read_text())["message"] == "last"


def test_reader_accepts_a_good_file_and_refuses_what_a_job_could_plant(tmp_path):
    good = tmp_path / "good.json"
    job.write_progress_file(str(good), {"fraction": 0.5, "message": "m" * 999})
    report = job.read_progress_file(str(good), owner_uid=os.getuid())
    assert report["fraction"] == 0.5 and len(report["message"]) == job.MESSAGE_MAX_CHARS
    assert job.read_progress_file(str(good), owner_uid=os.getuid() + 1) is None
    link = tmp_path / "link.json"
    link.symlink_to(good)
    hard = tmp_path / "hard.json"
    os.link(good, hard)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading must not block the daemon
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"fraction": 0.5, "updated_at": 1.0, "message": "x" * 5000}))
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps({"fraction": "0.5", "updated_at": 1.0}))
    for bad in (link, hard, fifo, big, typed, tmp_path / "missing.json"):
        assert job.read_progress_file(str(bad)) is None, bad


# -- on_preempt -------------------------------------------------------------------------------

PREEMPT_SCRIPT = """
    import os, signal, sys, time
    from gpusched import job
    marker = sys.argv[1]

    def checkpoint(signum):
        with open(marker, "a") as fh:
            fh.write(f"checkpoint {signum}\\n")
        noted = False
        while os.path.exists(marker + ".hold"):  # lets a test signal us mid-checkpoint
            if job._preemption.exit_pending and not noted:  # SIGTERM arrived meanwhile
                noted = True
                with open(marker, "a") as fh:
                    fh.write("sigterm seen\\n")
            time.sleep(0.01)
        with open(marker, "a") as fh:
            fh.write("checkpoint done\\n")

    warning = None if sys.argv[2] == "from-env" else getattr(signal, sys.argv[2])
    job.on_preempt(checkpoint, warning_signal=warning, exit_on_sigterm=sys.argv[3] == "exit")
    try:
        print("ready", flush=True)  # inside the try: a signal may come at once
        while True:
            time.sleep(0.01)
            if job.preempt_requested() and sys.argv[3] != "exit":
                print(f"saw {job.preempt_requested()}", flush=True)
                sys.exit(3)
    finally:
        with open(marker, "a") as fh:
            fh.write("finally\\n")
"""


def start_preempt_script(
    tmp_path, warning="SIGUSR1", mode="exit", env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [PY, "-c", textwrap.dedent(PREEMPT_SCRIPT), str(marker), warning, mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    assert proc.stdout.readline() == "ready\n"
    return proc, marker


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.e2e
def test_sigterm_runs_the_callback_then_exits_143_through_finally(tmp_path):
    proc, marker = start_preempt_script(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert lines(marker) == ["checkpoint 15", "checkpoint done", "finally"]


@pytest.mark.e2e
def test_warning_signal_runs_the_callback_once_and_the_job_goes_on(tmp_path):
    # The signal of `submit --signal`, which gpusched passes on in GPUSCHED_WARN_SIGNAL.
    proc, marker = start_preempt_script(
        tmp_path, warning="from-env", env={"GPUSCHED_WARN_SIGNAL": "SIGUSR2"}
    )
    proc.send_signal(signal.SIGUSR2)
    wait_until(lambda: "checkpoint done" in lines(marker), "the callback")
    proc.send_signal(signal.SIGUSR2)
    assert proc.poll() is None  # still running: a warning is not an order to stop
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert lines(marker) == ["checkpoint 12", "checkpoint done", "finally"]  # ran once


@pytest.mark.e2e
def test_sigterm_during_the_checkpoint_lets_it_finish_first(tmp_path):
    proc, marker = start_preempt_script(tmp_path)
    Path(f"{marker}.hold").touch()
    proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: lines(marker) == ["checkpoint 10"], "the checkpoint to start")
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "sigterm seen" in lines(marker), "SIGTERM to arrive mid-checkpoint")
    assert proc.poll() is None  # it waits for the checkpoint rather than dying in it
    os.unlink(f"{marker}.hold")
    assert proc.wait(timeout=30) == 143
    assert lines(marker) == ["checkpoint 10", "sigterm seen", "checkpoint done", "finally"]


@pytest.mark.e2e
def test_without_exit_on_sigterm_the_loop_sees_the_flag(tmp_path):
    proc, marker = start_preempt_script(tmp_path, mode="poll")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 3
    assert proc.stdout.read() == "saw 15\n"
    assert lines(marker) == ["checkpoint 15", "checkpoint done", "finally"]


# -- limit_torch_memory -----------------------------------------------------------------------


def test_limit_torch_memory_without_declared_memory_is_a_no_op():
    result = job.limit_torch_memory({})
    assert not result.is_applied and "--gpu-mem" in result.reason


def test_limit_torch_memory_sets_the_fraction_of_each_visible_gpu(monkeypatch):
    calls = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 2,
        get_device_properties=lambda i: types.SimpleNamespace(total_memory=80 * 2**30),
        set_per_process_memory_fraction=lambda fraction, device: calls.append((fraction, device)),
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    result = job.limit_torch_memory({"GPUSCHED_GPU_MEM": str(20 * 2**30)})
    assert result.is_applied and result.fractions == (0.25, 0.25)
    assert calls == [(0.25, 0), (0.25, 1)]


def test_limit_torch_memory_on_the_cpu_says_why_it_did_nothing():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = job.limit_torch_memory({"GPUSCHED_GPU_MEM": str(2**30)})
    assert not result.is_applied and "CUDA is not available" in result.reason


# -- under a real daemon ----------------------------------------------------------------------

REPORTING_JOB = """
    import json, os, time
    from gpusched import job
    print(json.dumps(job.info().__dict__), flush=True)
    job.progress(0.42, "step 42 of 100")
    while not os.path.exists("release"):
        time.sleep(0.02)
"""


def test_progress_and_info_under_the_daemon(home):
    job_id = home.submit(
        "--gpus",
        "1",
        "--gpu-mem",
        "10G",
        "--env",
        f"{job.PROGRESS_FILE_VAR}=/tmp/not-this-one",
        "--",
        PY,
        "-c",
        textwrap.dedent(REPORTING_JOB),
    )
    shown = wait_until(lambda: (j := home.show(job_id))["progress"] and j, "a progress report")
    assert shown["progress"]["fraction"] == 0.42
    assert shown["progress"]["message"] == "step 42 of 100"
    listed = {j["id"]: j for j in home.json("ls")}
    assert listed[job_id]["progress"]["fraction"] == 0.42
    assert "42%" in home.run("ls").stdout
    assert "42% step 42 of 100" in home.run("show", str(job_id)).stdout
    info = json.loads(home.run("logs", str(job_id)).stdout.splitlines()[0])
    assert info["job_id"] == job_id and info["num_gpus"] == 1
    assert info["gpu_mem_bytes"] == 10 * 2**30 and len(info["gpu_ids"]) == 1
    (home.path / "release").touch()
    done = home.wait_state(job_id, "succeeded")
    assert done["progress"] is None  # only running jobs report progress


CHECKPOINTING_JOB = """
    import time
    from gpusched import job
    job.on_preempt(lambda signum: open("checkpointed", "w").write(str(signum)))
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
"""


def test_cancel_runs_the_preempt_callback_before_the_job_ends(home):
    job_id = home.submit("--", PY, "-c", textwrap.dedent(CHECKPOINTING_JOB))
    wait_until(lambda: home.run("logs", str(job_id)).stdout == "ready\n", "the job to be ready")
    home.run("cancel", str(job_id))
    ended = home.wait_state(job_id, "cancelled")
    assert (home.path / "checkpointed").read_text() == str(int(signal.SIGTERM))
    assert ended["exit_code"] == 143  # exited by itself after the callback, not killed
