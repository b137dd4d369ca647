"""One rule for what another user sees (daemon/requests/authz.py, Viewer), held by every read
command: in system mode, with two real users, through the real CLI. Alice's jobs and
service carry a secret in their name, command, directory and environment; Bob walks
every command that reads, in every form, and never meets it, while Alice does."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid

from gpusched.client.protocol import COMMANDS, SERVICE_ACTIONS
from gpusched.core.services import Service
from gpusched.daemon.services.requests import META_PREFIX
from services_util import needs_haproxy

# Every command of the protocol is one of these. A new command fails
# test_every_command_is_walked_as_another_user until it is put in one: a command that
# reads goes in WALKS, with the CLI forms that send it.
CHANGES_ONLY = {
    "submit",
    "cancel",
    "hold",
    "release",
    "update",
    "requeue",
    "preempt",
    "drain",
    "resume",
    "stop",
    "resubmit",
    "reserve",
    "unreserve",
}
SHOWS_NOTHING = {"ping"}  # answers with the daemon's pid only
SERVICE_READS, SERVICE_CHANGES = {"list", "show"}, {"create", "scale", "update", "delete"}
# -O with every field that can carry a job's private facts.
FIELDS = "jobid,jobarrayid,name,user,state,reason,exitcode,dependency,progress,workdir,command"


def walks(ids: dict[str, int], key: str) -> dict[str, list[list[str]]]:
    """Each read command of the protocol -> the CLI invocations that send it."""
    done, running, array = (str(ids[k]) for k in ("done", "running", "array"))
    return {
        "status": [["daemon", "status"], ["daemon", "status", "--json"]],
        "list": [
            ["ls"],
            ["ls", "--json"],
            ["ls", "--all"],
            ["ls", "--all", "--json"],
            ["ls", "-r"],
            ["ls", "--all", "-r", "--json"],
            ["ls", "--last", "9"],
            ["ls", "--all", "--format", FIELDS],
            ["ls", "--all", "-r", "--format", FIELDS],
        ],
        "show": [
            ["show", done, running, array],
            ["show", "--json", done, running, array],
            ["show", str(ids["bobs"])],
        ],  # Bob's job, which depends on Alice's
        "wait": [["wait", done]],
        "gpus": [["gpus"], ["gpus", "--json"]],
        "snapshot": [["top", "--once"]],
        "logs": [["logs", done], ["logs", "--stderr", done]],
        "env": [["env", done]],
        "attach": [["attach", running]],  # refused: not his; and no --pty to attach to
        "reservations": [["reserve", "ls"], ["reserve", "ls", "--json"]],
        "usage": [
            ["usage"],
            ["usage", "--json"],
            ["usage", "--by", "name"],
            ["usage", "--by", "name", "--json"],
        ],
        "history": [["history", key], ["history", key, "--json"]],
        "gc": [["gc", "--dry-run"], ["gc", "--dry-run", "--json"]],
        "service": [
            ["service", "ls"],
            ["service", "ls", "--json"],
            ["service", "show", "svc"],
            ["service", "show", "svc", "--json"],
        ],
    }


def test_every_command_is_walked_as_another_user():
    walked = set(walks({"done": 1, "running": 2, "array": 3, "bobs": 4}, "k"))
    unknown = set(COMMANDS) - walked - CHANGES_ONLY - SHOWS_NOTHING
    assert not unknown, (
        f"commands {sorted(unknown)} are not walked as another user: add "
        "their CLI forms to walks() in tests/test_privacy_system.py"
    )
    read_only = {name for name, spec in COMMANDS.items() if spec.read_only} - SHOWS_NOTHING
    assert read_only <= walked, f"read-only commands not walked: {sorted(read_only - walked)}"
    unknown = set(SERVICE_ACTIONS) - SERVICE_READS - SERVICE_CHANGES
    assert not unknown, f"service actions to classify as reads or changes: {sorted(unknown)}"


@needs_haproxy
def test_no_read_command_shows_another_users_private_facts(make_system, users):
    alice, bob = users
    system = make_system()
    secret = f"s{uuid.uuid4().hex[:10]}"
    place = os.path.join(alice.home, f"cwd-{secret}")
    system.run_as(alice, "--version")  # the home exists; the directory is made as alice
    os.makedirs(place)
    os.chown(place, alice.uid, alice.gid)
    mine = ["--name", f"nm-{secret}", "--cwd", place]
    env = {"PRIVATE": f"env-{secret}"}
    command = ["sh", "-c", "sleep 300", f"cmd-{secret}"]
    ids = {
        "done": system.submit(
            alice, *mine, "--", "sh", "-c", "true", f"cmd-{secret}", extra_env=env
        ),
        "running": system.submit(alice, *mine, "--gpus", "1", "--", *command, extra_env=env),
        "array": system.json_as(
            alice, "submit", *mine, "--hold", "--array", "0-1", "--", *command, extra_env=env
        )["array_id"],
    }
    system.wait_state(ids["done"], "succeeded")
    system.wait_state(ids["running"], "running")
    ids["bobs"] = system.submit(
        bob, "--hold", "--dependency", f"afterok:{ids['running']}", "--", "true"
    )
    seed_service(system, alice, {"command": command, "name": "svc"}, env, place)
    key = f"nm-{secret}"

    def seen(who, args: list[str]) -> str:
        proc = system.run_as(who, *args, check=False)
        return proc.stdout + proc.stderr

    walked = walks(ids, key)
    for command_name, forms in walked.items():
        for args in forms:
            text = seen(bob, args)
            if command_name == "history":  # Bob typed the key: his answer holds no run of hers
                assert f"{ids['done']}" not in text.replace(key, ""), (args, text)
                continue
            assert secret not in text, (args, text)
    # Alice sees her own, in each of the places Bob could not.
    for args in (
        ["ls", "--json"],
        ["show", str(ids["done"])],
        ["usage", "--by", "name"],
        ["service", "show", "svc", "--json"],
        ["ls", "--all", "--format", FIELDS],
    ):
        assert secret in seen(alice, args), args
    assert json.loads(seen(alice, ["history", key, "--json"]))["runs"]
    system.run_as(alice, "service", "delete", "svc")


def seed_service(system, owner, job: dict, env: dict, cwd: str) -> None:
    """Alice's service, put in the daemon's store while it is stopped (a front door
    cannot start in system mode yet, issue 32 item 8; what others see of a service does
    not depend on its door)."""
    system.run_as(None, "daemon", "stop")
    system.wait_gone()
    service = Service(name="svc", uid=owner.uid, user=owner.name, job=job, env=env, cwd=cwd)
    with sqlite3.connect(system.path / "var/lib/gpusched/queue.db") as db:
        db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            (META_PREFIX + "svc", json.dumps(service.to_dict())),
        )
    db.close()
    system.start()
