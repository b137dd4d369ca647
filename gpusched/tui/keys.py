"""Single keys from a terminal in cbreak mode, with the terminal restored however we exit."""

from __future__ import annotations

import atexit
import os
import select
import signal
import termios
import tty
from typing import Any

RESIZED = ""  # what read() returns when the terminal changed size instead of a key


class Terminated(Exception):
    """SIGTERM or SIGHUP arrived: unwind through every `finally`, then exit 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


class KeyReader:
    """Reads keys without Enter or echo; `with KeyReader(fd) as keys: keys.read(1.0)`.

    cbreak keeps ISIG, so Ctrl-C still raises KeyboardInterrupt. The saved attributes
    are put back by __exit__, by atexit (a crash past our handlers) and before a SIGTERM
    or SIGHUP unwinds the program, so the shell never inherits a terminal without echo.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self._saved: list[Any] | None = None
        self._old_handlers: dict[int, Any] = {}
        self._wake_r, self._wake_w = -1, -1

    def __enter__(self) -> KeyReader:
        self._saved = termios.tcgetattr(self.fd)
        atexit.register(self.restore)
        # SIGWINCH would not wake select() by itself (PEP 475 retries it): a self-pipe does.
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        for signum, handler in (
            (signal.SIGTERM, self._terminate),
            (signal.SIGHUP, self._terminate),
            (signal.SIGWINCH, self._wake),
        ):
            self._old_handlers[signum] = signal.signal(signum, handler)
        tty.setcbreak(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.restore()
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self._old_handlers.clear()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        atexit.unregister(self.restore)

    def restore(self) -> None:
        if self._saved is not None:
            try:
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            except termios.error:  # the terminal is gone (SIGHUP): nothing left to restore
                pass
            self._saved = None

    def _terminate(self, signum: int, _frame: object) -> None:
        self.restore()
        raise Terminated(signum)

    def _wake(self, _signum: int, _frame: object) -> None:
        try:
            os.write(self._wake_w, b"w")
        except OSError:  # the pipe is full: a wake-up is already pending
            pass

    def read(self, timeout_s: float) -> str | None:
        """The keys typed within timeout_s; RESIZED after a resize; None when nothing came."""
        ready, _, _ = select.select([self.fd, self._wake_r], [], [], max(0.0, timeout_s))
        if self._wake_r in ready:
            while _drain(self._wake_r):
                pass
            return RESIZED
        if self.fd in ready:
            data = os.read(self.fd, 64)
            if not data:  # end of file: the terminal hung up
                raise Terminated(signal.SIGHUP)
            return data.decode("utf-8", "replace")
        return None


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 64))
    except BlockingIOError:
        return False
