"""Bad input: one `Error:` line naming the value, exit status 2 (usage) or 1, and no change."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import REPO, Home, accounts, wait_until
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths


def assert_one_error_line(proc: subprocess.CompletedProcess, status: int, *words: str) -> str:
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr
    assert err.startswith("Error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err + (proc.stdout or "")
    for word in words:
        assert word.lower() in err.lower(), (word, err)
    return err


def queue(home: Home) -> list[dict]:
    return json.loads(home.run("ls", "--all", "--json").stdout)


def is_live_reading(key: str) -> bool:
    """Readings the daemon takes of a running job (peak memory): they change on their own."""
    return "peak" in key


def assert_queue_unchanged(home: Home, before: list[dict]) -> None:
    # What `ls --all --json` prints, asked in this process: a Python start-up per check
    # is most of a second on a loaded machine.
    after = Client(resolve_paths(home.env), autostart=False).call("list", all=True)["jobs"]
    changed = {
        (a["id"], key)
        for a, b in zip(after, before)
        for key in a.keys() | b.keys()
        if not is_live_reading(key) and a.get(key) != b.get(key)
    }
    assert [j["id"] for j in after] == [j["id"] for j in before]
    assert not changed, sorted(changed)


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    """A daemon on 4 simulated GPUs with a finished, a running and a pending job."""
    root = tmp_path_factory.mktemp("errors")
    home = Home(root / "home")
    home.path.mkdir()
    gate = root / "go"
    home.done = home.submit("--", "true")
    home.running = home.submit(
        "--gpus", "1", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    home.pending = home.submit("--gpus", "4", "--", "true")
    client = Client(resolve_paths(home.env), autostart=False)

    def state(i):
        return client.call("show", ids=[i])["jobs"][0]["state"]

    wait_until(
        lambda: (
            state(home.done) == "succeeded"
            and state(home.running) == "running"
            and client.call("show", ids=[home.pending])["jobs"][0]["pending_reason"].startswith(
                "needs"
            )
        ),
        "the queue to settle",
    )
    home.baseline = queue(home)
    yield home
    gate.touch()
    home.cleanup()


USAGE = [
    (["submit", "--gpus", "-1", "--", "true"], "-1"),
    (["submit", "--gpus", "100000", "--", "true"], "100000"),
    (["submit", "--gpus", "99999999999999999999999", "--", "true"], "99999999999999999999999"),
    (["submit", "--gpus", "5", "--", "true"], "5 GPUs"),
    (["submit", "--gpus", "many", "--", "true"], "--gpus"),  # typer names the option
    (["submit", "--gpu-mem", "12XB", "--", "true"], "12XB"),
    (["submit", "--gpu-mem", "0", "--", "true"], "--gpu-mem"),
    # A bare number is no GPU memory size (it once reserved 10 bytes), and a unit given
    # apart from its number gets the hint that fits (once one about dependency ids).
    (["submit", "--gpu-mem", "10", "--", "true"], "give a unit, e.g. 10G"),
    (["submit", "--gpu-mem", "20", "G", "--", "true"], "--gpu-mem 20G"),
    (["submit", "--gpus", "1", "--gpu-mem", "200G", "--", "true"], "200.0 GiB"),
    (["submit", "--gpus", "0", "--gpu-mem", "1G", "--", "true"], "--gpu-mem"),
    (["submit"], "command"),
    (["submit", "--"], "command"),
    (["submit", "--", ""], "command"),
    (["submit", "--env", "NOEQUALS", "--", "true"], "NOEQUALS"),
    (["submit", "--cwd", "/no/such/dir", "--", "true"], "/no/such/dir"),
    (["submit", "--from-file", "/no/such/file"], "/no/such/file"),
    (["submit", "--priority", "99999999", "--", "true"], "99999999"),
    (["submit", "--bogus", "--", "true"], "--bogus"),
    (["show", "abc"], "'abc' is not a job id"),
    (["show"], "JOBID"),
    (["cancel"], "JOBID..."),
    (["frobnicate"], "frobnicate"),
]
NOT_FOUND = [
    (["show", "999999"], "999999"),
    (["cancel", "999999"], "999999"),
    (["logs", "999999"], "999999"),
    (["logs", "--stderr", "999999"], "999999"),
    (["wait", "999999"], "999999"),
]


@pytest.mark.e2e
@pytest.mark.parametrize("args, named", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors(busy, args, named):
    assert_one_error_line(busy.run(*args, check=False), 2, named)
    assert_queue_unchanged(busy, busy.baseline)


@pytest.mark.e2e
@pytest.mark.parametrize("args, named", NOT_FOUND, ids=[" ".join(a) for a, _ in NOT_FOUND])
def test_unknown_job_ids(busy, args, named):
    assert_one_error_line(busy.run(*args, check=False), 1, f"no job {named}")
    assert_queue_unchanged(busy, busy.baseline)


@pytest.mark.e2e
def test_one_unknown_id_refuses_the_whole_cancel(busy):
    proc = busy.run("cancel", str(busy.running), str(busy.pending), "999999", check=False)
    assert_one_error_line(proc, 1, "no job 999999")
    # Neither the running nor the pending job was touched.
    assert_queue_unchanged(busy, busy.baseline)


@pytest.mark.e2e
def test_sweep_with_one_bad_line_queues_nothing(busy, tmp_path):
    # All or nothing: an impossible job in a batch refuses the batch.
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("true\ntrue\n")
    proc = busy.run("submit", "--gpus", "9", "--from-file", str(sweep), check=False)
    assert_one_error_line(proc, 2, "9 GPUs")
    assert_queue_unchanged(busy, busy.baseline)


# -- the config ----------------------------------------------------------------------------
# (config text or None for a directory in its place, what the error names, a command).
# Any command would do: the daemon it starts refuses the config and the client says why.
BAD_CONFIGS = [
    ("[daemon]\nfrobnicate = 1\n", "unknown key 'daemon.frobnicate'", ("ls",)),
    (
        '[daemon]\ncancel_grace = "soon"\n',
        "bad value for 'daemon.cancel_grace'",
        ("submit", "--", "true"),
    ),
    ("[gpus\nsimulate = 1\n", "not valid TOML", ("daemon", "start")),
    (None, "cannot read config", ("ls",)),
]


def test_a_bad_config_is_one_line_naming_the_key_or_file(home):
    home.submit("--", "true")
    home.run("daemon", "stop")
    before = (home.state / "queue.db").read_bytes()
    config = home.path / "gpusched.toml"
    for text, words, args in BAD_CONFIGS:
        if text is None:
            config.mkdir()
        else:
            config.write_text(text)
        assert_one_error_line(home.run(*args, check=False), 1, words, str(config))
        if text is None:
            config.rmdir()
        else:
            config.unlink()
    config.write_text("[daemon]\nfrobnicate = 1\n")
    # The foreground daemon (as systemd runs it) says the same.
    assert_one_error_line(home.run("daemon", "run", check=False), 1, "'daemon.frobnicate'")
    assert home.run("daemon", "status", check=False).returncode == 3
    config.unlink()
    assert (home.state / "queue.db").read_bytes() == before
    jobs = queue(home)
    assert len(jobs) == 1 and jobs[0]["state"] == "succeeded"


def test_a_home_that_is_a_file_is_one_line_for_every_command(home):
    """A slip such as GPUSCHED_HOME=~/gpusched.toml: said at once, not a trace from deep
    inside (the socket's or the queue's path below it)."""
    job_id = home.submit("--hold", "--", "true")
    not_a_dir = home.path / "notes.txt"
    not_a_dir.write_text("x\n")
    for args in (
        ["submit", "--", "true"],
        ["ls"],
        ["show", str(job_id)],
        ["cancel", str(job_id)],
        ["daemon", "start"],
        ["daemon", "run"],
        ["doctor"],
    ):
        proc = home.run(*args, check=False, env={"GPUSCHED_HOME": str(not_a_dir)})
        assert_one_error_line(proc, 1, f"GPUSCHED_HOME={not_a_dir} is not a directory")
    assert not_a_dir.read_text() == "x\n"
    assert [job["state"] for job in queue(home)] == ["pending"]


# -- another user --------------------------------------------------------------------------
def _can_run_as(user: pwd.struct_passwd, python: str, env: dict) -> bool:
    probe = subprocess.run(
        [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--clear-groups",
            python,
            "-c",
            "import gpusched.cli.app",
        ],
        env=env,
        cwd="/",
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def stranger():
    """A throwaway user account and a way to run gpusched as it; removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv to act as another user")
    name = f"gst{uuid.uuid4().hex[:8]}"
    accounts(
        "useradd",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        name,
    )
    try:
        user = pwd.getpwnam(name)
        # The test interpreter may live where others cannot reach (/root/.pyenv here);
        # then use the system one with this environment's packages on its path.
        packages = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        path = os.pathsep.join([str(REPO), *sorted(packages)])
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": "/",
            "LC_ALL": "C.UTF-8",
            "PYTHONPATH": path,
        }
        for python in (sys.executable, shutil.which("python3") or "/usr/bin/python3"):
            if _can_run_as(user, python, env):
                break
        else:
            pytest.skip(f"no Python that user {name} can run gpusched with")
        yield user, python, env
    finally:
        accounts("userdel", name, check=False)


