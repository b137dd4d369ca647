"""`submit --notify` and `wait --notify`: tell the user's own desktop (notify-send, when a
session bus is there) or terminal (a bell and a line on stderr) that jobs ended.

Client side, in the user's session: a system daemon cannot reach a user's session bus.
Imported by the fast paths: os and sys only, the rest when a notification is due.
"""

from __future__ import annotations

import os
import subprocess
import sys

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from typing import Any

NOTIFY_SEND_TIMEOUT_S = 10.0


def summary(jobs: list[Any]) -> tuple[str, str]:
    """A title and a body: the job and how it ended, or counts by state for several."""
    if len(jobs) == 1:
        job = jobs[0]
        code = job.get("exit_code")
        how = job["state"] + (f" (exit {code})" if code not in (None, 0) else "")
        return f"gpusched job {job['id']} {how}", job.get("name") or " ".join(job["command"])
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"gpusched: {len(jobs)} jobs ended ({states})", ", ".join(str(j["id"]) for j in jobs)


def tell_ended(jobs: list[Any]) -> None:
    title, body = summary(jobs)
    if os.environ.get("DBUS_SESSION_BUS_ADDRESS") and _notify_send(title, body):
        return
    # No desktop to tell: the terminal's bell, and the same words.
    sys.stderr.write(f"\a{title}: {body}\n")
    sys.stderr.flush()


def _notify_send(title: str, body: str) -> bool:
    """Whether notify-send took it (a job's name is one argument: no shell reads it)."""
    try:
        done = subprocess.run(
            ["notify-send", "-a", "gpusched", "--", title, body],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=NOTIFY_SEND_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def watch_in_background(ids: list[int]) -> None:
    """`submit --notify` without --wait: a `gpusched wait --notify` of its own, left
    running in this session (so its bell reaches this terminal) once submit returns."""
    subprocess.Popen(
        [sys.executable, "-m", "gpusched", "wait", "--notify", *map(str, ids)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
