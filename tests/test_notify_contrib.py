"""The example hooks in contrib/notify/, run as the daemon runs a hook, with stand-ins
for curl, sendmail and notify-send that record what they were given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import executable
from gpusched.core.models import Job, JobState
from gpusched.daemon.observe.notify import event_body, hook_env
from gpusched.proc.hookrun import run_hook

pytestmark = pytest.mark.e2e

CONTRIB = Path(__file__).resolve().parent.parent / "contrib" / "notify"
NAME = "x'; touch PWNED1; echo '$(touch PWNED2)\nBcc: eve@example.org\n\"`touch PWNED3`\""
RECORD = """#!/bin/sh
for arg in "$@"; do printf 'arg:%s\\n' "$arg"; done >> "{out}"
cat >> "{out}"
"""


def run(tmp_path: Path, script: str, *args: str) -> str:
    out = tmp_path / "recorded"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("curl", "sendmail", "notify-send"):
        executable(bin_dir / tool, RECORD.format(out=out))
    job = Job(
        id=42,
        command=("python", "train.py", "$(touch PWNED4)"),
        cwd=str(tmp_path),
        uid=1000,
        user="alice",
        name=NAME,
        state=JobState.FAILED,
        exit_code=3,
        submitted_at=1.0,
        started_at=2.0,
        ended_at=3.0,
        gpu_indices=(0, 1),
    )
    event = {**event_body("fail", job, 4.0, "ws1"), "log_tail": ["loss nan", "Traceback"]}
    env = hook_env(event)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    result = run_hook(
        (str(CONTRIB / script), *args), env, json.dumps(event).encode(), 30, cwd=str(tmp_path)
    )
    assert result.ok, result
    assert not list(tmp_path.rglob("PWNED*")), "a job's name or command was executed"
    return out.read_text()


def test_ntfy_posts_the_name_in_the_body_only(tmp_path):
    sent = run(tmp_path, "notify-ntfy.sh", "https://ntfy.example/topic")
    assert "arg:Title: gpusched job 42 fail (failed) on ws1\n" in sent
    assert "arg:Priority: high\n" in sent and "arg:https://ntfy.example/topic\n" in sent
    body = sent.split("arg:--data-binary\n")[1]
    assert body.startswith("arg:" + NAME) and "loss nan\nTraceback" in body


def test_mail_goes_to_the_configured_recipient_only(tmp_path):
    sent = run(tmp_path, "notify-mail.sh", "alice@example.org")
    assert sent.startswith(
        "arg:-oi\narg:--\narg:alice@example.org\nTo: alice@example.org\n"
        "Subject: gpusched job 42 failed on ws1\n"
    )
    headers, body = sent.split("\n\n", 1)
    assert "eve@" not in headers and NAME in body and "Traceback" in body


def test_desktop_hands_notify_send_the_name_as_one_argument(tmp_path):
    sent = run(tmp_path, "notify-desktop.sh")  # (the stand-in reads the event on stdin too)
    assert sent.startswith(
        f"arg:-a\narg:gpusched\narg:--\narg:gpusched job 42 failed\narg:{NAME}\n"
    )
