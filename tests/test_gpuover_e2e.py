"""GPU memory promises kept, end to end: a real daemon, real jobs, simulated GPUs whose
memory use each job declares (GPUSCHED_SIM_MEM_USED). The decisions in detail are in
test_gpuover.py."""

from __future__ import annotations

from conftest import wait_until

FAST_POLL = '[daemon]\ngpu_poll_interval = "0.2s"\n'
# A job that checkpoints on SIGUSR1 and runs on until SIGTERM ends it.
CHECKPOINTS = "trap 'echo checkpoint >&2' USR1; while :; do sleep 0.05; done"


def _over_and_neighbour(home, *extra: str) -> tuple[int, int]:
    """B asks for 60 GiB and uses 45; A, placed beside it (the best fit), asks for 10 GiB
    and uses 30. B first: placement counts what a job is seen to use, so A first would
    leave B too little room on A's GPU."""
    b = home.submit("--gpu-mem", "60G", "--env", "GPUSCHED_SIM_MEM_USED=45G", "--", "sleep", "600")
    a = home.submit(
        "--gpu-mem",
        "10G",
        "--preempt-grace",
        "1s",
        *extra,
        "--env",
        "GPUSCHED_SIM_MEM_USED=30G",
        "--",
        "sh",
        "-c",
        CHECKPOINTS,
    )
    return a, b


def test_stop_is_seen_in_ls_show_and_wait(home):
    home.write_config(FAST_POLL + '[memory]\ngpu_over = "stop"\n')
    a, b = _over_and_neighbour(home)
    waited = home.run("wait", str(a), check=False)
    assert waited.returncode == 143  # 128 + SIGTERM, as the README's table says
    job = home.show(a)
    gpu = job["gpu_indices"][0]
    assert job["state"] == "gpu_oom"
    assert job["end_reason"] == (
        f"stopped: used 30.0 GiB of GPU {gpu}, asked for 10.0 GiB (gpu_over = stop) (SIGTERM)"
    )
    assert home.show(b)["gpu_indices"] == [gpu] and home.show(b)["state"] == "running"
    listing = {line.split()[0]: line for line in home.run("ls", "--all").stdout.splitlines()[1:]}
    assert "gpu_oom" in listing[str(a)] and "running" in listing[str(b)]
    assert f"end_reason=stopped: used 30.0 GiB of GPU {gpu}" in home.run("show", str(a)).stdout
    log = (home.path / job["stderr_path"]).read_text()
    assert "checkpoint" in log and "(gpu_over = stop)" in log


def test_report_is_seen_in_ls_and_show_and_the_job_runs_on(home):
    home.write_config(FAST_POLL)  # gpu_over = "report", the default
    a, b = _over_and_neighbour(home)
    wait_until(lambda: home.show(a)["gpu_mem_over_by"], "job A reported over its --gpu-mem")
    listing = {line.split()[0]: line for line in home.run("ls").stdout.splitlines()[1:]}
    assert "running (over GPU mem)" in listing[str(a)] and "over" not in listing[str(b)]
    assert "gpu_mem_over_by=used 30.0 GiB of GPU" in home.run("show", str(a)).stdout
    assert home.show(a)["state"] == "running"
