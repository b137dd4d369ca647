"""The GpuschedError family: one-line messages written for the person at the terminal."""

from __future__ import annotations

import errno
import os
import sys


class GpuschedError(Exception):
    """An error to show as `Error: <message>` with exit status `exit_code`."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class UsageError(GpuschedError):
    """A bad command line or bad value in a request: exit status 2."""

    exit_code = 2


class ConfigError(GpuschedError):
    """A config file that cannot be read, or a key or value in it that is wrong."""


class NotFound(GpuschedError):
    """A job id that the queue does not have."""


class PermissionDenied(GpuschedError):
    """The caller may not touch this job."""


class DaemonUnavailable(GpuschedError):
    """No daemon answered, and none could be started."""


class StoreError(GpuschedError):
    """The queue file is corrupt, too new, or cannot be opened."""


class StoreWriteError(GpuschedError):
    """A write to the queue failed (the disk is full, another process holds its lock, an
    I/O error): an error for the request that asked for it, never for the daemon."""

    def __init__(self, cause: str, remedy: str, undone: str = ""):
        # cause: what went wrong, in words, with SQLite's own; remedy: what to do about it;
        # undone: what the refusal means for the request ("nothing was queued").
        super().__init__(
            f"the queue cannot be written: {cause}. {remedy}" + (f"; {undone}." if undone else ".")
        )
        self.cause, self.remedy = cause, remedy

    def saying(self, undone: str) -> StoreWriteError:
        """The same failure, ending with what it means for one request."""
        return StoreWriteError(self.cause, self.remedy, undone)


class ProtocolError(GpuschedError):
    """A frame that is too large, truncated, or not the JSON we expect."""


# Reply error kinds on the wire, so the client re-raises the same class.
ERROR_KINDS: dict[str, type[GpuschedError]] = {
    "usage": UsageError,
    "config": ConfigError,
    "not_found": NotFound,
    "permission": PermissionDenied,
    "store": StoreError,
    "protocol": ProtocolError,
    "error": GpuschedError,
}


def error_kind(exc: GpuschedError) -> str:
    for kind, cls in ERROR_KINDS.items():
        if type(exc) is cls:
            return kind
    return "error"


def report_error(exc: GpuschedError) -> int:
    """Print the one-line form of an error on stderr and return its exit status."""
    sys.stderr.write(f"Error: {exc.message}\n")
    return exc.exit_code


def report_unexpected(exc: Exception) -> int:
    """A bug, or standard output gone: one line for the user (details with GPUSCHED_DEBUG=1,
    which raises it again), never a traceback; returns the exit status."""
    if is_stdout_gone(exc):
        detach_stdout()
        return 1
    if os.environ.get("GPUSCHED_DEBUG"):
        raise exc
    sys.stderr.write(
        f"Error: internal error: {type(exc).__name__}: {exc}. Rerun with "
        "GPUSCHED_DEBUG=1 for details and report it.\n"
    )
    return 1


def is_stdout_gone(exc: BaseException) -> bool:
    """Whether an error is standard output failing: its reader left (EPIPE, as after
    `| head`) or it is closed (EBADF, as after `>&-`)."""
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.EBADF)


def stand_in_for_closed_stdout() -> None:
    """Started with standard output closed (`>&-`): put /dev/null, opened for reading
    only, in its place. Writes then fail as they do on a closed descriptor, and every
    command stops as it does when its reader leaves; and no socket or file opened later
    can take descriptor 1 and receive what was meant for standard output."""
    fd = os.open(os.devnull, os.O_RDONLY)
    if fd != 1:
        os.dup2(fd, 1)
        os.close(fd)
    sys.stdout = open(1, "w", closefd=False)


def detach_stdout() -> None:
    """After standard output failed (closed, or its reader went away, as with `| head`):
    point it at /dev/null, so that the interpreter's last flush at exit cannot fail again
    with a traceback."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass
