"""Services in system mode, with two real users (tests/test_system_mode.py's): a user's
service starts, its replica and its front door run as that user, its admin socket and
config are the daemon's alone, and another user can neither change it nor take its port."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import psutil

from conftest import wait_until
from services_util import SERVER, ask, needs_haproxy
from systemroot import pytestmark  # noqa: F401 - the module's marks


def _service(system, user, action: str, *args: str) -> dict:
    return json.loads(system.run_as(user, "service", action, "--json", *args).stdout)


def _show(system, user, name: str) -> dict:
    return _service(system, user, "show", name)


@needs_haproxy
def test_a_users_service_runs_as_that_user_and_only_that_user_changes_it(make_system, users):
    alice, bob = users
    system = make_system()
    created = _service(
        system, alice, "create", "web", "--replicas", "1", "--", system.python, str(SERVER)
    )
    shown = wait_until(
        lambda: (s := _show(system, alice, "web"))["running"] == 1 and s,
        "alice's replica to pass its health check",
    )
    # The replica is alice's job, and answers through the front door.
    replica = shown["replicas"][0]["job_id"]
    assert system.show(replica)["uid"] == alice.uid
    status, body = ask(created["listen"], "/")
    assert status == 200 and json.loads(body)["job"] == str(replica)
    # The front door (HAProxy) runs as alice: every uid and gid, no other group.
    door = psutil.Process(shown["proxy_pid"])
    assert set(door.uids()) == {alice.uid} and set(door.gids()) == {alice.gid}
    assert Path(f"/proc/{door.pid}/status").read_text().count(f"\t{alice.uid}") >= 4
    # Its config (with the request log's secret) and its admin socket: the daemon's alone.
    config = system.path / "var/lib/gpusched/services/web.haproxy.cfg"
    admin = Path(re.search(r"stats socket (\S+)", config.read_text())[1])
    for folder in (config.parent, admin.parent):
        info = folder.stat()
        assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o700, folder
    assert admin.is_socket()
    # Bob can neither change it nor stop it.
    for args in (("scale", "web", "3"), ("update", "web", "--replicas", "1:3"), ("delete", "web")):
        proc = system.run_as(bob, "service", *args, check=False)
        assert proc.returncode == 1 and "belongs to" in proc.stderr, (args, proc.stderr)
    # Nor listen on its port: a second front door does not share the first one's.
    taken = system.run_as(
        bob,
        "service",
        "create",
        "steal",
        "--listen",
        created["listen"],
        "--",
        system.python,
        str(SERVER),
        check=False,
    )
    assert taken.returncode == 1 and "did not start" in taken.stderr, taken.stderr
    assert not (config.parent / "steal.haproxy.cfg").exists()  # nothing of it is kept
    after = _show(system, alice, "web")
    assert after["wanted"] == 1 and after["proxy_pid"] == door.pid
    assert [j for j in system.json_as(None, "ls", "--all") if j["uid"] == bob.uid] == []
    # Alice deletes it: the front door goes, and its socket with it.
    system.run_as(alice, "service", "delete", "web")
    wait_until(
        lambda: not psutil.pid_exists(door.pid) or door.status() == "zombie",
        "the front door to stop",
    )
    assert not os.path.exists(admin)
