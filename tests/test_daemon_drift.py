"""A running daemon started with other GPUs or another config than the caller would use
says so, once per command, with the fix; `gpusched daemon restart` applies it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Home, wait_until
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths

pytestmark = pytest.mark.e2e

FIX = "run `gpusched daemon restart` to apply it (running jobs keep running)\n"


def warning(what: str) -> str:
    return f"gpusched: warning: {what}; {FIX}"


def show(home: Home, job_id: int) -> dict:
    return Client(resolve_paths(home.env), autostart=False).call("show", ids=[job_id])["jobs"][0]


def test_other_simulated_gpus_here_are_named_on_every_command(home):
    home.start()  # on 4x80GiB
    job = home.submit("--", "true")
    other = {"GPUSCHED_SIMULATE": "2x40GiB"}
    expected = warning(
        "the running daemon uses simulated GPUs 4x80GiB but GPUSCHED_SIMULATE=2x40GiB here"
    )
    for args in (
        ["ls"],
        ["submit", "--", "true"],
        ["submit", "-c1", "--", "true"],
        ["show", str(job)],
        ["gpus", "--json"],
        ["wait", str(job)],
        ["top", "--once"],
        ["daemon", "status"],
        ["daemon", "start"],
    ):
        proc = home.run(*args, env=other)
        assert proc.stderr == expected, (args, proc.stderr)
    unset = home.run("ls", env={"GPUSCHED_SIMULATE": ""})
    assert unset.stderr == warning(
        "the running daemon uses simulated GPUs 4x80GiB but GPUSCHED_SIMULATE is not set here"
    )
    assert home.run("ls").stderr == ""  # the daemon's own environment: nothing to say


def test_a_config_file_changed_since_the_daemon_started_is_named(home):
    home.start()
    config = home.path / "gpusched.toml"
    text = config.read_text()
    os.utime(config, (1, 1))  # touched, the same text: nothing to say
    assert home.run("ls").stderr == ""
    config.write_text(text + "[jobs]\nmax_running = 2\n")
    assert home.run("ls").stderr == warning(
        f"the config file {config} changed since the daemon started"
    )
    config.write_text(text)  # back as it was
    assert home.run("ls").stderr == ""
    config.unlink()
    assert "changed since the daemon started" in home.run("ls").stderr


def test_daemon_restart_applies_the_environment_and_keeps_jobs_running(home, tmp_path):
    home.start()
    gate = tmp_path / "go"
    job = home.submit(
        "--gpus",
        "1",
        "--gpu-ids",
        "0",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done; exit 3",
    )
    running = wait_until(
        lambda: (j := show(home, job))["state"] == "running" and j, "the job to run"
    )
    (home.path / "gpusched.toml").write_text("[host]\ncpus = 32\n")
    other = {"GPUSCHED_SIMULATE": "2x40GiB"}
    proc = home.run("daemon", "restart", env=other)
    assert proc.stderr == ""  # no warning about the daemon it is replacing
    assert proc.stdout.startswith("gpusched daemon restarted (pid ")
    assert proc.stdout.endswith("; 1 running job(s) kept running\n")
    assert home.run("ls", env=other).stderr == ""
    gpus = json.loads(home.run("gpus", "--json", env=other).stdout)["gpus"]
    assert [g["mem_total_bytes"] for g in gpus] == [40 * 2**30] * 2
    adopted = show(home, job)
    assert (adopted["state"], adopted["started_at"]) == ("running", running["started_at"])
    gate.touch()
    wait_until(lambda: show(home, job)["state"] != "running", "the job to end")
    assert (show(home, job)["state"], show(home, job)["exit_code"]) == ("failed", 3)


def test_daemon_restart_with_no_daemon_starts_one(home):
    proc = home.run("daemon", "restart")
    assert proc.stdout.startswith("gpusched daemon started (pid ") and proc.stdout.endswith(
        "; none was running\n"
    )
    assert home.daemon_pid() is not None


def test_daemon_restart_of_the_system_daemon_points_to_systemctl(tmp_path: Path):
    # A system daemon's socket, as clients find it (GPUSCHED_SYSTEM_ROOT moves /run).
    socket_dir = tmp_path / "run/gpusched"
    socket_dir.mkdir(parents=True)
    (socket_dir / "gpusched.sock").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCHED_", "XDG_"))}
    env.update({"GPUSCHED_SYSTEM_ROOT": str(tmp_path), "PYTHONPATH": str(REPO)})
    proc = subprocess.run(
        [sys.executable, "-m", "gpusched", "daemon", "restart"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        "Error: the system daemon is systemd's to restart: run `sudo "
        "systemctl restart gpusched` (running jobs keep running)\n"
    )
