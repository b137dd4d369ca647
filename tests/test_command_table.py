"""The one table of protocol commands (client/protocol.py COMMANDS): the daemon binds a
handler to each command its loop answers, refuses callers as the table declares, and
docs/protocol.md shows the table as it is (.ci/regenerate rewrites the docs' copy)."""

from __future__ import annotations

import grp
import os
from pathlib import Path

import pytest

from gpusched.client import protocol
from gpusched.core.errors import PermissionDenied
from gpusched.core.sched.reservations import Reservation
from gpusched.core.services import Service
from gpusched.core.users import user_name
from gpusched.daemon.loop import Call
from gpusched.daemon.requests.request import Request

DOCS = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
BEGIN, END = "<!-- commands: begin -->", "<!-- commands: end -->"
CALLERS = {
    protocol.ANYONE: "anyone",
    protocol.OWNER: "owner or admin",
    protocol.ADMIN: "admin",
    protocol.ROOT: "root or the daemon's user",
}
STRANGER = (os.getpid(), 65534, 65534)  # not the daemon's user, not an admin


def commands_table() -> str:
    """The table docs/protocol.md shows, made from COMMANDS."""
    rows = [
        "| Command | Arguments ([optional]) | Read-only | Who may send it | Answered by |",
        "|---|---|---|---|---|",
    ]
    for name, spec in protocol.COMMANDS.items():
        optional = f"[{' '.join(sorted(spec.optional))}]" if spec.optional else ""
        arguments = " ".join(filter(None, (" ".join(sorted(spec.required)), optional)))
        rows.append(
            f"| `{name}` | {arguments or '-'} | {'yes' if spec.read_only else 'no'} "
            f"| {CALLERS[spec.caller]} | {'server' if spec.on_server else 'loop'} |"
        )
    return "\n".join(rows)


def docs_with_table(text: str) -> str:
    head, _, rest = text.partition(BEGIN + "\n")
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{commands_table()}\n{END}{tail}"


def test_the_docs_show_the_table_as_it_is():
    text = DOCS.read_text()
    assert BEGIN in text and END in text
    assert text == docs_with_table(text), (
        "docs/protocol.md's table of commands is stale: `.ci/regenerate` rewrites it"
    )


def test_every_argument_of_the_table_has_its_check():
    named = set().union(*(spec.required | spec.optional for spec in protocol.COMMANDS.values()))
    assert named == set(protocol.ARGUMENTS)
    assert all(spec.caller in CALLERS for spec in protocol.COMMANDS.values())


def test_the_loop_has_a_handler_for_exactly_the_commands_it_answers(box):
    loop = {name for name, spec in protocol.COMMANDS.items() if not spec.on_server}
    assert set(box.daemon.handlers._table) == loop


def stranger_requests(job_id: int) -> dict[str, dict]:
    """A request of each command the loop answers, naming the box owner's job (or service)."""
    ids = {"ids": [job_id]}
    return {
        "status": {},
        "submit": {"jobs": [{"command": ["true"], "hold": True}], "cwd": "/"},
        "list": {"all": True},
        "show": ids,
        "cancel": ids,
        "hold": ids,
        "release": ids,
        "update": {**ids, "priority": 0},
        "requeue": ids,
        "preempt": ids,
        "drain": {},
        "resume": {},
        "wait": {**ids, "timeout_s": 0},
        "gpus": {},
        "snapshot": {},
        "stop": {},
        "logs": {"id": job_id},
        "attach": {"id": job_id},
        "env": {"id": job_id},
        "resubmit": {"id": job_id},
        "gc": {"dry_run": True},
        "usage": {},
        "history": {"key": "true"},
        "service": {"action": "delete", "name": "web"},
        # For the owner, as only an admin may reserve for another; then the owner's deleted.
        "reserve": {"gpus": [0], "end_time": 4e9, "users": [user_name(os.getuid())]},
        "reservations": {},
        "unreserve": {"name": "demo"},
    }


def refused_to(box, creds: tuple[int, int, int]) -> set[str]:
    """The commands the daemon refuses to creds, each sent once (stranger_requests) on a
    held job and a service of the daemon's user; every other is answered (no error)."""
    job_id = box.submit("--hold", "--", "true")
    box.daemon.handlers.services.services["web"] = Service(
        name="web", uid=os.getuid(), user="owner", job={"command": ["true"]}, env={}, cwd="/"
    )
    box.daemon.state.note_reservation(
        "demo", Reservation("demo", (1,), ("owner",), 0.0, 4e9, user_name(os.getuid()))
    )
    requests = stranger_requests(job_id)
    assert set(requests) == {n for n, s in protocol.COMMANDS.items() if not s.on_server}
    refused = set()
    for name, args in requests.items():
        protocol.check_request({"cmd": name, "args": args})
        call = Call(Request(name, args, creds))  # not box.send: `service` takes a name
        box.daemon.step([call])
        if isinstance(call.error, PermissionDenied):
            refused.add(name)
        else:
            assert call.error is None, (name, call.error)
    return refused


def test_another_user_is_refused_exactly_the_commands_the_table_reserves(box):
    """Who may send each command, as the table declares it, is what the daemon enforces:
    a user who is not an admin is refused each command that is not for anyone, and no
    command that is; nothing of the owner's changes."""
    refused = refused_to(box, STRANGER)
    assert refused == {n for n, s in protocol.COMMANDS.items() if s.caller != protocol.ANYONE}
    job = box.show(1)  # the owner's, submitted first
    assert (job["uid"], job["state"], job["held"]) == (os.getuid(), "pending", True)
    assert "web" in box.daemon.handlers.services.services


def test_an_admin_who_is_not_root_is_refused_only_what_is_roots(make_box):
    """A member of system.admin_group may send every command but those for root or the
    daemon's user."""
    try:
        group = grp.getgrgid(STRANGER[2]).gr_name
    except KeyError:
        pytest.skip(f"no group {STRANGER[2]} to make an admin group of")
    box = make_box(config=f'[system]\nadmin_group = "{group}"\n')
    refused = refused_to(box, STRANGER)
    assert refused == {n for n, s in protocol.COMMANDS.items() if s.caller == protocol.ROOT}


if __name__ == "__main__":  # rewrite the docs' table
    DOCS.write_text(docs_with_table(DOCS.read_text()))
