"""The tools: each one's parameters (from the CLI's option tables), its annotations, and its call."""

from __future__ import annotations

import inspect
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import (
    AcceptedElicitation,
    Context,
    Elicit,
    ElicitationResult,
    MCPServer,
    Resolve,
)
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from gpusched.client.connection import Client
from gpusched.client.submit.options import RESUBMIT, SUBMIT
from gpusched.core.errors import GpuschedError
from gpusched.mcp import calls
from gpusched.mcp.schemas import ARGUMENTS, tool_function

# What a tool does to the queue: looks, changes it (a job added, held, released), or
# stops or removes work (cancel, requeue: a running job is killed).
LOOKS, CHANGES, DESTROYS = "looks", "changes", "destroys"

# Options that shape what the CLI prints, not what it asks: a tool answers JSON.
PRINTING = (
    *("as_json", "json", "expand", "fields", "noheader", "follow", "notify", "from_file"),
    *("query", "fmt", "topology"),  # `gpus`: nvidia-smi's shapes
)

# read_log's own option, shaped as the tables' rows: how much of the log's end to give.
LOG_LINES = (
    "lines",
    (),
    "int",
    100,
    "How many of the log's last lines to give (about 256 KiB at most).",
)


class Confirmation(BaseModel):
    confirm: bool = Field(description="Yes: go ahead. No: do nothing.")


# name -> (what it does, the CLI command whose options it takes, its argument kind
# (schemas.ARGUMENTS; "" none), its own rows after the table's, what it does to the
# queue, the call). The CLI's tables reach here as an argument (cli/ passes them in).
TOOLS: dict[str, tuple[str, str, str, tuple[Any, ...], str, Callable[..., dict[str, Any]]]] = {
    "list_jobs": (
        "List jobs, as `gpusched ls` does (its filters).",
        "ls",
        "",
        (),
        LOOKS,
        calls.list_jobs,
    ),
    "show_job": (
        "Everything about one job, as `gpusched show`.",
        "show",
        "one",
        (),
        LOOKS,
        calls.show_job,
    ),
    "read_log": (
        "The last lines of a job's output (or its errors), as `gpusched logs`.",
        "logs",
        "one",
        (LOG_LINES,),
        LOOKS,
        calls.read_log,
    ),
    "gpu_status": (
        "The GPUs, their memory, use and jobs, as `gpusched gpus`.",
        "gpus",
        "",
        (),
        LOOKS,
        calls.gpu_status,
    ),
    "why_pending": (
        "Why a job waits, and when it may start where the daemon forecasts it.",
        "show",
        "one",
        (),
        LOOKS,
        calls.why_pending,
    ),
    "preview_submit": (
        "What `gpusched submit` would do now, without queuing anything: the GPUs the job "
        "would start on, or why it would wait (as if it were next in line; pending_ahead "
        "counts the jobs that may go first).",
        "submit",
        "command",
        (),
        LOOKS,
        calls.preview_submit,
    ),
    "usage": (
        "GPU time and memory per user or job name, as `gpusched usage`.",
        "usage",
        "",
        (),
        LOOKS,
        calls.usage,
    ),
    "submit": (
        "Queue a job, as `gpusched submit`; with wait, wait for it and give its exit status.",
        "submit",
        "command",
        (),
        CHANGES,
        calls.submit,
    ),
    "resubmit": (
        "Queue a job again as a new one, with these options changed, as `gpusched resubmit`.",
        "resubmit",
        "one",
        (),
        CHANGES,
        calls.resubmit,
    ),
    "cancel": (
        "Cancel jobs, as `gpusched cancel` (running ones are stopped).",
        "cancel",
        "many",
        (),
        DESTROYS,
        calls.change("cancel"),
    ),
    "hold": (
        "Hold pending jobs: they start only after release.",
        "hold",
        "many",
        (),
        CHANGES,
        calls.change("hold"),
    ),
    "release": ("Release held jobs.", "release", "many", (), CHANGES, calls.change("release")),
    "requeue": (
        "Put jobs back in the queue under their ids (a running one is stopped first).",
        "requeue",
        "many",
        (),
        DESTROYS,
        calls.change("requeue"),
    ),
}


def option_tables(cli_tables: Mapping[str, Sequence[Any]]) -> dict[str, Sequence[Any]]:
    """Each CLI command's option rows: submit's and resubmit's here, the others' from cli/."""
    return {**cli_tables, "submit": SUBMIT, "resubmit": RESUBMIT}


def rows_of(name: str, tables: Mapping[str, Sequence[Any]]) -> list[Any]:
    """A tool's parameters as rows: its argument's, its command's options but those that
    only shape printing (and submit's wait, for a preview), then its own."""
    _, command, argument, own, _, _ = TOOLS[name]
    leave = PRINTING + (("wait", "hold") if name == "preview_submit" else ())
    rows = [row for row in tables[command] if row[0] not in leave]
    return ([ARGUMENTS[argument]] if argument else []) + rows + list(own)


def hints(name: str) -> ToolAnnotations:
    kind = TOOLS[name][4]
    return ToolAnnotations(
        read_only_hint=kind == LOOKS,
        destructive_hint=kind == DESTROYS,
        idempotent_hint=kind == LOOKS or name in ("hold", "release", "cancel"),
        open_world_hint=False,
    )


def add_tools(
    server: MCPServer, cli_tables: Mapping[str, Sequence[Any]], allow_mutations: bool
) -> None:
    """Every tool, or with allow_mutations false only those that look."""
    tables = option_tables(cli_tables)
    for name, (doc, _, _, _, kind, call) in TOOLS.items():
        if kind != LOOKS and not allow_mutations:
            continue
        asks = CONFIRMED.get(name)
        resolved = (
            [
                inspect.Parameter(
                    "confirmation",
                    inspect.Parameter.KEYWORD_ONLY,
                    annotation=Annotated[ElicitationResult[Confirmation], Resolve(asks)],
                )
            ]
            if asks
            else []
        )
        server.add_tool(
            tool_function(name, doc, _body(name, call), rows_of(name, tables), resolved),
            name=name,
            description=doc,
            annotations=hints(name),
        )


def _body(name: str, call: Callable[..., dict[str, Any]]) -> Any:
    async def body(ctx: Context, arguments: dict[str, Any]) -> dict[str, Any]:
        confirmation = arguments.pop("confirmation", None)
        if confirmation is not None and not (
            isinstance(confirmation, AcceptedElicitation) and confirmation.data.confirm
        ):
            raise ToolError(f"the user did not confirm the {name}; nothing was done")
        try:
            return await anyio.to_thread.run_sync(call, Client(), arguments)
        except GpuschedError as exc:
            raise ToolError(exc.message) from None

    return body


def _ask(ctx: Context, question: str) -> Any:
    """The user's answer, asked through the client (MCP elicitation); yes where the
    client cannot ask (it declared no elicitation)."""
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return Confirmation(confirm=True)
    return Elicit(f"gpusched: {question}", Confirmation)


def _ask_submit(ctx: Context, command: list[str]) -> Any:
    return _ask(ctx, f"queue this job? {shlex.join(command)}")


def _ask_cancel(ctx: Context, job_ids: list[str]) -> Any:
    return _ask(ctx, f"cancel job(s) {', '.join(job_ids)}?")


# Tools that ask the user first, where the client can ask: the SDK runs the resolver
# before the tool (on the 2026-07-28 protocol, by a round trip of input_required).
CONFIRMED: dict[str, Callable[..., Any]] = {"submit": _ask_submit, "cancel": _ask_cancel}
