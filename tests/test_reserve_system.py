"""Who may reserve GPUs in system mode: an admin for anyone; a user for themself within
[reservations] user_max_gpu_hours, or not at all by default; only a reservation's users run
jobs in it; only its maker or an admin deletes it. Real users, a real system daemon, the CLI."""

from __future__ import annotations

import json

CREATE = ("reserve", "create", "--start", "now+1hour")


def test_by_default_only_an_admin_reserves_and_only_its_users_run_in_it(system, users):
    alice, bob = users
    refused = system.run_as(
        bob, *CREATE, "--gpus", "1", "--duration", "1h", "--name", "mine", check=False
    )
    assert refused.returncode == 1 and refused.stderr == (
        "Error: only an admin may reserve GPUs here ([reservations] user_max_gpu_hours = 0)\n"
    )
    system.run_as(None, *CREATE, "--gpus", "2,3", "-u", alice.name, "-d", "4h", "--name", "demo")
    listed = json.loads(system.run_as(bob, "reserve", "ls", "--json").stdout)
    assert [(r["name"], r["users"], r["created_by"]) for r in listed] == [
        ("demo", [alice.name], "root")
    ]
    job_id = system.submit(alice, "--gpus", "2", "--reservation", "demo", "--", "true")
    assert system.show(job_id)["reservation"] == "demo"
    theirs = system.run_as(bob, "submit", "--reservation", "demo", "--", "true", check=False)
    assert theirs.returncode == 1
    assert theirs.stderr == f"Error: --reservation demo is for {alice.name}, not {bob.name}\n"
    gone = system.run_as(alice, "reserve", "delete", "demo", check=False)
    assert gone.returncode == 1 and "only they or an admin may delete it" in gone.stderr
    assert any(e["request"] == "unreserve" and e["user"] == alice.name for e in system.audit())
    system.run_as(None, "reserve", "delete", "demo")
    system.run_as(None, "cancel", str(job_id))


def test_a_user_reserves_for_themself_within_the_limit(make_system, users):
    alice, bob = users
    system = make_system("[reservations]\nuser_max_gpu_hours = 4\n")
    system.run_as(bob, *CREATE, "--gpus", "0,1", "--duration", "2h", "--name", "bobs")
    over = system.run_as(bob, *CREATE, "--gpus", "2", "--duration", "1m", check=False)
    assert over.returncode == 1
    assert "over 4 ([reservations] user_max_gpu_hours; holds 4)" in over.stderr
    for_alice = system.run_as(
        bob, *CREATE, "--gpus", "3", "-u", alice.name, "-d", "1h", check=False
    )
    assert for_alice.returncode == 1 and "for yourself" in for_alice.stderr
    not_hers = system.run_as(alice, "reserve", "delete", "bobs", check=False)
    assert not_hers.returncode == 1
    system.run_as(bob, "reserve", "delete", "bobs")
    assert system.run_as(bob, "reserve", "ls").stdout.startswith("no reservations")
