"""Who may raise a job's priority (issue 32): in system mode a user who is not an admin
gives at most scheduling.max_user_priority, at submit, resubmit and update; admins (root,
the admin group) any. Real users, a real system daemon, the real CLI."""

from __future__ import annotations

OVER = "the highest a user who is not an admin may give (scheduling.max_user_priority"


def test_a_user_cannot_raise_priority_past_the_cap_but_an_admin_can(make_system, users):
    alice, bob = users
    system = make_system(
        f'[system]\nadmin_group = "{alice.extra_group}"\n[scheduling]\nmax_user_priority = 10\n'
    )
    # bob once gave 1000000 and preempted everyone's preemptible jobs.
    refused = system.run_as(bob, "submit", "--priority", "1000000", "--", "true", check=False)
    assert refused.returncode == 1, refused
    assert refused.stderr == (
        f"Error: priority 1000000 is over 10, {OVER} in the daemon's "
        "config); give a lower one, or ask an admin\n"
    )
    assert system.run_as(bob, "ls", "--all", "--json").stdout.strip() in ("[]", "")
    held = system.submit(bob, "--hold", "--priority", "10", "--", "sleep", "300")
    assert system.show(held)["priority"] == 10
    # nor through update, or a resubmit's change
    for args in (
        ("update", str(held), "--priority", "11"),
        ("resubmit", str(held), "--priority", "11", "--hold"),
    ):
        proc = system.run_as(bob, *args, check=False)
        assert proc.returncode == 1 and OVER in proc.stderr, (args, proc)
        assert proc.stderr.count("\n") == 1
    assert system.show(held)["priority"] == 10
    system.run_as(bob, "update", str(held), "--priority", "-5")  # lowering is anyone's
    assert system.show(held)["priority"] == -5
    # An admin (the group, or root) may raise anyone's.
    system.run_as(alice, "update", str(held), "--priority", "500")
    assert system.show(held)["priority"] == 500
    own = system.submit(alice, "--hold", "--priority", "1000000", "--", "true")
    assert system.show(own)["priority"] == 1000000
    system.run_as(None, "update", str(held), "--priority", "1000")
    assert system.show(held)["priority"] == 1000
    # A service's replicas are bob's jobs too: its priority is refused at create.
    proc = system.run_as(
        bob, "service", "create", "web", "--priority", "11", "--", "sleep", "300", check=False
    )
    assert proc.returncode == 1 and OVER in proc.stderr, proc
    assert system.run_as(bob, "service", "ls", "--json").stdout.strip() == "[]"


def test_the_default_cap_is_zero(system, users):
    alice, _ = users
    proc = system.run_as(alice, "submit", "--priority", "1", "--", "true", check=False)
    assert proc.returncode == 1 and "priority 1 is over 0, " in proc.stderr, proc
    assert (
        system.show(system.submit(alice, "--hold", "--priority", "0", "--", "true"))["priority"]
        == 0
    )
