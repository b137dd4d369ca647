"""Retention in system mode: gc is for admins, and the logs it removes lie in the users'
own log directories (the daemon, root, removes nothing through a link a user planted)."""

from __future__ import annotations

import os
from pathlib import Path

from systemroot import pytestmark  # noqa: F401 - the module's marks


def test_gc_is_for_admins_and_removes_logs_in_the_users_directories(make_system, users):
    alice, bob = users
    system = make_system("[jobs]\nkeep_finished_count = 1\n")
    first = system.submit(alice, "--", "sh", "-c", "echo one")
    first_job = system.wait_state(first, "succeeded")
    second = system.submit(alice, "--", "sh", "-c", "echo two")
    system.wait_state(second, "succeeded")
    proc = system.run_as(bob, "gc", "--dry-run", check=False)
    assert proc.returncode == 1
    assert proc.stderr == "Error: only an admin may see what gc would remove\n"
    proc = system.run_as(alice, "gc", check=False)
    assert (proc.returncode, proc.stderr) == (1, "Error: only an admin may remove finished jobs\n")
    # A link alice plants in place of her old log must not make root remove its target.
    target = system.path / "precious"
    target.write_text("keep me\n")
    stdout_log = Path(first_job["stdout_path"])
    stdout_log.unlink()
    os.symlink(target, stdout_log)
    assert system.run_as(None, "gc").stdout.startswith("removed 1 finished job(s)")
    assert target.read_text() == "keep me\n"
    assert not os.path.lexists(first_job["stderr_path"])
    assert [j["id"] for j in system.json_as(None, "ls", "--all")] == [second]
    assert system.run_as(alice, "logs", str(second)).stdout == "two\n"
