"""The daemon's socket: accept connections, read frames with a timeout, hand requests over."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, Protocol

from gpusched.client import pagedreplies, protocol, wire
from gpusched.core.errors import GpuschedError, ProtocolError, error_kind
from gpusched.core.spec.limits import DEFAULT as DEFAULT_LIMITS
from gpusched.core.spec.limits import Limits
from gpusched.daemon.requests import streamedrequest
from gpusched.daemon.requests.framebudget import FrameBudget
from gpusched.proc.runfile import WAKE_MAX_BYTES

log = logging.getLogger("gpusched.daemon.requests.server")


class Dispatch(Protocol):
    """(command, args, (pid, uid, gid)) -> the command's result, or GpuschedError raised;
    gone(): whether a streamed request's client left. Called on a connection thread; it
    may block."""

    def __call__(
        self,
        name: str,
        args: dict[str, Any],
        creds: tuple[int, int, int],
        gone: Callable[[], bool] | None = None,
    ) -> Any: ...


# Connection threads wait in accept(): one more is started whenever none is left waiting
# (a `wait` holds its thread for minutes), and one that is done exits while this many
# others wait. Two start, so that a client's next connection, made before its last one's
# thread is back, finds one waiting.
FIRST_THREADS = 2
SPARE_THREADS = 4


def reply(
    result: Any = None, error: GpuschedError | None = None, daemon: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The envelope of every reply the daemon sends: {"ok": true, "result": ...} or
    {"ok": false, "error": {"kind", "message"}}; with the answers to dispatched commands,
    how the daemon was started ("daemon", see gpusched/client/drift.py)."""
    out: dict[str, Any] = (
        {"ok": False, "error": {"kind": error_kind(error), "message": error.message}}
        if error is not None
        else {"ok": True, "result": result}
    )
    if daemon is not None:
        out["daemon"] = daemon
    return out


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at path; None where there is none (or it cannot be seen)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


# The socket files this process bound, by path: only its own is removed at close.
_BOUND: dict[str, tuple[int, int] | None] = {}


def bind_unix(path: str, kind: int) -> socket.socket:
    """A Unix socket bound at `path` (0600), replacing a stale one: the caller holds the
    daemon lock, so whatever is there is a dead daemon's."""
    if os.path.lexists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, kind)
    # Bind under a restrictive umask so the socket is never reachable with wider
    # permissions, even for an instant.
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    _BOUND[str(path)] = file_identity(str(path))
    return sock


