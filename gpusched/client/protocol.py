"""The one table of the commands the daemon answers, and the checks of a request's arguments.

Each command's entry says what it takes, whether it only looks, who may send it and what
answers it; the daemon and docs/protocol.md read it (the CLI needs only wire.py).

The frames themselves (length-prefixed JSON over a Unix socket) are wire.py's, named here
too for the daemon and the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpusched.client.wire import MAX_FRAME_BYTES, encode, peer_credentials, receive, send  # noqa: F401
from gpusched.core.errors import ProtocolError
from gpusched.core.sched.gpupromise import ACTIONS as GPU_OVER_ACTIONS
from gpusched.core.spec import begintime, syntax, values

READ_TIMEOUT_S = 10.0


# Who may send a command (docs/protocol.md). The daemon's handlers refuse everyone else
# (daemon/requests/authz.py), each with its own words; tests/test_command_table.py checks
# that they refuse exactly as declared here.
ANYONE = "anyone"
OWNER = "owner"  # of every job (or service) it names, or an admin
ADMIN = "admin"  # root, the daemon's user, or a member of system.admin_group
ROOT = "root"  # root or the daemon's user only


class Command:
    """One protocol command: the argument names it requires and those it may take
    (frozensets, each checked by ARGUMENTS), whether it only looks (read_only: no
    scheduling pass follows it), who may send it (caller), and whether the socket server
    answers it itself on the connection's thread (on_server), not the daemon's loop."""

    __slots__ = ("required", "optional", "read_only", "caller", "on_server")

    def __init__(
        self,
        required: frozenset[str],
        optional: frozenset[str],
        read_only: bool,
        caller: str,
        on_server: bool,
    ):
        self.required, self.optional = required, optional
        self.read_only, self.caller, self.on_server = read_only, caller, on_server


def _cmd(
    required: str = "",
    optional: str = "",
    *,
    read_only: bool = False,
    caller: str = ANYONE,
    on_server: bool = False,
) -> Command:
    return Command(
        frozenset(required.split()), frozenset(optional.split()), read_only, caller, on_server
    )


# Every request the daemon answers: the one table of the protocol. Anything else is
# refused before a handler sees it. The daemon answers each on its loop with the handler
# of the same name (daemon/requests/handlers.py), but for those on_server.
# read_only: the request changes nothing a scheduling pass depends on, so it sets none
# off (with 100,000 pending a pass is the longest part of a turn, and `top` asks every
# second). Every other request, refused or not, is followed by a pass.
COMMANDS: dict[str, Command] = {
    # A liveness check must not wait behind the loop.
    "ping": _cmd(read_only=True, on_server=True),
    "status": _cmd(read_only=True),
    # "stream": "lines" (client/streamedrequest.py): the commands follow in parts on the same
    # connection, each line the last word of jobs[0]'s command (`submit --from-file`).
    # dry_run: nothing is queued; the reply says where the first job would start now, or
    # why it would wait (daemon/requests/preview.py).
    "submit": _cmd("jobs", "env cwd cluster stream dry_run"),
    # Filters (lists of user names, states, name patterns) keep the reply small.
    # Replies that grow with the queue come in pages (daemon/requests/pagedreplies.py): "after" is where
    # the page starts (a job id for list, a position among the ids named for show and
    # wait), "page_bytes" about how large it may be; each reply says where the next starts.
    # "last" keeps only the N matching jobs with the highest ids (still in id order).
    # "pending_rows" (a plain `ls`): only the first N pending jobs, the rest counted
    # (daemon/requests/lsqueue.py). "stream": "pages": every page on this one connection (client/pagedreplies.py).
    # "start": each pending job's forecast start too (`ls --start`, core/sched/forecast.py).
    "list": _cmd(
        "", "all users states names last after page_bytes pending_rows stream start", read_only=True
    ),
    "show": _cmd("ids", "after page_bytes", read_only=True),
    "cancel": _cmd("ids", caller=OWNER),
    "hold": _cmd("ids", caller=OWNER),
    "release": _cmd("ids", caller=OWNER),
    # A priority over scheduling.max_user_priority is an admin's to give.
    # begin_time: --begin as epoch seconds (the client reads TIME: core/spec/begintime.py).
    # gpu_mem_over: report, stop or requeue (daemon/jobs/gpuover.py).
    "update": _cmd("ids", "priority begin_time gpu_mem_over", caller=OWNER),
    # A job back in the queue under its id: stopped now (requeue) or after its
    # checkpoint signal and grace (preempt); an ended one queued again (requeue).
    "requeue": _cmd("ids", caller=OWNER),
    "preempt": _cmd("ids", caller=OWNER),
    "drain": _cmd(caller=ADMIN),
    "resume": _cmd(caller=ADMIN),
    # keep_waiting: also on a job that can never start (else the reply names it at once).
    "wait": _cmd("ids", "timeout_s after page_bytes keep_waiting", read_only=True),
    "gpus": _cmd(read_only=True),
    # Everything `gpusched top` draws in one frame: daemon, GPUs, reservations, jobs.
    # "pending_version": the last reply's; the pending jobs come again only if it moved.
    "snapshot": _cmd("", "lean pending_version", read_only=True),
    "stop": _cmd(caller=ROOT),
    # A job's log paths (the client reads the files) and the environment it was
    # submitted with.
    "logs": _cmd("id", read_only=True, caller=OWNER),
    # Where a --pty job's terminal is served; the client connects to the job's shim itself.
    "attach": _cmd("id", read_only=True, caller=OWNER),
    "env": _cmd("id", read_only=True, caller=OWNER),
    # A job queued again as a new one, from the spec the daemon keeps: its environment
    # never travels to the client, which may not see it.
    "resubmit": _cmd("id", "changes", caller=OWNER),
    # Finished jobs past [jobs] keep_finished(_count) removed now, or only counted.
    "gc": _cmd("", "dry_run", caller=ADMIN),
    # GPU time, memory, ends and waits per user or name, over since_s seconds (none: all).
    "usage": _cmd("", "since_s by", read_only=True),
    # The caller's newest finished runs of a job key (--name or normalized command) with
    # their GPU memory peaks, and what --gpu-mem auto would ask for now.
    "history": _cmd("key", "last", read_only=True),
    # Inference services (docs/services.md): action is create, list, show, scale, update
    # or delete; spec carries a create's or an update's definition. Anyone may list,
    # show and create; scale, update and delete are the service's owner's (or an admin's).
    "service": _cmd("action", "name spec replicas", caller=OWNER),
    # GPU reservations (docs/calendar.md): made by an admin for anyone, or by a user for
    # themself within [reservations] user_max_gpu_hours; deleted by their maker or an admin;
    # listed to anyone (names: those only). Times are epoch seconds.
    "reserve": _cmd("gpus end_time", "users start_time name", caller=OWNER),
    "reservations": _cmd("", "names", read_only=True),
    "unreserve": _cmd("name", caller=OWNER),
}


SERVICE_ACTIONS = ("create", "list", "show", "scale", "update", "delete")

# The job fields a `snapshot` with lean=true carries: what `gpusched top` draws. A full
# job row is several times larger, and top asks every second for every queued job.
LEAN_JOB_FIELDS = (
    "id",
    "name",
    "user",
    "uid",
    "state",
    "gpus",
    "gpu_indices",
    "gpus_requested",
    "gpu_mem_bytes",
    "priority",
    "command",
    "submitted_at",
    "started_at",
    "pending_reason",
    "time_limit_s",
    "progress",
    "cancelling",
    "cluster",  # cluster: only on cluster jobs
    "preempting",
    "gpu_idle_since",
    "gpu_mem_over_by",
)


def _job_ids(value: Any) -> list[tuple[int, int | None]]:
    return values.list_of(value, "ids", syntax.parse_job_id, nonempty=True)


def _names(what: str) -> Callable[[Any], list[str]]:
    return lambda value: values.list_of(
        value, what, lambda v: values.text(v, f"each of {what}"), nonempty=True
    )


# How each argument's value is checked before a handler sees it: its kind and bounds
# (what it means, a job id that exists, is for the handler). A null optional argument
# is one not given.
ARGUMENTS: dict[str, Callable[[Any], Any]] = {
    "jobs": lambda v: values.list_of(
        v, "jobs", lambda job: values.mapping(job, "each job"), nonempty=True
    ),
    "env": values.environment,
    "cwd": lambda v: values.text(v, "the working directory (cwd)"),
    "all": lambda v: values.flag(v, "all"),
    "lean": lambda v: values.flag(v, "lean"),
    "keep_waiting": lambda v: values.flag(v, "keep_waiting"),
    "pending_version": lambda v: values.text(v, "pending_version"),
    "dry_run": lambda v: values.flag(v, "dry_run"),
    # Where a page starts, and about how large it may be (daemon/requests/pagedreplies.py sets the bounds).
    "after": lambda v: values.whole_number(v, "after", 0, 2**63 - 1),
    "page_bytes": lambda v: values.whole_number(v, "page_bytes", 1, 2**31),
    "last": lambda v: values.whole_number(v, "last", 1, 2**63 - 1),
    "pending_rows": lambda v: values.whole_number(v, "pending_rows", 0, 2**31),
    "start": lambda v: values.flag(v, "start"),
    "users": _names("users"),
    "states": _names("states"),
    "names": _names("names"),
    "ids": _job_ids,
    "id": syntax.parse_job_id,
    "priority": lambda v: values.whole_number(
        v, "priority", -syntax.MAX_PRIORITY, syntax.MAX_PRIORITY
    ),
    "begin_time": lambda v: values.number(v, "begin_time", 0, begintime.MAX_BEGIN_TIME),
    "gpus": lambda v: values.list_of(
        v, "gpus", lambda i: values.whole_number(i, "each of gpus", 0, 1023), nonempty=True
    ),
    "start_time": lambda v: values.number(v, "start_time", 0, begintime.MAX_BEGIN_TIME),
    "end_time": lambda v: values.number(v, "end_time", 0, begintime.MAX_BEGIN_TIME),
    "gpu_mem_over": lambda v: values.choice(v, "gpu-mem-over", GPU_OVER_ACTIONS),
    "timeout_s": lambda v: values.number(v, "timeout_s", 0, 10**9),
    "changes": lambda v: values.mapping(v, "changes"),
    "since_s": lambda v: values.number(v, "since_s", 0, 10**11),
    "by": lambda v: values.text(v, "by"),
    "cluster": lambda v: values.text(v, "cluster"),
    "key": lambda v: values.text(v, "key"),
    "action": lambda v: values.choice(v, "action", SERVICE_ACTIONS),
    "name": lambda v: values.text(v, "name"),
    "spec": lambda v: values.mapping(v, "spec"),
    "replicas": lambda v: values.whole_number(v, "replicas", 0, 1000),
    # "lines": a request whose items follow it (client/streamedrequest.py); "pages": a reply sent
    # page after page (client/pagedreplies.py). Which command takes which: daemon/requests/streamedrequest.py.
    "stream": lambda v: values.choice(v, "stream", ("lines", "pages")),
}


REQUEST_KEYS = frozenset(("cmd", "args"))  # a request's own: anything else is refused


def check_request(message: Any) -> tuple[str, dict[str, Any]]:
    """A request's command and arguments, or ProtocolError naming what is wrong (or the
    UsageError of an argument's reader: a value of the wrong kind)."""
    if not isinstance(message, dict) or not isinstance(message.get("cmd"), str):
        raise ProtocolError("a request must be a JSON object with a 'cmd' string")
    name, args = message["cmd"], message.get("args", {})
    spec = COMMANDS.get(name)
    if spec is None:
        raise ProtocolError(
            f"unknown command {values.shown(name)}; known: {', '.join(sorted(COMMANDS))}"
        )
    if len(message) > 2 or (len(message) == 2 and "args" not in message):
        unknown = sorted(message.keys() - REQUEST_KEYS)
        raise ProtocolError(
            f"a request has only the keys 'cmd' and 'args', not {values.shown(unknown[0])}"
        )
    if not isinstance(args, dict):
        raise ProtocolError(f"'{name}': args must be a JSON object")
    missing = spec.required - args.keys()
    extra = args.keys() - spec.required - spec.optional
    if missing or extra:
        raise ProtocolError(
            f"'{name}': missing {sorted(missing)}, unexpected {values.shown(sorted(extra))}"
        )
    for key, value in args.items():
        if value is not None or key in spec.required:
            ARGUMENTS[key](value)
    return name, args
