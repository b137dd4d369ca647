"""The one table of protocol commands (client/protocol.py COMMANDS): the daemon binds a
handler to each command its loop answers, refuses callers as the table declares, and
docs/protocol.md shows the table as it is (.ci/regenerate rewrites the docs' copy)."""

from __future__ import annotations

import os
from pathlib import Path

from gpusched.client import protocol
from gpusched.core.errors import PermissionDenied
from gpusched.core.services import Service
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
        "env": {"id": job_id},
        "resubmit": {"id": job_id},
        "gc": {"dry_run": True},
        "usage": {},
        "history": {"key": "true"},
        "service": {"action": "delete", "name": "web"},
    }


def test_another_user_is_refused_exactly_the_commands_the_table_reserves(box):
    """Who may send each command, as the table declares it, is what the daemon enforces:
    a user who is not an admin is refused each command that is not for anyone, on the
    daemon's user's job or service, and no command that is."""
    job_id = box.submit("--hold", "--", "true")
    before = box.show(job_id)
    me = os.getuid()
    box.daemon.handlers.services.services["web"] = Service(
        name="web", uid=me, user="owner", job={"command": ["true"]}, env={}, cwd="/"
    )
    requests = stranger_requests(job_id)
    assert set(requests) == {n for n, s in protocol.COMMANDS.items() if not s.on_server}
    refused = set()
    for name, args in requests.items():
        protocol.check_request({"cmd": name, "args": args})
        call = Call(Request(name, args, STRANGER))  # not box.send: `service` takes a name
        box.daemon.step([call])
        if isinstance(call.error, PermissionDenied):
            refused.add(name)
        else:
            assert call.error is None, (name, call.error)
    reserved = {n for n, s in protocol.COMMANDS.items() if s.caller != protocol.ANYONE}
    assert refused == reserved
    assert box.show(job_id) == before  # nothing of the owner's was changed


if __name__ == "__main__":  # rewrite the docs' table
    DOCS.write_text(docs_with_table(DOCS.read_text()))
