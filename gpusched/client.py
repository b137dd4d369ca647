"""Talk to the daemon: connect (starting the user daemon if none runs) and turn replies into errors.

Kept free of heavy imports: every CLI call pays for what this module imports.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpusched import protocol
from gpusched.config import Paths, ensure_private_dir, resolve_paths
from gpusched.errors import ERROR_KINDS, DaemonUnavailable, GpuschedError

START_TIMEOUT_S = 15.0


class Client:
    def __init__(self, paths: Paths | None = None, autostart: bool = True):
        self.paths = paths or resolve_paths()
        self.autostart = autostart

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.paths.socket))
        except OSError:
            sock.close()
            raise
        return sock

    def connect(self) -> socket.socket:
        try:
            return self._connect()
        except (FileNotFoundError, ConnectionRefusedError):
            if not self.autostart:
                raise DaemonUnavailable(f"no gpusched daemon is running for "
                                        f"{self.paths.state_dir}; start one with "
                                        "`gpusched daemon start`.") from None
        start_daemon(self.paths)
        return self.wait_until_up()

    def wait_until_up(self, timeout_s: float = START_TIMEOUT_S) -> socket.socket:
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                return self._connect()
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise DaemonUnavailable(
                        f"the gpusched daemon did not start within {timeout_s:.0f} s; see "
                        f"{self.paths.daemon_log}") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    def call(self, cmd: str, timeout_s: float | None = 60.0, **args: Any) -> Any:
        """Send one request and return its result, raising the daemon's error as ours."""
        with self.connect() as sock:
            sock.settimeout(timeout_s)
            try:
                protocol.send(sock, {"cmd": cmd, "args": args})
                reply = protocol.receive(sock)
            except (OSError, socket.timeout) as exc:
                raise DaemonUnavailable(f"lost the connection to the gpusched daemon ({exc}); "
                                        f"see {self.paths.daemon_log}") from None
        if reply is None:
            raise DaemonUnavailable("the gpusched daemon closed the connection without an answer")
        if not reply.get("ok"):
            error = reply.get("error") or {}
            cls = ERROR_KINDS.get(error.get("kind"), GpuschedError)
            raise cls(error.get("message", "the daemon refused the request"))
        return reply.get("result")

    def is_running(self) -> bool:
        try:
            self._connect().close()
            return True
        except OSError:
            return False


def start_daemon(paths: Paths, environ: dict[str, str] | None = None) -> None:
    """Start `gpusched daemon run` in the background, detached, logging to its state dir."""
    ensure_private_dir(paths.state_dir)
    env = dict(os.environ if environ is None else environ)
    log_fd = os.open(paths.daemon_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        subprocess.Popen([sys.executable, "-m", "gpusched", "daemon", "run"],
                         stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                         start_new_session=True, close_fds=True, env=env, cwd="/")
    finally:
        os.close(log_fd)


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            # A daemon this process started is its child: reap it, or it lingers as a zombie.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def read_log(path: str | Path) -> bytes:
    return Path(path).read_bytes()
