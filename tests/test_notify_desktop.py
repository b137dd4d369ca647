"""`submit --notify` and `wait --notify`: the user's own desktop (a notify-send on PATH and
a session bus) or, without one, the terminal's bell."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import executable, wait_until

FAKE_NOTIFY_SEND = """#!/bin/sh
# Records each notification: one argument per line, then a blank line.
for arg in "$@"; do printf '%s\\n' "$arg"; done >> "{out}"
echo >> "{out}"
"""


def desktop_env(tmp_path, out) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    executable(bin_dir / "notify-send", FAKE_NOTIFY_SEND.format(out=out))
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={tmp_path}/bus",
    }


def test_wait_notify_tells_the_desktop_how_the_job_ended(home, tmp_path):
    out = tmp_path / "notifications"
    job = home.submit("--name", "$(touch PWNED) <b>", "--", "sh", "-c", "exit 4")
    proc = home.run("wait", "--notify", str(job), check=False, env=desktop_env(tmp_path, out))
    assert proc.returncode == 4
    assert out.read_text() == (
        f"-a\ngpusched\n--\ngpusched job {job} failed (exit 4)\n$(touch PWNED) <b>\n\n"
    )
    assert not list(tmp_path.rglob("PWNED")) and not (home.path / "PWNED").exists()


def test_without_a_session_bus_the_terminal_bell_rings(home, tmp_path):
    job = home.submit("--", "true")
    env = {**desktop_env(tmp_path, tmp_path / "unused"), "DBUS_SESSION_BUS_ADDRESS": ""}
    proc = home.run("wait", "--notify", str(job), env=env)
    assert proc.stderr == f"\agpusched job {job} succeeded: true\n"
    assert not (tmp_path / "unused").exists()


def test_submit_notify_returns_at_once_and_tells_when_the_job_ends(home, tmp_path):
    out = tmp_path / "notifications"
    gate = tmp_path / "gate"
    # stderr to a file, as to a terminal: the watcher left behind keeps it open (for its bell).
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpusched",
                "submit",
                "--notify",
                "--",
                "sh",
                "-c",
                f"while [ ! -e {gate} ]; do sleep 0.1; done",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=60,
            cwd=home.path,
            env={**home.env, **desktop_env(tmp_path, out)},
        )
    job = int(proc.stdout)
    assert home.show(job)["state"] in ("pending", "running") and not out.exists()
    gate.touch()
    text = wait_until(lambda: out.exists() and out.read_text(), "the desktop notification")
    assert f"gpusched job {job} succeeded" in text


def test_submit_wait_notify_tells_after_the_wait(home, tmp_path):
    out = tmp_path / "notifications"
    proc = home.run("submit", "--wait", "--notify", "--", "true", env=desktop_env(tmp_path, out))
    job = int(proc.stdout)
    assert f"gpusched job {job} succeeded" in out.read_text()
