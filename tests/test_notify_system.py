"""Notifications in system mode: the site's [[notify]] entries run as [system]
service_user, a user's own (~/.config/gpusched/notify.toml) as that user; a real root
daemon and real users (tests/test_system_mode.py's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from conftest import executable, wait_until
from processes import kill_all
from systemroot import pytestmark  # noqa: F401 - the module's marks

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


def test_site_hooks_run_as_the_service_user_and_own_hooks_as_the_owner(
    make_system, users, shared_dir
):
    alice, bob = users
    out = shared_dir
    hook = executable(out / "who.sh", WHO)
    system = make_system(
        f'[system]\nservice_user = "{bob.name}"\n\n'
        f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}", "site"]\n'
    )
    own_entries(alice, f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}", "own"]\n')
    job = system.submit(alice, "--", "true")
    wait_until(
        lambda: (out / f"site-{job}").exists() and (out / f"own-{job}").exists(),
        "both hooks to run",
    )
    site = (out / f"site-{job}").read_text().split("\n")
    own = (out / f"own-{job}").read_text().split("\n")
    assert int(site[0]) == bob.uid and site[3] == "end"
    assert int(own[0]) == alice.uid and own[1] == alice.home and own[2] == alice.home


def test_own_entries_others_can_write_are_ignored_and_logged(make_system, users, shared_dir):
    alice, _ = users
    out = shared_dir
    hook = executable(out / "who.sh", WHO)
    system = make_system()
    own_entries(
        alice, f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}", "own"]\n', mode=0o666
    )
    job = system.submit(alice, "--", "true")
    log = system.path / "var/lib/gpusched/notify.log"
    line = wait_until(
        lambda: (
            log.exists()
            and next((x for x in log.read_text().splitlines() if f"job {job} end -> " in x), None)
        ),
        "the end's line in the notification log",
    )
    assert line.endswith(
        f"uid {alice.uid}'s entries: {alice.home}/.config/gpusched/"
        f"notify.toml must be a regular file of uid {alice.uid} that only "
        "it can write; its entries are ignored"
    )
    assert not (out / f"own-{job}").exists()


def sleeping_hooks(user) -> list[psutil.Process]:
    """The user's own hooks that sleep (SLEEPER), oldest first."""
    found = [
        p
        for p in psutil.process_iter(["uids", "cmdline", "create_time"])
        if p.info["uids"]
        and p.info["uids"].real == user.uid
        and p.info["cmdline"] == ["sleep", SLEEPER]
    ]
    return sorted(found, key=lambda p: p.info["create_time"])


SLEEPER = "7201"  # seconds: the hook of a user who would hold the notification threads


@pytest.fixture
def kill_sleepers(users):
    yield
    for user in users:  # the daemon's end kills hooks only when it stops itself
        kill_all(sleeping_hooks(user))


def test_a_users_sleeping_hooks_delay_neither_the_sites_nor_another_users(
    make_system, users, shared_dir, kill_sleepers
):
    alice, bob = users
    out = shared_dir
    hook = executable(out / "who.sh", WHO)
    system = make_system(
        f'[system]\nuser_notify_timeout = "2h"\n\n'
        f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}", "site"]\n'
    )
    own_entries(
        alice, f'[[notify]]\nevents = ["end"]\ncommand = ["sleep", "{SLEEPER}"]\ntimeout = "2h"\n'
    )
    own_entries(bob, f'[[notify]]\nevents = ["end"]\ncommand = ["{hook}", "{out}", "own"]\n')
    for job in [system.submit(alice, "--", "true") for _ in range(4)]:  # a hook per thread
        system.wait_state(job, "succeeded")
    first = wait_until(lambda: sleeping_hooks(alice), "alice's first sleeping hook")[0]
    job = system.submit(bob, "--", "true")
    wait_until(
        lambda: (out / f"site-{job}").exists() and (out / f"own-{job}").exists(),
        "the site's hook and bob's own for bob's job",
    )
    assert first.is_running(), "alice's hook ended first: the test proves nothing"


def test_a_users_hook_runs_no_longer_than_the_site_allows(make_system, users, kill_sleepers):
    alice, _ = users
    system = make_system('[system]\nuser_notify_timeout = "2s"\n')
    own_entries(
        alice, f'[[notify]]\nevents = ["end"]\ncommand = ["sleep", "{SLEEPER}"]\ntimeout = "2h"\n'
    )
    job = system.submit(alice, "--", "true")
    log = system.path / "var/lib/gpusched/notify.log"
    wait_until(
        lambda: (
            log.exists()
            and f"job {job} end -> sleep: timeout after 2 s (killed)" in log.read_text()
        ),
        "alice's hook to be killed at the site's maximum",
    )


def test_the_log_tail_never_opens_a_fifo_of_another_user(make_system, users, shared_dir):
    """The root daemon reads a job's log tail as the job's owner, and only a regular file
    of theirs: here the owner's output directory became a link to another user's FIFO,
    whose writer would be let through by any open for reading."""
    alice, bob = users
    system = make_system('[[notify]]\nevents = ["end"]\ncommand = ["true"]\n')
    bobs, mine = shared_dir / "bob", shared_dir / "alice"
    for folder, user in ((bobs, bob), (mine, alice)):
        folder.mkdir()
        os.chown(folder, user.uid, user.gid)
        folder.chmod(0o755)
    os.mkfifo(bobs / "out", 0o644)
    os.chown(bobs / "out", bob.uid, bob.gid)
    writer = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={bob.uid}",
            f"--regid={bob.gid}",
            "--init-groups",
            "sh",
            "-c",
            'exec 3>"$1"; touch "$2"',
            "sh",
            str(bobs / "out"),
            str(bobs / "opened"),
        ]
    )
    try:
        job = system.submit(alice, "--hold", "-o", str(mine / "out"), "--", "true")
        mine.rename(shared_dir / "alice-before")
        mine.symlink_to(bobs)
        os.chown(mine, alice.uid, alice.gid, follow_symlinks=False)
        system.run_as(alice, "cancel", str(job))
        log = system.path / "var/lib/gpusched/notify.log"
        wait_until(
            lambda: log.exists() and f"job {job} end -> true: exit 0" in log.read_text(),
            "the hook of the cancelled job",
        )
        assert writer.poll() is None and not (bobs / "opened").exists(), (
            "the daemon opened bob's FIFO"
        )
    finally:
        writer.kill()
        writer.wait()
