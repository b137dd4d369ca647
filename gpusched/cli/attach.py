"""`gpusched attach`: this terminal on a --pty job's, through the socket its shim serves
(proc/ptywire.py): the scrollback, then live output; keys to the job, resizes passed on,
the detach keys leave it running; when the job ends, its exit status.

The daemon only says where the socket is, and refuses anyone but the owner or an admin;
the shim outlives the daemon, so an attach goes on across a restart of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import termios
import time
import tty

from gpusched.client.connection import Client
from gpusched.core.errors import GpuschedError, UsageError
from gpusched.proc import ptywire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

_POLL_S = 0.2  # while the job has yet to start, or its shim to listen
_REACH_S = 30.0  # a running job's shim that has not listened by then is not going to


def detach_keys_of(option: str | None) -> tuple[bytes, str]:
    """The detach keys' bytes and their name: --detach-keys, else [attach] detach_keys."""
    from gpusched.client.modes import client_paths  # noqa: PLC0415 - attach only
    from gpusched.core.config import load_settings  # noqa: PLC0415 - attach only
    from gpusched.core.configkeys import detach_key_bytes  # noqa: PLC0415 - attach only

    if option is None:
        name = load_settings(client_paths().config_file, environ={}).attach_detach_keys
        return detach_key_bytes(name), name
    try:
        return detach_key_bytes(option), option
    except ValueError as exc:
        raise UsageError(f"--detach-keys: {exc}") from None


def end_line(job_id: int, exit_code: int | None, signum: int | None) -> tuple[str, int]:
    """The line said when the job has ended, and attach's exit status (the job's own, as a
    shell gives it: 128 + the signal for a job a signal ended)."""
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"[job {job_id} was ended by {name}]", 128 + signum
    code = 1 if exit_code is None else exit_code
    return f"[job {job_id} exited with code {code}]", code


def attach(job_id: str, detach_keys: str | None = None) -> int:
    """Attach to the job; the exit status."""
    keys, key_name = detach_keys_of(detach_keys)
    client = Client()
    said_pending, running_since = False, 0.0
    while True:
        reply = client.call("attach", id=job_id)
        job = reply["job"]
        if reply["socket"] is None:
            raise GpuschedError(
                f"job {job['id']} was not submitted with --pty, so it has no terminal to attach "
                f"to. Follow its output with: gpusched logs -f {job['id']}"
            )
        if job["state"] not in ("pending", "running"):
            return _ended_before(job)
        if job["state"] == "running":
            running_since = running_since or time.monotonic()
            try:
                sock = ptywire.connect(reply["socket"])
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if time.monotonic() - running_since > _REACH_S:
                    raise _unreachable(job["id"], reply["socket"], exc) from None
            except OSError as exc:
                raise _unreachable(job["id"], reply["socket"], exc) from None
            else:
                return Session(job["id"], sock, keys, key_name).run()
        elif not said_pending:
            sys.stderr.write(f"job {job['id']} has not started yet; attaching when it does\n")
            said_pending = True
        time.sleep(_POLL_S)