def close_unix(sock: socket.socket, path: str) -> None:
    """Stop a bound socket (waking a thread blocked on it) and remove its file, if the
    file there is still the one it bound: a daemon whose home was deleted must not remove
    the socket of the one started there since."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    if file_identity(str(path)) == _BOUND.pop(str(path), None):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class SocketServer:
    def __init__(
        self,
        path: str,
        dispatch: Dispatch,
        mode: int = 0o600,
        max_per_uid: int = 0,
        exempt_uids: Collection[int] = (),
        stamp: dict[str, Any] | None = None,
        max_json_depth: int | None = None,
        limits: Limits = DEFAULT_LIMITS,
        frames: FrameBudget | None = None,
    ):
        self.path, self._max_json_depth = path, max_json_depth
        self._frames = frames or FrameBudget()  # large frames read at once, all connections
        self._limits = limits  # what a streamed request's items are checked against
        self._dispatch, self._stamp = dispatch, stamp
        # At most this many open connections per uid (0: no limit), so one user cannot take
        # every thread; the exempt (root, the daemon's user: job shims among them) never wait.
        self._max_per_uid, self._exempt = max_per_uid, frozenset(exempt_uids)
        self._per_uid: dict[int, int] = {}
        # Connections inside a `wait` are counted apart, with a limit of their own: a user
        # waiting on many jobs must still be able to ask anything else.
        self._waiting_per_uid: dict[int, int] = {}
        self._sock = bind_unix(path, socket.SOCK_STREAM)
        os.chmod(path, mode)
        self._sock.listen(128)
        self._closed = False
        # Open connections by thread, so that drain() can let their answers out before exit.
        self._open: dict[threading.Thread, socket.socket] = {}
        self._open_lock = threading.Lock()
        self._idle = 0  # connection threads waiting in accept() (under _open_lock)

    def start(self) -> None:
        with self._open_lock:
            for _ in range(FIRST_THREADS):
                self._spawn()

    def close(self) -> None:
        self._closed = True
        close_unix(self._sock, self.path)

    def drain(self, timeout_s: float = 2.0) -> None:
        """After close(): let connection threads send the answers they were given (the one
        to `stop` among them) instead of dying with the process. Idle ones are woken by
        shutting their reading side; sending still works."""
        with self._open_lock:
            open_now = dict(self._open)
        for conn in open_now.values():
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for thread in open_now:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _spawn(self) -> None:
        """One more connection thread, to wait in accept() (under _open_lock). Where none
        can be started (a limit on threads), those there are serve on, one at a time."""
        try:
            threading.Thread(target=self._accept_and_serve, name="conn", daemon=True).start()
        except RuntimeError as exc:
            log.warning(
                "could not start another connection thread (%s); serving with the %d there are",
                exc,
                len(self._open) + self._idle,
            )
            return
        self._idle += 1

    def _accept_and_serve(self) -> None:
        """A connection thread: accept a connection, serve it, and go back to accepting
        while fewer than SPARE_THREADS others wait. The thread that takes a request is one
        already waiting in accept(), not one started for it: starting a thread and handing
        the connection over to it added a third of a millisecond to every command."""
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    break
                continue
            with self._open_lock:
                self._idle -= 1
                if not self._idle:  # someone must be waiting for the next connection
                    self._spawn()
            uid = self._admit(conn)
            if uid is not None:
                with self._open_lock:
                    self._open[threading.current_thread()] = conn
                self._serve_counted(conn, uid)
            with self._open_lock:
                if self._idle >= SPARE_THREADS:
                    return
                self._idle += 1
        with self._open_lock:
            self._idle -= 1

    def _admit(self, conn: socket.socket) -> int | None:
        """Count a new connection against its user's limit; refuse it, with a reply, if over."""
        try:
            uid = wire.peer_credentials(conn)[1]
        except OSError:
            conn.close()
            return None
        with self._open_lock:
            count = self._per_uid.get(uid, 0)
            over = (
                bool(self._max_per_uid) and uid not in self._exempt and count >= self._max_per_uid
            )
            if not over:
                self._per_uid[uid] = count + 1
        if not over:
            return uid
        log.warning("refused a connection from uid %d: %d already open", uid, count)
        conn.settimeout(1.0)
        self._try_send(
            conn,
            reply(
                error=GpuschedError(
                    f"uid {uid} already has {count} open connections to the daemon (the limit, "
                    "daemon.max_connections_per_uid); wait for some to finish and try again"
                )
            ),
        )
        conn.close()
        return None

    def _serve_counted(self, conn: socket.socket, uid: int) -> None:
        try:
            self._serve(conn)
        finally:
            with self._open_lock:
                left = self._per_uid.pop(uid, 1) - 1
                if left:
                    self._per_uid[uid] = left

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_frames(conn)
        finally:
            with self._open_lock:
                self._open.pop(threading.current_thread(), None)

    def _serve_frames(self, conn: socket.socket) -> None:
        taken = self._frames.reader()  # a large frame's bytes, held until it is answered
        with conn:
            try:
                creds = wire.peer_credentials(conn)
                while (
                    message := wire.receive(
                        conn, protocol.READ_TIMEOUT_S, self._max_json_depth, taken
                    )
                ) is not None:
                    streamed = streamedrequest.is_streamed(message)
                    answer = (
                        self._handle(message, creds, conn)
                        if streamed
                        else self._handle_counted(message, creds)
                    )
                    conn.settimeout(protocol.READ_TIMEOUT_S)  # a reader that stalls is cut off too
                    wire.send(conn, answer)
                    taken.release()
                    if streamed:
                        return  # one streamed request per connection: its frames end here
                    self._stream_rest(conn, message, answer, creds)
            except ProtocolError as exc:
                self._try_send(conn, reply(error=exc))
            except (TimeoutError, OSError):
                pass  # the client went away or stalled; nothing is half-applied
            finally:
                taken.release()

    def _stream_rest(
        self, conn: socket.socket, message: Any, answer: dict[str, Any], creds: tuple[int, int, int]
    ) -> None:
        """The pages after the first of a streamed reply (client/pagedreplies.py): each asked
        of the loop in turn, so that it answers everyone else between two pages."""
        while (message := pagedreplies.next_request(message, answer)) is not None:
            answer = self._handle(message, creds)
            conn.settimeout(pagedreplies.SEND_TIMEOUT_S)  # its reader may be busy printing
            wire.send(conn, answer)

    def _handle_counted(self, message: Any, creds: tuple[int, int, int]) -> dict[str, Any]:
        """_handle; a `wait` moves its connection from the user's open connections to
        their waiting ones while the daemon holds it (up to WAIT_SLICE_S)."""
        uid = creds[1]
        if (
            not isinstance(message, dict)
            or message.get("cmd") != "wait"
            or not self._max_per_uid
            or uid in self._exempt
        ):
            return self._handle(message, creds)
        with self._open_lock:
            waiting = self._waiting_per_uid.get(uid, 0)
            if waiting < self._max_per_uid:
                self._waiting_per_uid[uid] = waiting + 1
                self._per_uid[uid] -= 1
        if waiting >= self._max_per_uid:
            return reply(
                error=GpuschedError(
                    f"uid {uid} already waits on {waiting} connections (the limit, "
                    "daemon.max_connections_per_uid); wait for some to finish and try again"
                )
            )
        try:
            return self._handle(message, creds)
        finally:
            with self._open_lock:
                self._waiting_per_uid[uid] -= 1
                self._per_uid[uid] = self._per_uid.get(uid, 0) + 1

    def _handle(
        self, message: Any, creds: tuple[int, int, int], parts_from: socket.socket | None = None
    ) -> dict[str, Any]:
        """The reply to a request; to a streamed one (daemon/requests/streamedrequest.py) once its parts,
        read from `parts_from`, are in and done."""
        try:
            name, args = protocol.check_request(message)
            if protocol.COMMANDS[name].on_server:  # ping, on the connection's thread
                return reply({"pid": os.getpid()})
            try:
                if parts_from is not None:
                    return reply(
                        streamedrequest.serve_stream(
                            parts_from,
                            name,
                            args,
                            self._max_json_depth,
                            self._limits,
                            lambda name, args, gone: self._dispatch(name, args, creds, gone=gone),
                            self._frames.reader(),
                        ),
                        daemon=self._stamp,
                    )
                return reply(self._dispatch(name, args, creds), daemon=self._stamp)
            except GpuschedError as exc:
                return reply(error=exc, daemon=self._stamp)
        except GpuschedError as exc:
            return reply(error=exc)
        except Exception:
            log.exception(
                "request %r failed", message.get("cmd") if isinstance(message, dict) else None
            )
            return reply(error=GpuschedError("the daemon failed on this request; see its log"))

    @staticmethod
    def _try_send(conn: socket.socket, answer: dict[str, Any]) -> None:
        try:
            wire.send(conn, answer)
        except OSError:
            pass


class WakeListener:
    """A datagram socket that job shims poke when a job ends: one thread, no connections.

    A datagram carries nothing the daemon trusts (it reads the exit record itself), so
    any process that can reach the socket (it is 0600) can at most make the loop run a
    pass early, or fail a job whose shim has not started (see runfile.launch_failure).
    The loop answers a shim's report of its job's end from this socket (daemon/jobs/endacks.py).
    """

    def __init__(self, path: str, wake: Callable[[bytes, Any], None]):
        self.path, self._wake = path, wake
        self._sock = bind_unix(path, socket.SOCK_DGRAM)
        self._thread = threading.Thread(target=self._listen, name="wake", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while True:
            try:
                message, sender = self._sock.recvfrom(WAKE_MAX_BYTES)
            except OSError:
                return  # closed
            self._wake(message, sender)

    def answer(self, address: Any, message: bytes) -> None:
        """Best effort, never blocking: a sender that is gone or full goes without."""
        try:
            self._sock.sendto(message, socket.MSG_DONTWAIT, address)
        except OSError:
            pass

    def close(self) -> None:
        close_unix(self._sock, self.path)
