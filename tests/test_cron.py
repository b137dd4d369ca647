"""Cron and a login shell, as a user has them: one daemon for one queue, and exit codes a
cron script can trust. Everything runs through the installed console script under `env -i`."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from conftest import CONSOLE_SCRIPT, DEADLINE_S, DEFAULT_HOST_CONFIG, REPO, kill_all, wait_until

pytestmark = pytest.mark.e2e


class Login:
    """A user with no GPUSCHED_HOME: their queue is under $HOME/.local/state/gpusched."""

    def __init__(self, home: Path, runtime: Path):
        self.home = home
        (home / ".config/gpusched").mkdir(parents=True)
        (home / ".config/gpusched/gpusched.toml").write_text(DEFAULT_HOST_CONFIG)
        runtime.mkdir(mode=0o700)
        cron = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "PYTHONPATH": str(REPO),
            "GPUSCHED_SIMULATE": "2x80GiB",
        }
        self.envs = {"cron": cron, "login": {**cron, "XDG_RUNTIME_DIR": str(runtime)}}

    def run(self, where: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CONSOLE_SCRIPT), *args],
            capture_output=True,
            text=True,
            env=self.envs[where],
            cwd=self.home,
            timeout=DEADLINE_S,
        )

    def cleanup(self) -> None:
        self.run("cron", "daemon", "stop")
        mine = []
        for proc in psutil.process_iter(["environ"]):
            if (proc.info["environ"] or {}).get("HOME") == str(self.home):
                mine.append(proc)
        kill_all(mine)


@pytest.fixture
def login():
    # Short paths: under a deep tmp_path both sockets would overflow sun_path and fall back
    # to one derived from the state directory, which hides the difference.
    root = Path(tempfile.mkdtemp(prefix="gs-cron-"))
    user = Login(root / "alice", root / "xdg")
    yield user
    user.cleanup()
    shutil.rmtree(root, ignore_errors=True)


def _daemon_pid(login: Login, where: str) -> int:
    proc = login.run(where, "daemon", "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["pid"]


def _state(home, job_id: str) -> str:
    return json.loads(home.script("show", "--json", job_id).stdout)["state"]


@pytest.mark.parametrize("first", ["login", "cron"])
def test_cron_and_a_login_shell_find_the_same_daemon(login, first):
    """The login shell has XDG_RUNTIME_DIR, cron's `env -i` does not: whichever starts the
    daemon, the other uses it (once, the second waited 15 s and exited 1)."""
    second = "cron" if first == "login" else "login"
    held = login.run(first, "submit", "--", "sleep", "30")
    assert held.returncode == 0, held.stderr
    proc = login.run(second, "submit", "--wait", "--", "sh", "-c", "exit 4")
    assert proc.returncode == 4, proc.stderr
    assert _daemon_pid(login, "cron") == _daemon_pid(login, "login")
    listed = login.run(second, "ls", "--json")
    assert [job["id"] for job in json.loads(listed.stdout)] == [int(held.stdout)]


# A job that catches SIGTERM and exits 0: its own status says "success".
CATCHES_TERM = "trap 'exit 0' TERM; sleep 60 & wait"


@pytest.mark.parametrize("how", ["cancel", "time limit"])
def test_a_job_stopped_before_it_succeeded_never_makes_wait_exit_0(home, how):
    limit = ["--time", "2s"] if how == "time limit" else []
    job_id = home.script("submit", *limit, "--", "sh", "-c", CATCHES_TERM).stdout.strip()
    waiter = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "wait", job_id],
        env=home.user_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if how == "cancel":
            wait_until(lambda: _state(home, job_id) == "running", "the job to start")
            home.script("cancel", job_id)
        assert waiter.wait(timeout=DEADLINE_S) == 1, waiter.stderr.read()
    finally:
        waiter.kill()
    job = json.loads(home.script("show", "--json", job_id).stdout)
    assert (job["state"], job["exit_code"]) == ("cancelled" if how == "cancel" else "timeout", 0)
    again = home.script("wait", job_id, check=False)
    assert again.returncode == 1


def test_a_wait_on_a_job_that_can_never_start_says_why_at_once(home):
    """Its dependency failed, without --kill-on-invalid-dep: once, wait blocked forever."""
    first = home.script("submit", "--", "false").stdout.strip()
    second = home.script("submit", "-d", f"afterok:{first}", "--", "true").stdout.strip()
    proc = home.script("wait", second, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        f"Error: job {second} can never start (dependency afterok:{first} can never be met"
    ), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    submitted = home.script("submit", "--wait", "-d", f"afterok:{first}", "--", "true", check=False)
    assert submitted.returncode == 1 and "can never start" in submitted.stderr
    # Asked to keep waiting, it waits on: here until the job is cancelled.
    waiter = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "wait", "--keep-waiting", second],
        env=home.user_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=2)
        home.script("cancel", second)
        assert waiter.wait(timeout=DEADLINE_S) == 1, waiter.stderr.read()
    finally:
        waiter.kill()
