"""[jobs] max_log_size in system mode: the capped logs are the user's own files, opened as
the user, and the cap holds."""

from __future__ import annotations

from pathlib import Path

from systemroot import pytestmark  # noqa: F401 - the module's marks


def test_a_capped_log_in_system_mode_is_the_users_own_and_stays_under_the_cap(make_system, users):
    alice, _ = users
    system = make_system('[jobs]\nmax_log_size = "4K"\n')
    job_id = system.submit(alice, "--", "sh", "-c", "seq -f 'line %g' 1 20000; id -u >&2")
    job = system.wait_state(job_id, "succeeded", "failed")
    assert job["state"] == "succeeded", job["end_reason"]
    text = system.run_as(alice, "logs", str(job_id)).stdout
    assert text.startswith("[gpusched: ") and text.endswith("line 20000\n")
    assert len(text.encode()) <= 4096
    assert system.run_as(alice, "logs", "--stderr", str(job_id)).stdout == f"{alice.uid}\n"
    info = Path(job["stdout_path"]).lstat()
    assert (info.st_uid, info.st_size) == (alice.uid, len(text.encode()))
