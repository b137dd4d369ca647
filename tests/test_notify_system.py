"""Notifications in system mode: the site's [[notify]] entries run as [system]
service_user, a user's own (~/.config/gpusched/notify.toml) as that user; a real root
daemon and real users (tests/test_system_mode.py's)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import executable, wait_until
from test_system_mode import make_system, pytestmark, users  # noqa: F401 - fixtures

WHO = """#!/bin/sh
# Says who ran it, and where, for the job in the event (whole, or not at all: mv).
printf '%s\\n' "$(id -u)" "$HOME" "$(pwd)" "$GPUSCHED_EVENT" > "$1/.$2-$GPUSCHED_JOB_ID"
mv "$1/.$2-$GPUSCHED_JOB_ID" "$1/$2-$GPUSCHED_JOB_ID"
"""


@pytest.fixture
def shared_dir():
    """A directory every test user may write (pytest's tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gpss-notify-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def own_entries(user, text: str, mode: int = 0o644) -> Path:
    folder = Path(user.home) / ".config/gpusched"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "notify.toml"
    path.write_text(text)
    for item in (folder.parent, folder, path):
        os.chown(item, user.uid, user.gid)
    path.chmod(mode)
    return path


def test_site_hooks_run_as_the_service_user_and_own_hooks_as_the_owner(make_system, users,
                                                                      shared_dir):
    alice, bob = users
    out = shared_dir
    hook = executable(out / "who.sh", WHO)
    system = make_system(f'[system]\nservice_user = "{bob.name}"\n\n'
                         f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}", "site"]\n')
    own_entries(alice, f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}", "own"]\n')
    job = system.submit(alice, "--", "true")
    wait_until(lambda: (out / f"site-{job}").exists() and (out / f"own-{job}").exists(),
               "both hooks to run")
    site = (out / f"site-{job}").read_text().split("\n")
    own = (out / f"own-{job}").read_text().split("\n")
    assert int(site[0]) == bob.uid and site[3] == "end"
    assert int(own[0]) == alice.uid and own[1] == alice.home and own[2] == alice.home


def test_own_entries_others_can_write_are_ignored_and_logged(make_system, users, shared_dir):
    alice, _ = users
    out = shared_dir
    hook = executable(out / "who.sh", WHO)
    system = make_system()
    own_entries(alice, f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}", "own"]\n',
                mode=0o666)
    job = system.submit(alice, "--", "true")
    log = system.path / "var/lib/gpusched/notify.log"
    line = wait_until(lambda: log.exists() and next(
        (x for x in log.read_text().splitlines() if f"job {job} end -> " in x), None),
        "the end's line in the notification log")
    assert line.endswith(f"uid {alice.uid}'s entries: {alice.home}/.config/gpusched/"
                         f"notify.toml must be a regular file of uid {alice.uid} that only "
                         "it can write; its entries are ignored")
    assert not (out / f"own-{job}").exists()
