"""`gpusched mcp` in system mode: the server acts as the user who runs it, so the daemon's
own checks refuse what that user may not do (two real users, a root daemon)."""

from __future__ import annotations

import asyncio

import pytest

from conftest import DEADLINE_S

pytest.importorskip("mcp")  # the mcp extra brings it

import mcp_types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters


def as_user(root, user) -> StdioServerParameters:
    """`gpusched mcp` started by user, as their assistant would start it."""
    return StdioServerParameters(
        command="setpriv",
        args=[
            f"--reuid={user.uid}",
            f"--regid={user.gid}",
            "--init-groups",
            "env",
            root.python,
            "-m",
            "gpusched",
            "mcp",
        ],
        env={**root.env, "HOME": user.home, "USER": user.name, "LOGNAME": user.name},
        cwd=user.home,
    )


def test_a_cancel_of_another_users_job_is_refused(users, system):
    alice, bob = users
    job_id = system.submit(alice, "--hold", "--", "sleep", "100")

    async def drive() -> tuple[types.CallToolResult, dict]:
        async with Client(as_user(system, bob)) as client:
            refused = await client.call_tool("cancel", {"job_ids": [str(job_id)]})
            mine = await client.call_tool("submit", {"command": ["true"], "hold": True})
            return refused, mine.structured_content or {}

    refused, mine = asyncio.run(asyncio.wait_for(drive(), DEADLINE_S))
    said = "".join(getattr(block, "text", "") for block in refused.content)
    assert refused.is_error and f"job {job_id}" in said, said
    assert system.show(job_id)["state"] == "pending"
    assert system.show(mine["id"])["user"] == bob.name  # the server's user, as the kernel says
    # Audited as any other client's refusal: the kernel's word for who asked.
    denied = [e for e in system.audit() if e["job"] == job_id and e["request"] == "cancel"]
    assert [e["uid"] for e in denied] == [bob.uid]
