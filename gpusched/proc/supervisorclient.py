"""The daemon's connection to its home's job supervisor (gpusched/proc/supervisor/main.py).

The supervisor runs apart from the daemon and outlives it: a daemon connects to the one
already listening on the home's socket (its predecessor's, whose jobs it still watches),
or starts a new one. Used by the process seam (proc/seam.py) only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

from gpusched.proc.supervisor import main as supervisor

SUPERVISOR_PATH = supervisor.__file__
_HELLO_WAIT_S = 30.0  # a supervisor starting on a loaded machine: a second or two


def supervisor_socket(run_dir: str) -> str:
    """Where the job supervisor of the daemon whose run directory this is listens."""
    return os.path.join(run_dir, supervisor.SOCKET_NAME)


class SupervisorLink:
    """The daemon's connection to the job supervisor (gpusched/proc/supervisor/main.py) of its
    home: the one already running (a restarted daemon's, whose jobs it still watches), or a
    new one, started detached; started again if it dies."""

    def __init__(self, socket_path: str | None = None) -> None:
        self.path = socket_path
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None  # the one we started, kept to be reaped
        self._lock = threading.Lock()  # the loop launches; a request's thread may signal
        self._unread = b""  # the start acknowledgements' last line, not whole yet

    def send(self, request: dict[str, Any], start: bool = True) -> bool:
        """Write one request; start a supervisor if none runs (start=False: then say so,
        False). OSError if it cannot be asked."""
        line = (json.dumps(request) + "\n").encode()  # JSON has no raw newline: one line
        with self._lock:
            for _attempt in (1, 2):
                try:
                    if self._sock is None:
                        self._sock = self._connect(start)
                    if self._sock is None:
                        return False
                    self._sock.sendall(line)
                    return True
                except OSError:
                    self.close()  # it died between requests: once more, with a new one
        raise OSError("the job supervisor does not take requests")

    def _connect(self, start: bool) -> socket.socket | None:
        if self.path is None:
            raise OSError("no job supervisor socket")
        try:
            return _hello(self.path)
        except OSError:
            if not start:
                return None
        return self._start(self.path)

    def _start(self, path: str) -> socket.socket:
        """A new supervisor, on a listening socket we make (so that our connection waits in
        its backlog, however long its start takes). A clean, fixed environment: it and the
        shims it forks may run as root; a user's environment reaches only the job."""
        try:
            os.unlink(path)  # a supervisor that has exited left its socket's name
        except FileNotFoundError:
            pass
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(64)
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", SUPERVISOR_PATH, str(listener.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                pass_fds=(listener.fileno(),),
                env={"PATH": os.defpath},
            )
        return _hello(path)

    def started(self) -> list[dict[str, Any]]:
        """The start acknowledgements received since the last call (the supervisor's
        _acknowledge), without waiting; a line that is not one is left out."""
        with self._lock:
            data = self._unread
            while self._sock is not None:
                try:
                    chunk = self._sock.recv(65536, socket.MSG_DONTWAIT)
                except OSError:  # none waiting; or the link is down, which send() finds
                    break
                if not chunk:
                    break
                data += chunk
            *lines, self._unread = data.split(b"\n")
        acks = []
        for line in lines:
            try:
                ack = json.loads(line)
            except ValueError:
                continue
            if isinstance(ack, dict) and "started" in ack:
                acks.append(ack)
        return acks

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._unread = b""


def _hello(path: str) -> socket.socket:
    """A connection to the supervisor at path, once it has greeted us (one that is
    exiting closes our connection instead: OSError)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_HELLO_WAIT_S)
        sock.connect(path)
        greeting = b""
        while not greeting.endswith(b"\n"):
            chunk = sock.recv(64)
            if not chunk:
                raise OSError("the job supervisor closed the connection")
            greeting += chunk
        if not greeting.startswith(supervisor.HELLO):
            raise OSError(f"not a job supervisor at {path}")
        sock.settimeout(None)
        return sock
    except BaseException:
        sock.close()
        raise
