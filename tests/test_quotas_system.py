"""Quotas with real users and a real Unix group (system mode): a member of the group is held
to the group's quota, another user to the default, and `usage` shows both. Real users, a
real system daemon, the real CLI."""

from __future__ import annotations

import json

from conftest import wait_until


def test_a_groups_quota_holds_its_member_and_the_default_holds_the_rest(make_system, users):
    alice, bob = users  # alice is in alice.extra_group; bob is not
    system = make_system(
        f"[quotas.default]\nmax_running_gpus = 2\n"
        f"[quotas.groups.{alice.extra_group}]\nmax_running_gpus = 1\n"
    )
    hers = [system.submit(alice, "--gpus", "1", "--", "sleep", "300") for _ in range(2)]
    his = [system.submit(bob, "--gpus", "1", "--", "sleep", "300") for _ in range(3)]
    system.wait_state(hers[0], "running")
    system.wait_state(his[1], "running")
    group_reason = f"quota groups.{alice.extra_group} max_running_gpus=1: {alice.name} holds 1 GPU"
    default_reason = f"quota default max_running_gpus=2: {bob.name} holds 2 GPUs"
    wait_until(lambda: system.show(hers[1])["pending_reason"] == group_reason, "her reason")
    wait_until(lambda: system.show(his[2])["pending_reason"] == default_reason, "his reason")
    rows = json.loads(system.run_as(bob, "usage", "--json").stdout)["quotas"]
    assert {(r["user"], r["scope"], r["used"], r["limit"]) for r in rows} == {
        (alice.name, f"groups.{alice.extra_group}", 1, 1),
        (bob.name, "default", 2, 2),
    }
    system.run_as(None, "cancel", *map(str, hers + his))
