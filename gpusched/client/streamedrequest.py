"""Streamed requests, the client's side: a request's items sent in parts on its own
connection, so that no frame has to hold them all (a 100,000-line `submit --from-file`;
daemon/requests/streamedrequest.py reads them).

The framing (docs/protocol.md): the request frame names the stream in its args
("stream": KIND); each frame after it is a part, {"part": [item, ...]}, of at most
PART_BYTES; the last is {"end": true}. Nothing is done before the end arrives. The daemon
then answers once, with the usual reply; until that reply the client may send
{"cancel": true}, and the reply says what became of the request. Replies that stream
come as pages instead (client/pagedreplies.py).

Kept light: the submit fast path imports this module (wire's C-backed JSON, no json).
"""

from __future__ import annotations

from gpusched.client import wire
from gpusched.core.errors import ProtocolError

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any

PART_BYTES = 1 << 20  # a part's body: far under wire.MAX_FRAME_BYTES, quick to decode
END = {"end": True}
CANCEL = {"cancel": True}
# After a Ctrl-C, how long to wait for the daemon to say what became of the request (a
# second Ctrl-C stops waiting at once).
CANCEL_ANSWER_S = 30.0
# Each send and the wait for the reply: the daemon answers once every item is stored,
# seconds for 100,000 jobs on a busy machine.
STREAM_TIMEOUT_S = 600.0


def part_frames(items: Iterable[Any]) -> Iterator[bytes]:
    """Frames {"part": [...]} holding the items (JSON values: a sweep's lines)
    in order, each at most PART_BYTES; each item is encoded once, by the C encoder. A
    None item sends what there is now, if only an empty part: the source is slow, and
    the peer waits for each part for a while only."""
    encode, size = wire.dumps, 0
    chunk: list[str] = []
    for item in items:
        if item is None:
            yield _part(chunk)
            size, chunk = 0, []
            continue
        text = encode(item, False)
        if chunk and size + len(text) + 1 > PART_BYTES:
            yield _part(chunk)
            size, chunk = 0, []
        chunk.append(text)
        size += len(text) + 1
    if chunk:
        yield _part(chunk)


def _part(encoded: list[str]) -> bytes:
    body = ('{"part":[' + ",".join(encoded) + "]}").encode()
    return len(body).to_bytes(wire.HEADER_BYTES, "big") + body


class Interrupted(Exception):
    """A Ctrl-C during a streamed request: reply is the daemon's answer to the cancel
    (its envelope), or None when nothing was sent yet or no answer came."""

    def __init__(self, reply: dict[str, Any] | None, sent_all: bool):
        super().__init__("interrupted")
        self.reply, self.sent_all = reply, sent_all


def call_streamed(
    client: Any, cmd: str, kind: str, items: Iterable[str | None], **args: Any
) -> Any:
    """Send a streamed request and return its result, as Client.call does. Ctrl-C
    becomes Interrupted; an error raised by `items` (a bad line) cancels the request."""
    try:
        sock = client.connect()
    except KeyboardInterrupt:
        raise Interrupted(None, sent_all=False) from None
    sent_all = False
    try:
        try:
            sock.settimeout(STREAM_TIMEOUT_S)
            wire.send(sock, {"cmd": cmd, "args": {**args, "stream": kind}}, allow_nan=False)
            for frame in part_frames(items):
                sock.sendall(frame)
            wire.send(sock, END)
            sent_all = True
            reply = wire.receive(sock)
        except KeyboardInterrupt:
            raise Interrupted(_cancel(sock), sent_all) from None
        except OSError as exc:
            reply = _reply_after_refusal(sock, exc, client, cmd if sent_all else None)
        except BaseException:
            _send_quietly(sock, CANCEL)  # the items failed: the daemon drops the request
            raise
    finally:
        sock.close()
    if reply is None and sent_all:
        client.lost("it closed the connection without an answer", cmd)
    return client.result_of(reply)


def _cancel(sock: Any) -> dict[str, Any] | None:
    """Ask the daemon to drop the request and wait a while for what it says."""
    if not _send_quietly(sock, CANCEL):
        return None
    try:
        sock.settimeout(CANCEL_ANSWER_S)
        return wire.receive(sock)
    except (OSError, KeyboardInterrupt, ProtocolError):
        return None


def _send_quietly(sock: Any, message: dict[str, Any]) -> bool:
    try:
        wire.send(sock, message)
        return True
    except OSError:
        return False


def _reply_after_refusal(
    sock: Any, exc: OSError, client: Any, sent: str | None
) -> dict[str, Any] | None:
    """The daemon's reply when sending failed: it may have refused the request and
    closed (a full connection count, say); else the connection was lost. sent: the
    command, once its end frame went (the daemon may have done it)."""
    try:
        sock.settimeout(2.0)
        reply = wire.receive(sock)
    except OSError:
        reply = None
    if reply is None:
        client.lost(exc, sent)
    return reply
