"""--time's no-limit spellings, errors that name the option typed (never a request key), and
refused operations on finished jobs exiting 1, as scontrol's do."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("spelling", ["0", "UNLIMITED", "infinite", "Infinite"])
def test_time_zero_unlimited_and_infinite_mean_no_limit(home, spelling):
    home.start()
    job = home.show(home.submit("--hold", "--time", spelling, "--", "true"))
    assert job["time_limit_s"] is None


@pytest.mark.parametrize(
    "argv, option, key",
    [
        (["--time", "999999999"], "--time", "time-limit-s"),
        (["--retry-delay", "99999999d"], "--retry-delay", "retry-delay-s"),
        (["--time", "10", "--signal", "USR1@99999999999"], "--signal", "warn-before-s"),
    ],
)
def test_errors_name_the_option_typed(home, argv, option, key):
    home.start()
    proc = home.run("submit", *argv, "--", "true", check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"Error: {option}") and key not in proc.stderr


@pytest.mark.parametrize("command", ["hold", "release", "update"])
def test_refused_operations_on_a_finished_job_exit_1(home, command):
    home.start()
    job_id = home.submit("--", "true")
    home.wait_state(job_id, "succeeded")
    extra = ["--priority", "3"] if command == "update" else []
    proc = home.run(command, str(job_id), *extra, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"Error: job {job_id}") and proc.stderr.count("\n") == 1
