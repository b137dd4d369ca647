"""The README's promise in one test: submit onto a simulated GPU, run, keep the exit status."""


def test_submit_runs_job_and_keeps_exit_status(home):
    job_id = home.submit("--gpus", "1", "--", "sh", "-c", "echo hello; exit 3")
    job = home.wait_state(job_id, "failed")
    assert job["exit_code"] == 3
    assert len(job["gpus"]) == 1 and job["gpus"][0].startswith("GPU-")
    assert home.run("logs", str(job_id)).stdout == "hello\n"
