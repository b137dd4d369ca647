"""Paged replies, the client's side: a paged request answered page after page on one
connection (daemon/requests/pagedreplies.py cuts the pages).

A request with "stream": "pages" (only `list` takes it) is answered with one frame per page,
each an ordinary reply whose result says where the next page starts ("next"); the last
has "next": null, and an error ends the stream as its own frame. The daemon's connection
thread asks the loop for each page in turn (server.py), so the loop answers everyone
else between pages and holds one page at a time; the client reads one page at a time and
prints it before it reads the next. Memory stays flat on both sides, however many rows.
See docs/protocol.md.
"""

from __future__ import annotations

from gpusched.client import wire
from gpusched.core.errors import ProtocolError

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from gpusched.client.connection import Client

# A stream's pages wait in the socket for a reader busy printing (`ls --all | less`):
# longer than a request's usual send timeout, but not for ever.
SEND_TIMEOUT_S = 300.0
PAGES = "pages"  # the "stream" argument's value for a reply in pages


def next_request(message: Any, answer: dict[str, Any]) -> dict[str, Any] | None:
    """The daemon's side: the request for the page after `answer` in a stream, or None
    when the stream is over (not a stream, an error, or the last page)."""
    args = message.get("args") if isinstance(message, dict) else None
    if not isinstance(args, dict) or args.get("stream") != PAGES or not answer.get("ok"):
        return None
    after = (answer.get("result") or {}).get("next")
    return None if after is None else {**message, "args": {**args, "after": after}}


def pages(
    client: Client, cmd: str, timeout_s: float | None = 60.0, **args: Any
) -> Iterator[dict[str, Any]]:
    """The client's side: each page's result of a streamed request, as it arrives. A daemon
    too old to stream refuses the argument: then each page is asked for on its own."""
    sock = client.connect()
    try:
        sock.settimeout(timeout_s)
        try:
            wire.send(sock, {"cmd": cmd, "args": {**args, "stream": PAGES}}, allow_nan=False)
            first = client.result_of(_receive(client, sock))
        except ProtocolError as exc:
            if "stream" not in exc.message:
                raise
            yield from client.each_page(cmd, timeout_s, args)
            return
        yield first
        result = first
        while result.get("next") is not None:
            result = client.result_of(_receive(client, sock))
            yield result
    finally:
        sock.close()


def _receive(client: Client, sock: Any) -> dict[str, Any] | None:
    try:
        return wire.receive(sock)
    except OSError as exc:  # TimeoutError too
        client.lost(exc)