@pytest.fixture
def open_home():
    """A home in a directory others may traverse, so only gpusched's own modes guard it."""
    root = Path(tempfile.mkdtemp(prefix="gpusched-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    home = Home(root / "home")
    home.path.mkdir(mode=0o755)
    os.chmod(home.path, 0o755)
    yield home
    home.cleanup()
    shutil.rmtree(root, ignore_errors=True)


def as_stranger(stranger, home: Home, *args: str) -> subprocess.CompletedProcess:
    user, python, env = stranger
    env = {**env, "GPUSCHED_HOME": str(home.path), "GPUSCHED_SIMULATE": "4x80GiB"}
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--clear-groups",
            python,
            "-m",
            "gpusched",
            *args,
        ],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.system
def test_another_user_cannot_reach_a_users_daemon(stranger, open_home, tmp_path):
    home = open_home
    job = home.submit(
        "--gpus", "1", "--", "sh", "-c", f"while [ ! -e {tmp_path / 'go'} ]; do sleep 0.05; done"
    )
    pid = home.daemon_pid()
    before = queue(home)
    # The socket is 0600 in a 0700 directory: the kernel refuses before the daemon hears it.
    proc = as_stranger(stranger, home, "cancel", str(job))
    assert_one_error_line(proc, 1, "permission denied", str(home.path / "run" / "gpusched.sock"))
    assert home.daemon_pid() == pid  # and it did not try to start a daemon of its own
    assert_queue_unchanged(home, before)
    (tmp_path / "go").touch()


@pytest.mark.system
def test_the_daemon_refuses_to_cancel_another_users_job(stranger, open_home, tmp_path):
    # The socket's modes are the first guard. The daemon's own check on SO_PEERCRED is
    # the second, for sockets that several users can reach. To test it for real, open the
    # socket as root after the start: the stranger then really connects, and the daemon
    # learns its uid from the kernel. No job row is forged.
    home = open_home
    user = stranger[0]
    mine = home.submit(
        "--gpus", "1", "--", "sh", "-c", f"while [ ! -e {tmp_path / 'go'} ]; do sleep 0.05; done"
    )
    os.chmod(home.path / "run", 0o711)
    os.chmod(home.path / "run" / "gpusched.sock", 0o666)
    before = queue(home)
    proc = as_stranger(stranger, home, "cancel", str(mine))
    assert_one_error_line(proc, 1, f"job {mine}", "root")
    assert_queue_unchanged(home, before)

    # The stranger's own job: it may cancel that, but not together with someone else's.
    proc = as_stranger(stranger, home, "submit", "--json", "--gpus", "4", "--", "true")
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(proc.stdout)["id"]
    client = Client(resolve_paths(home.env), autostart=False)
    job = client.call("show", ids=[theirs])["jobs"][0]
    assert (job["uid"], job["user"], job["state"]) == (user.pw_uid, user.pw_name, "pending")
    before = queue(home)
    proc = as_stranger(stranger, home, "cancel", str(theirs), str(mine))
    assert_one_error_line(proc, 1, f"job {mine}")
    assert_queue_unchanged(home, before)
    proc = as_stranger(stranger, home, "cancel", str(theirs))
    assert proc.returncode == 0, proc.stderr
    assert client.call("show", ids=[theirs])["jobs"][0]["state"] == "cancelled"
    # Root may cancel anyone's job.
    proc = as_stranger(stranger, home, "submit", "--json", "--gpus", "4", "--", "true")
    other = json.loads(proc.stdout)["id"]
    home.run("cancel", str(other))
    assert client.call("show", ids=[other])["jobs"][0]["state"] == "cancelled"
    (tmp_path / "go").touch()


def _run_into(stdout: int | None, home: Home, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpusched", *args],
        env=home.env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )


def test_output_that_cannot_be_written_is_one_line_and_loses_no_job(home):
    """Standard output closed, or a pipe nobody reads any more (`| head`): submit says on
    stderr which job it queued; a listing just stops. Never a traceback."""
    home.start()
    closed = subprocess.run(
        ["sh", "-c", f'exec "{sys.executable}" -m gpusched submit -- true >&-'],
        env=home.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    err = assert_one_error_line(closed, 1, "standard output is closed")
    queued = [j["id"] for j in queue(home)]
    assert (
        err == f"Error: queued job {queued[-1]}, but could not print its id: standard "
        "output is closed\n"
    )
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left before anything is written
    try:
        broken = _run_into(write_end, home, "submit", "--", "true")
        listing = _run_into(write_end, home, "ls", "--all")
    finally:
        os.close(write_end)
    assert_one_error_line(broken, 1, f"queued job {queued[-1] + 1},")
    assert (listing.returncode, listing.stderr) == (1, "")
    assert [j["id"] for j in queue(home)] == queued + [queued[-1] + 1]
