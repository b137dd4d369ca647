"""The daemon's socket: accept connections, read frames with a timeout, hand requests over."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any, Callable

from gpusched import protocol
from gpusched.errors import GpuschedError, ProtocolError, error_kind

log = logging.getLogger("gpusched.server")

# (command, args, (pid, uid, gid)) -> reply. Called on a connection thread; it may block.
Dispatch = Callable[[str, dict[str, Any], tuple[int, int, int]], dict[str, Any]]


def error_reply(exc: GpuschedError) -> dict[str, Any]:
    return {"ok": False, "error": {"kind": error_kind(exc), "message": exc.message}}


class SocketServer:
    def __init__(self, path: Path, dispatch: Dispatch, mode: int = 0o600):
        self.path = path
        self._dispatch = dispatch
        if path.exists() or path.is_symlink():
            path.unlink()  # a stale socket: the caller holds the daemon lock, so it is ours
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bind under a restrictive umask so the socket is never reachable with wider
        # permissions, even for an instant.
        old_umask = os.umask(0o177)
        try:
            self._sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, mode)
        self._sock.listen(128)
        self._thread = threading.Thread(target=self._accept_loop, name="accept", daemon=True)
        self._closed = False

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                continue
            threading.Thread(target=self._serve, args=(conn,), name="conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(protocol.READ_TIMEOUT_S)
            try:
                creds = protocol.peer_credentials(conn)
                while (message := protocol.receive(conn)) is not None:
                    protocol.send(conn, self._handle(message, creds))
            except ProtocolError as exc:
                self._try_send(conn, error_reply(exc))
            except (OSError, socket.timeout):
                pass  # the client went away or stalled; nothing is half-applied

    def _handle(self, message: Any, creds: tuple[int, int, int]) -> dict[str, Any]:
        try:
            name, args = protocol.check_request(message)
            return self._dispatch(name, args, creds)
        except GpuschedError as exc:
            return error_reply(exc)
        except Exception:  # noqa: BLE001 - one bad request must not kill the daemon
            log.exception("request %r failed", message.get("cmd") if isinstance(message, dict) else None)
            return error_reply(GpuschedError("the daemon failed on this request; see its log"))

    @staticmethod
    def _try_send(conn: socket.socket, reply: dict[str, Any]) -> None:
        try:
            protocol.send(conn, reply)
        except OSError:
            pass