class _Signalled(Exception):
    """SIGTERM or SIGHUP while attached: unwind (the terminal restored), exit 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def _signalled(signum: int, _frame: object) -> None:
    raise _Signalled(signum)


def _ended_before(job: dict[str, Any]) -> int:
    """Said for a job that ended before attach reached it: how, and its status."""
    if job["exit_code"] is None and job["signal"] is None:  # it never ran (cancelled, say)
        sys.stderr.write(f"[job {job['id']} is {job['state']}; gpusched show {job['id']}]\n")
        return 1
    line, status = end_line(job["id"], job["exit_code"], job["signal"])
    sys.stderr.write(f"{line[:-1]}; its output: gpusched logs {job['id']}]\n")
    return status


def _unreachable(job_id: int, path: str, exc: OSError) -> GpuschedError:
    return GpuschedError(
        f"cannot reach the terminal of job {job_id} at {path}: {exc.strerror or exc}. "
        f"`gpusched show {job_id}` says how the job is; `gpusched logs -f {job_id}` follows it"
    )


class Session:
    """One attach: this process's stdin and stdout on the job's terminal."""

    def __init__(self, job_id: int, sock: socket.socket, keys: bytes, key_name: str):
        self.job_id, self.sock, self.keys, self.key_name = job_id, sock, keys, key_name
        self.matched = 0  # how many of the detach keys were typed last
        self.is_tty = os.isatty(0)

    def run(self) -> int:
        try:
            with self.sock, self._raw_terminal():
                if self.is_tty:
                    self._say(f"[attached to job {self.job_id}; {self.key_name} detaches]")
                return self._serve()
        except _Signalled as signalled:  # the terminal is restored: the job runs on
            name = signal.Signals(signalled.signum).name
            self._say(f"[{name} ended attach; job {self.job_id} runs on]")
            return 128 + signalled.signum

    @contextlib.contextmanager
    def _raw_terminal(self) -> Iterator[None]:
        """Raw mode and a resize watch while attached, the terminal restored however it ends."""
        if not self.is_tty:
            yield
            return
        saved = termios.tcgetattr(0)
        wake_read, wake_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.resized = wake_read

        def resized(_signum: int, _frame: object) -> None:
            with contextlib.suppress(OSError):  # full: a wake-up is pending already
                os.write(wake_write, b"w")

        previous = {
            signum: signal.signal(signum, handler)
            for signum, handler in (
                (signal.SIGWINCH, resized),
                (signal.SIGTERM, _signalled),
                (signal.SIGHUP, _signalled),
            )
        }
        try:
            tty.setraw(0)
            yield
        finally:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(wake_read)
            os.close(wake_write)

    def _serve(self) -> int:
        # select(2), not epoll: stdin may be a file or /dev/null, which epoll refuses.
        sel = selectors.SelectSelector()
        sel.register(self.sock, selectors.EVENT_READ, "job")
        sel.register(0, selectors.EVENT_READ, "keys")
        if self.is_tty:
            sel.register(self.resized, selectors.EVENT_READ, "resized")
            self._send_size()
        frames = ptywire.FrameReader()
        while True:
            for key, _ in sel.select():
                if key.data == "job":
                    data = self.sock.recv(1 << 16)
                    if not data:
                        raise GpuschedError(
                            f"the terminal of job {self.job_id} went away before it ended; "
                            f"`gpusched show {self.job_id}` says what became of it"
                        )
                    for kind, payload in frames.feed(data):
                        if kind == ptywire.OUTPUT:
                            _write_all(1, payload)
                        elif kind == ptywire.EXITED:
                            ended = json.loads(payload)
                            return self._ended(ended["exit_code"], ended["signal"])
                elif key.data == "resized":
                    os.read(self.resized, 64)
                    self._send_size()
                else:
                    typed = os.read(0, 4096)
                    if not typed and self.is_tty:  # the terminal hung up
                        raise _Signalled(signal.SIGHUP)
                    if not typed:  # stdin ended (a pipe): watch on until the job ends
                        sel.unregister(0)
                    elif self._type(typed):
                        self._say(
                            f"[detached from job {self.job_id}, which runs on: "
                            f"gpusched attach {self.job_id}]"
                        )
                        return 0

    def _type(self, typed: bytes) -> bool:
        """Send keys on, holding back a start of the detach keys; True once all are typed."""
        out = bytearray()
        for byte in typed:
            if byte == self.keys[self.matched]:
                self.matched += 1
                if self.matched == len(self.keys):
                    self._send_keys(bytes(out))
                    return True
                continue
            out += self.keys[: self.matched]  # not the detach keys after all
            self.matched = 1 if byte == self.keys[0] else 0
            if not self.matched:
                out.append(byte)
        self._send_keys(bytes(out))
        return False

    def _send_keys(self, keys: bytes) -> None:
        if keys:
            self.sock.sendall(ptywire.frame(ptywire.INPUT, keys))

    def _send_size(self) -> None:
        columns, rows = os.get_terminal_size(0)
        self.sock.sendall(ptywire.frame(ptywire.WINSIZE, struct.pack(">HH", rows, columns)))

    def _ended(self, exit_code: int | None, signum: int | None) -> int:
        line, status = end_line(self.job_id, exit_code, signum)
        self._say(line)
        return status

    def _say(self, line: str) -> None:
        sys.stderr.write(("\r\n" if self.is_tty else "") + line + ("\r\n" if self.is_tty else "\n"))
        sys.stderr.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
