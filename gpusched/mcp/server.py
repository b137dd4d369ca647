"""The server: its tools and resources, the watch that tells listening clients of a job's changes, and its transports."""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated

from gpusched import __version__
from gpusched.client.connection import Client
from gpusched.core.errors import GpuschedError
from gpusched.mcp import calls
from gpusched.mcp.tools import add_tools

QUEUE_URI = "gpusched://queue"
GPUS_URI = "gpusched://gpus"
JOB_URI = "gpusched://jobs/{job_id}"
LOG_URI = "gpusched://jobs/{job_id}/log"
_JOB_URI = re.compile(r"gpusched://jobs/([0-9_]+)(/log)?$")
# How often the watch asks the daemon about the jobs and the queue clients listen to.
POLL_S = 0.5

INSTRUCTIONS = (
    "gpusched schedules jobs on this machine's GPUs. You act as the user who runs this "
    "server: the daemon allows you what it allows them. Use preview_submit before submit; "
    "why_pending says why a job waits."
)


def _json(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True)


class Watch:
    """What clients listen to (subscriptions/listen, or resources/subscribe before MCP
    2026-07-28): jobs, and the queue. Each is read when a client starts listening, then
    every POLL_S; a change is published as ResourceUpdated for its URIs (a job's and its
    log's), and sent to the sessions subscribed to them."""

    def __init__(self, bus: InMemorySubscriptionBus):
        self.bus = bus
        self.jobs: dict[str, str] = {}  # job id -> its last state seen
        self.queue: str | None = None  # the queue as last seen, once a client listens to it
        self.sessions: dict[str, set[Any]] = {}  # URI -> the sessions subscribed to it

    def add(self, uris: Sequence[str]) -> None:
        """Start watching these URIs (in a thread: it asks the daemon)."""
        client = Client()
        for uri in uris:
            match = _JOB_URI.match(uri)
            if match and match[1] not in self.jobs:
                self.jobs[match[1]] = _state(client, match[1])
            elif uri == QUEUE_URI and self.queue is None:
                self.queue = _queue(client)

    def changes(self) -> list[str]:
        """The URIs whose resource changed since the last look; a job that has ended
        is watched no more (in a thread)."""
        client, changed = Client(), []
        for job_id, last in list(self.jobs.items()):
            now = _state(client, job_id)
            if now != last:
                changed += [f"gpusched://jobs/{job_id}", f"gpusched://jobs/{job_id}/log"]
                self.jobs[job_id] = now
            if now not in ("pending", "running"):
                del self.jobs[job_id]
        if self.queue is not None and (now_queue := _queue(client)) != self.queue:
            self.queue = now_queue
            changed.append(QUEUE_URI)
        return changed

    async def run(self) -> None:
        while True:
            await anyio.sleep(POLL_S)
            if not self.jobs and self.queue is None:
                continue
            try:
                changed = await anyio.to_thread.run_sync(self.changes)
            except GpuschedError:  # the daemon away for a moment: look again later
                continue
            for uri in changed:
                await self.bus.publish(ResourceUpdated(uri=uri))
                for session in list(self.sessions.get(uri, ())):
                    try:
                        await session.send_resource_updated(uri)
                    except Exception:  # that client has gone: tell it no more
                        self.sessions[uri].discard(session)

    async def subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        """resources/subscribe, as clients before MCP 2026-07-28 ask."""
        await anyio.to_thread.run_sync(self.add, [params.uri])
        self.sessions.setdefault(params.uri, set()).add(ctx.session)
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: Any, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        self.sessions.get(params.uri, set()).discard(ctx.session)
        return types.EmptyResult()

    async def middleware(self, ctx: Any, call_next: Any) -> Any:
        """Sees each request first: a listen's URIs are watched before it is answered."""
        if ctx.method == "subscriptions/listen" and isinstance(ctx.params, Mapping):
            notifications = ctx.params.get("notifications") or {}
            uris = notifications.get("resourceSubscriptions") or []
            await anyio.to_thread.run_sync(self.add, [u for u in uris if isinstance(u, str)])
        return await call_next(ctx)


