"""`attach` in system mode: the job's terminal and its socket are its user's, the owner
attaches, and another user is refused by the daemon."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from conftest import wait_until
from systemroot import pytestmark  # noqa: F401 - the module's marks


def attach_as(system, user, job_id: int, keys: str) -> subprocess.CompletedProcess:
    """`gpusched attach JOB` as USER, with `keys` on its stdin (a pipe)."""
    command = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"]
    env = {**system.env, "HOME": user.home, "USER": user.name, "LOGNAME": user.name}
    return subprocess.run(
        [*command, system.python, "-m", "gpusched", "attach", str(job_id)],
        input=keys,
        capture_output=True,
        text=True,
        env=env,
        cwd=user.home,
        timeout=60,
    )


def test_the_owner_attaches_to_a_terminal_of_their_own_and_others_are_refused(system, users):
    alice, bob = users
    script = 'read x; echo "got $x as $(id -u) on $(stat -c %u "$(tty)")"; exit 5'
    job_id = system.submit(alice, "--pty", "--", "sh", "-c", script)
    job = system.wait_state(job_id, "running")
    sock = Path(job["stdout_path"]).with_name(f"{job_id}.pty.sock")
    wait_until(lambda: os.path.lexists(sock), "the shim to listen")  # after the job runs
    info = sock.lstat()
    assert stat.S_ISSOCK(info.st_mode) and info.st_uid == alice.uid
    assert stat.S_IMODE(info.st_mode) == 0o600
    refused = attach_as(system, bob, job_id, "")
    assert refused.returncode == 1
    assert f"job {job_id} belongs to {alice.name}" in refused.stderr
    attached = attach_as(system, alice, job_id, "hi\n")
    assert attached.returncode == 5, attached.stderr
    assert f"got hi as {alice.uid} on {alice.uid}" in attached.stdout
    assert system.wait_state(job_id, "failed")["exit_code"] == 5
    assert not os.path.lexists(sock)
