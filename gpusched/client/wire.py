"""The wire's plumbing: length-prefixed JSON frames over a Unix socket, for the client
(every command) and the daemon alike.

Every CLI call pays for what this module imports, and the standard modules cost more than
a whole command may take: `socket` (selectors, enum) and `json` (re) take 10 ms each to
import (python -X importtime), where `python -c pass` takes 12 ms; with them (and `signal`)
imported, `ls` went from 1.65x to 2.2x the floor and `submit` from 1.75x to 2.16x
(bench/bench_commands.py, same run). So the client talks through their C halves:
`_socket` (what socket.socket is built on; its timeout error is TimeoutError, its refusals
the usual OSErrors) and `_json`'s scanner and encoder, which json.loads and json.dumps run
on themselves for the messages we send. Where `_json` is missing (another Python) and
whenever anything goes off the common road (an error, a value JSON cannot hold), `json`
itself does the work, so results and errors read exactly as json's. The daemon keeps `socket` for its listening side.
"""

from __future__ import annotations

import _socket
import sys
import time

try:
    import _json
except ImportError:  # a Python without the accelerator: json does it all
    _json = None  # type: ignore[assignment]  # mypy has no "this module, or None" for an import

from gpusched.core.errors import ProtocolError

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_FRAME_BYTES = 16 * 2**20  # a --from-file sweep of thousands of lines fits; a flood does not
HEADER_BYTES = 4  # the body's length, big-endian
_WHITESPACE = " \t\n\r"  # what json skips around a document


class _ScannerContext:
    """What _json.make_scanner reads from a json.JSONDecoder(): its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook: Callable[[list[tuple[str, Any]]], dict[str, Any]] | None = None
    parse_float = float
    parse_int = int
    # json's own table for NaN and the infinities, which its decoder accepts.
    parse_constant = {
        "NaN": float("nan"),
        "Infinity": float("inf"),
        "-Infinity": float("-inf"),
    }.__getitem__


class _UniqueKeysContext(_ScannerContext):
    """The daemon's reading of a request: an object with a key twice is refused, where json
    keeps the last value (`{"cmd":"ping","cmd":"stop"}` would stop the daemon)."""

    @staticmethod
    def object_pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            raise _duplicate_key(pairs)
        return obj


def _duplicate_key(pairs: list[tuple[str, Any]]) -> ProtocolError:
    from gpusched.core.spec.values import shown  # noqa: PLC0415 - 0.5 ms of every submit; refusals only

    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            break
        seen.add(key)
    return ProtocolError(
        f"the request gives the key {shown(key)} twice in one object; give each key once"
    )


# make_scanner reads its context's attributes; typeshed asks for a make_scanner itself.
_scan_once = _json.make_scanner(_ScannerContext()) if _json else None  # type: ignore[arg-type]
_scan_unique = _json.make_scanner(_UniqueKeysContext()) if _json else None  # type: ignore[arg-type]


class _NotPlain(Exception):
    """A value JSON cannot hold: json.dumps is asked instead, and raises its own error."""


def _json_error(*_: object) -> None:
    """Stands in for json's `default` hook (the encoder calls it for such a value)."""
    raise _NotPlain


def _encoder(allow_nan: bool) -> Any:
    # As json.dumps(separators=(",", ":"), allow_nan=...) builds it (check_circular: {}).
    return _json.make_encoder(
        {}, _json_error, _json.encode_basestring_ascii, None, ":", ",", False, False, allow_nan
    )


def dumps(message: Any, allow_nan: bool = True) -> str:
    """json.dumps(message, separators=(",", ":"), allow_nan=allow_nan), to the character."""
    if _json is not None and not isinstance(message, str):
        try:
            return "".join(_encoder(allow_nan)(message, 0))
        except (_NotPlain, ValueError, TypeError, RecursionError):
            pass  # json raises its own error below
    import json  # noqa: PLC0415 - 16 ms (re) of every command: off the common road only

    return json.dumps(message, separators=(",", ":"), allow_nan=allow_nan)


