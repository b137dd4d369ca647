"""`gpusched _job-ids`: job ids for shell completion, one `ID<TAB>STATE NAME` a line.

A Tab press runs it, so it stays light (no typer), never starts a daemon, gives up after
two seconds, and prints nothing at all when anything goes wrong.
"""

from __future__ import annotations

import sys

from gpusched.client.connection import Client
from gpusched.core.users import current_user_name

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from typing import Any

SCOPES = ("active", "all")  # active: your pending and running jobs; all: every job you see
TIMEOUT_S = 2.0


def _request(scope: str) -> dict[str, Any]:
    if scope == "all":
        return {"all": True}
    return {"users": [current_user_name()], "states": ["pending", "running"]}


def print_job_ids(argv: list[str]) -> int:
    """The completion helper's whole run: an exit status, and ids on standard output."""
    try:
        scope = argv[0] if argv else "all"
        if scope not in SCOPES or len(argv) > 1:
            return 2
        jobs = Client(autostart=False).call("list", timeout_s=TIMEOUT_S, **_request(scope))["jobs"]
        lines = []
        for job in jobs:
            name = " ".join(str(job.get("name") or "").split())  # one line per job, always
            lines.append(f"{job['id']}\t{job['state']} {name}".rstrip() + "\n")
        sys.stdout.write("".join(lines))
        sys.stdout.flush()
        return 0
    except BaseException:
        return 1
