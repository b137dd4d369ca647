"""A streamed request's parts, read on its connection's thread (client/streamedrequest.py frames).

The items are read and checked as they arrive, before the loop sees anything: a bad one
refuses the whole request with its number, and a client that goes away or cancels before
the end leaves nothing behind. While the loop then does the request, the thread watches
the connection: a cancel (or a hang-up) is handed to the loop, which drops what it has
not yet committed (daemon/requests/batches.py).
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable
from typing import Any

from gpusched.client import protocol, wire
from gpusched.core.errors import GpuschedError, ProtocolError, UsageError
from gpusched.core.spec import limits as limits_mod
from gpusched.core.spec.values import is_text

# Requests that may stream, and the kind of item each takes ("stream": KIND).
STREAMS = {"submit": "lines"}
# All parts of one request together: a bound on what a client can make the daemon hold.
MAX_STREAM_BYTES = 512 * 2**20


class ClientGone(GpuschedError):
    """The client cancelled, or hung up, before its stream ended: nothing was done (the
    reply says so, if anyone still reads it)."""


def is_streamed(message: Any) -> bool:
    """Whether items follow the request (a reply in pages, "stream": "pages", is the
    socket server's business: client/pagedreplies.py)."""
    args = message.get("args") if isinstance(message, dict) else None
    return isinstance(args, dict) and args.get("stream") in STREAMS.values()


def check_kind(name: str, args: dict[str, Any]) -> None:
    kind = args.get("stream")
    if STREAMS.get(name) != kind:
        raise ProtocolError(
            f"'{name}' does not stream {kind!r}; streamed requests: "
            + ", ".join(f"{n} ({k})" for n, k in STREAMS.items())
        )


class LinesIn:
    """The lines of a streamed submit: each one the last word of a job's command (the
    template's command is the rest), checked against the daemon's limits."""

    def __init__(self, conn: socket.socket, max_depth: int | None, taken: Any = None):
        self.conn, self.max_depth = conn, max_depth
        self.taken = taken  # a part over framebudget.SMALL_BYTES holds the daemon's budget

    def read(self, prefix: list[str], limits: limits_mod.Limits) -> list[str]:
        """Every line, once the end arrives; UsageError for the first bad one (after
        the rest is read, so that the client is not cut off mid-send and hears why)."""
        lines: list[str] = []
        error: GpuschedError | None = None
        prefix_bytes = sum(limits_mod.text_bytes(a) for a in prefix if isinstance(a, str))
        total_bytes = 0
        while (part := self._next_part()) is not None:
            if error is not None:
                continue  # drained: the reply is the error
            total_bytes += sum(len(line) for line in part)
            try:
                for line in part:
                    lines.append(_checked(line, len(lines) + 1, prefix_bytes, limits))
                if len(lines) > limits.jobs or total_bytes > MAX_STREAM_BYTES:
                    raise UsageError(
                        f"the submit has over {len(lines):,} commands "
                        f"({total_bytes:,} bytes) so far, over the limit of "
                        f"{limits.jobs:,} (limits.jobs in the daemon's config); "
                        "split it, or ask the daemon's admin to raise limits.jobs"
                    )
            except GpuschedError as exc:
                error, lines = exc, []
        if error is not None:
            raise error
        if not lines:
            raise UsageError("the submit streamed no commands; give at least one")
        return lines

    def _next_part(self) -> list[Any] | None:
        try:
            message = wire.receive(self.conn, protocol.READ_TIMEOUT_S, self.max_depth, self.taken)
        except OSError as exc:  # it stalled (TimeoutError), or the connection broke
            raise ClientGone(
                f"the stream stopped before its end frame ({exc or 'timed out'}); "
                "nothing of the request was done"
            ) from None
        finally:
            if self.taken is not None:
                self.taken.release()  # decoded: the lines are counted as lines
        if message is None:
            raise ClientGone(
                "the connection closed before the stream's end frame; nothing "
                "of the request was done"
            )
        if message.get("cancel") is True:
            raise ClientGone(
                "the request was cancelled before all of it arrived; nothing of it was done"
            )
        if message.get("end") is True:
            return None
        part = message.get("part")
        if not isinstance(part, list):
            raise ProtocolError(
                'a streamed request\'s frames are {"part": [...]}, then {"end": true}'
            )
        return part

    def gone(self) -> bool:
        """Whether the client has cancelled or hung up while the loop works: a frame (or
        end of file) waiting on the connection says so; anything else it sends now is
        taken as a cancel too."""
        try:
            readable, _, _ = select.select([self.conn], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


def _checked(line: Any, number: int, prefix_bytes: int, limits: limits_mod.Limits) -> str:
    if not isinstance(line, str) or not is_text(line, os_text=True):
        raise UsageError(
            f"command {number} of the submit is not text without NUL characters; nothing was queued"
        )
    size = prefix_bytes + limits_mod.text_bytes(line)
    if size > limits.command_bytes:
        raise UsageError(
            f"command {number} of the submit is {size:,} bytes, over the limit "
            f"of {limits.command_bytes:,} (limits.command in the daemon's "
            "config); nothing was queued"
        )
    return line


def serve_stream(
    conn: socket.socket,
    name: str,
    args: dict[str, Any],
    max_depth: int | None,
    limits: limits_mod.Limits,
    dispatch: Callable[..., Any],
    taken: Any = None,
) -> Any:
    """Read the stream of a checked request and hand it to the loop with its lines."""
    check_kind(name, args)
    specs = args.get("jobs")
    if not isinstance(specs, list) or len(specs) != 1 or not isinstance(specs[0], dict):
        raise UsageError("a streamed submit has one job spec, the lines' template")
    stream = LinesIn(conn, max_depth, taken)
    prefix = specs[0].get("command")
    lines = stream.read(prefix if isinstance(prefix, list) else [], limits)
    return dispatch(name, {**args, "lines": lines}, gone=stream.gone)