def loads(body: bytes | str, unique_keys: bool = False) -> Any:
    """json.loads(body), to the value and to the error. unique_keys: an object with a key
    twice raises ProtocolError (the daemon's side; a reply never has one)."""
    scan = _scan_unique if unique_keys else _scan_once
    if scan is not None:
        try:
            return _scan_plain(body, scan)
        except (ValueError, StopIteration, RecursionError):
            pass  # not plain UTF-8 JSON: json says what it is, or what is wrong
    import json  # noqa: PLC0415 - 16 ms (re) of every command: off the common road only

    return json.loads(
        body, object_pairs_hook=_UniqueKeysContext.object_pairs_hook if unique_keys else None
    )


def _scan_plain(body: bytes | str, scan: Any) -> Any:
    """A document in UTF-8 starting with a printable ASCII character: json.loads reads
    any other bytes (a byte-order mark, UTF-16) by other rules."""
    if type(body) is bytes:
        if len(body) < 2 or not 0x20 < body[0] < 0x80 or not body[1]:
            raise ValueError("not plain UTF-8")
        body = body.decode("utf-8", "surrogatepass")  # as json.loads decodes
    elif type(body) is not str:
        raise ValueError("neither bytes nor str")
    start = len(body) - len(body.lstrip(_WHITESPACE))
    value, end = scan(body, start)
    if body[end:].strip(_WHITESPACE):
        raise ValueError("extra data")
    return value


def encode(message: dict[str, Any], allow_nan: bool = True) -> bytes:
    """The frame for a message. allow_nan=False (a request): NaN and infinities, which
    standard JSON lacks and no argument means, are refused before sending."""
    try:
        body = dumps(message, allow_nan).encode()
    except ValueError:
        raise ProtocolError(
            "a request cannot carry NaN or an infinite number; give a finite one"
        ) from None
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(
            f"message of {len(body)} bytes is over the {MAX_FRAME_BYTES}-byte limit"
        )
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def send(sock: Any, message: dict[str, Any], allow_nan: bool = True) -> None:
    sock.sendall(encode(message, allow_nan))


def _recv(sock: Any, size: int, deadline: float | None) -> bytes:
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the message took too long to arrive")
        sock.settimeout(left)
    data: bytes = sock.recv(size)
    return data


def _read_exact(sock: Any, size: int, deadline: float | None = None) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = _recv(sock, min(remaining, 1 << 20), deadline)
        if not chunk:
            raise ProtocolError("connection closed in the middle of a message")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def receive(
    sock: Any, timeout_s: float | None = None, max_depth: int | None = None, admit: Any = None
) -> dict[str, Any] | None:
    """One frame, or None when the peer closed cleanly between frames.

    timeout_s bounds the whole frame, not each read: a peer that trickles a byte at a
    time must not hold a connection (and its thread) for ever. max_depth (the daemon's
    limits.json_depth: given on the daemon's side only) refuses a deeply nested frame
    before it is decoded, and an object with a key twice as it is. admit(size), before
    the body is read (the daemon's: daemon/requests/framebudget.py), may wait, or refuse it.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    first = _recv(sock, HEADER_BYTES, deadline)
    if not first:
        return None
    header = first + (
        _read_exact(sock, HEADER_BYTES - len(first), deadline) if len(first) < HEADER_BYTES else b""
    )
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"message of {size} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    if admit is not None:
        admit(size)
    body = _read_exact(sock, size, deadline)
    if max_depth is not None:
        from gpusched.core.spec.limits import check_depth  # noqa: PLC0415 - 10 ms; the daemon's side

        check_depth(body, max_depth)
    try:
        message = loads(body, unique_keys=max_depth is not None)
    except ValueError as exc:
        import json  # noqa: PLC0415 - loaded already: loads handed this document to json

        if isinstance(exc, (UnicodeDecodeError, json.JSONDecodeError)):
            raise ProtocolError(f"message is not JSON: {exc}") from None
        # Python reads no integer of over 4300 digits (int_max_str_digits)
        raise ProtocolError("message has an integer of more than 4300 digits") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object")
    return message


def connect_unix(path: str) -> Any:
    """A stream socket connected to PATH (a _socket.socket: close it when done)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_credentials(sock: Any) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel (SO_PEERCRED):
    three C ints in this machine's byte order."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    pid, uid, gid = (
        int.from_bytes(creds[i : i + 4], sys.byteorder, signed=True) for i in (0, 4, 8)
    )
    return pid, uid, gid