def _state(client: Client, job_id: str) -> str:
    try:
        state: str = calls.show_job(client, {"job_id": job_id})["state"]
    except GpuschedError:
        return "unknown"  # removed, or never was: a later show says the same
    return state


def _queue(client: Client) -> str:
    jobs = client.call_paged("list")["jobs"]
    return _json([(job["id"], job["state"]) for job in jobs])


def _read(call: Any, **args: Any) -> Any:
    """A resource's content: a call's answer as JSON."""
    try:
        return _json(call(Client(), args))
    except GpuschedError as exc:
        raise ResourceError(exc.message) from None


def build(cli_tables: Mapping[str, Sequence[Any]], allow_mutations: bool = True) -> MCPServer:
    """The server, its tools' parameters read from the CLI's option tables (cli/ passes
    them in: see cli/commands/mcp_cmds.py)."""
    bus = InMemorySubscriptionBus()
    watch = Watch(bus)

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch.run)
            yield {}
            tasks.cancel_scope.cancel()

    server: MCPServer = MCPServer(
        "gpusched",
        version=__version__,
        instructions=INSTRUCTIONS,
        subscriptions=bus,
        lifespan=lifespan,
        middleware=[watch.middleware],
        log_level="WARNING",  # stderr is the assistant's log: only what goes wrong
    )
    add_tools(server, cli_tables, allow_mutations)
    # The SDK's MCPServer serves only the newer subscriptions/listen itself.
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler(
        "resources/subscribe", types.SubscribeRequestParams, watch.subscribe
    )
    lowlevel.add_request_handler(
        "resources/unsubscribe", types.UnsubscribeRequestParams, watch.unsubscribe
    )

    @server.resource(QUEUE_URI, name="queue", mime_type="application/json")
    def queue() -> str:
        """The pending and running jobs, as `gpusched ls --json`."""
        return str(_read(calls.list_jobs))

    @server.resource(GPUS_URI, name="gpus", mime_type="application/json")
    def gpus() -> str:
        """The GPUs and their jobs, as `gpusched gpus --json`."""
        return str(_read(calls.gpu_status))

    @server.resource(JOB_URI, name="job", mime_type="application/json")
    def job(job_id: str) -> str:
        """One job, as `gpusched show --json`."""
        return str(_read(calls.show_job, job_id=job_id))

    @server.resource(LOG_URI, name="log", mime_type="text/plain")
    def log(job_id: str) -> str:
        """The end of one job's output, as `gpusched logs`."""
        try:
            lines = calls.read_log(Client(), {"job_id": job_id, "lines": 1000})["lines"]
        except GpuschedError as exc:
            raise ResourceError(exc.message) from None
        return "".join(line + "\n" for line in lines)

    return server


def serve(server: MCPServer, http_port: int | None = None, token_file: str = "") -> None:
    """Speak MCP on standard input and output, or streamable HTTP on 127.0.0.1:http_port.

    Over HTTP every request must carry a bearer token, new at each start and written to
    token_file (mode 0600): on a shared machine any user reaches 127.0.0.1, and the server
    acts as the user who runs it."""
    if http_port is None:
        server.run("stdio")
        return
    import uvicorn  # noqa: PLC0415 - the SDK's own dependency, for --http only

    token = secrets.token_urlsafe(32)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    sys.stderr.write(
        f"gpusched mcp: http://127.0.0.1:{http_port}/mcp; each request needs the header "
        f"'Authorization: Bearer TOKEN', TOKEN as in {token_file}\n"
    )
    app = bearer_only(server.streamable_http_app(host="127.0.0.1"), token)
    uvicorn.run(app, host="127.0.0.1", port=http_port, log_level="warning")


def bearer_only(app: Any, token: str) -> Any:
    """The ASGI app, answering 401 to an HTTP request without `Authorization: Bearer token`."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"text/plain"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b"a bearer token is needed\n"})
                return
        await app(scope, receive, send)

    return guarded
