"""The daemon's answer to each command in the protocol table; runs on the loop thread only.

The table (client/protocol.py COMMANDS) declares each command; here each is bound to its
handler by name, every command the loop answers and no other (checked at start).

A handler returns its result, or a Waiter (a `wait` the loop answers later), or raises
GpuschedError; the reply around either is built by the socket server (server.reply).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpusched.client.protocol import COMMANDS
from gpusched.core.spec import limits
from gpusched.daemon.jobs import gpumemory, retention
from gpusched.daemon.observe.usage import usage_request
from gpusched.daemon.requests.changes import Changes
from gpusched.daemon.requests.queries import Queries
from gpusched.daemon.requests.request import Request, Waiter
from gpusched.daemon.requests.reserving import Reserving
from gpusched.daemon.requests.submits import Submits
from gpusched.daemon.services.replicas import ServiceManager
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc.seam import ProcessSeam

# The commands the loop answers: all but those the socket server answers itself.
LOOP_COMMANDS = frozenset(name for name, spec in COMMANDS.items() if not spec.on_server)


class Handlers:
    def __init__(self, state: DaemonState, setup: Setup, seam: ProcessSeam):
        queries, changes, submits = (
            Queries(state, setup),
            Changes(state, setup, seam),
            Submits(state, setup),
        )
        self._limits = limits.from_settings(setup.settings)
        reserving = Reserving(state, setup)
        self.services = ServiceManager(state, setup, submits, changes)
        self._table: dict[str, Callable[[Request], Any]] = {
            "status": queries.status,
            "list": queries.list,
            "show": queries.show,
            "wait": queries.wait,
            "gpus": queries.gpus,
            "snapshot": queries.snapshot,
            "logs": queries.logs,
            "attach": queries.attach,
            "env": queries.env,
            "cancel": changes.cancel,
            "hold": changes.hold,
            "release": changes.release,
            "update": changes.update,
            "drain": changes.drain,
            "resume": changes.resume,
            "stop": changes.stop,
            "requeue": changes.requeue,
            "preempt": changes.preempt,
            "submit": submits.submit,
            "resubmit": submits.resubmit,
            "gc": lambda req: retention.gc_request(
                state, setup, req.creds, bool(req.args.get("dry_run"))
            ),
            "usage": lambda req: usage_request(state, setup, req),
            "history": lambda req: gpumemory.history_request(state, setup, req.args, req.creds[1]),
            "service": self.services.request,
            "reserve": lambda req: reserving.create(req.args, req.creds),
            "reservations": lambda req: reserving.list(req.args),
            "unreserve": lambda req: reserving.delete(req.args["name"], req.creds),
        }
        if set(self._table) != LOOP_COMMANDS:
            raise AssertionError(
                "the handlers and the protocol table disagree on "
                f"{sorted(set(self._table) ^ LOOP_COMMANDS)}"
            )

    @staticmethod
    def may_change(requests: list[Request]) -> bool:
        """Whether any of these requests may have changed what a scheduling pass reads."""
        return any(not COMMANDS[request.name].read_only for request in requests)

    def handle(self, request: Request) -> Any | Waiter:
        """The request's result (each request commits before it returns), a Waiter, or
        a Batched request (daemon/requests/batches.py) the loop goes on with;
        raises GpuschedError for a request refused."""
        limits.check_ids(request.args.get("ids"), self._limits)
        return self._table[request.name](request)
