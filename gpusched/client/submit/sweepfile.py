"""`submit --from-file`: the file's commands, read as they come and checked line by line,
for a streamed submit (client/streamedrequest.py): a sweep of any size, never one huge request.

Kept light: the submit fast path imports this module.
"""

from __future__ import annotations

import os
import select
import stat
import sys

from gpusched.client.modes import client_paths
from gpusched.core.errors import UsageError
from gpusched.core.spec import limits
from gpusched.core.spec.values import is_text

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Iterator

# Each line is a shell command, as a sweep file holds it: the job's command is this
# prefix and the line.
SHELL = ["/bin/sh", "-c"]
_READ_BYTES = 1 << 16
# Reading a pipe that is slow to come (a generator script): a part is sent at least this
# often, so that the daemon, which waits protocol.READ_TIMEOUT_S for each, keeps waiting.
KEEPALIVE_S = 3.0


def sweep_lines(path: str, jobs_per_line: int) -> Iterator[str | None]:
    """The file's commands (stripped, without blank lines and # comments), each checked
    against the limits, naming its line on a bad one; None now and then while a pipe
    is slow (send what there is). UsageError for a file that cannot be read, a bad
    line, or none at all: at once (before anything is sent) up to the first command."""
    try:
        fd = sys.stdin.fileno() if path == "-" else os.open(path, os.O_RDONLY)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read --from-file {path}: {exc}") from None
    lines = _checked_lines(fd, path, _LineChecker(path, jobs_per_line))
    first = next(line for line in lines if line is not None)  # StopIteration: none
    return _prepended(first, lines)


def _prepended(first: str, rest: Iterator[str | None]) -> Iterator[str | None]:
    yield first
    yield from rest


def _checked_lines(fd: int, path: str, checker: _LineChecker) -> Iterator[str | None]:
    try:
        for number, line in _numbered_lines(fd, path):
            if line is None:
                yield None
                continue
            line = line.strip()
            if line and not line.startswith("#"):
                yield checker.check(line, number)
    finally:
        if path != "-":
            os.close(fd)
    if not checker.count:
        raise UsageError(f"--from-file {path} has no commands")


def _numbered_lines(fd: int, path: str) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of each line; (0, None) when a pipe has been quiet a while."""

    is_pipe = not _is_regular(fd)
    number, rest = 0, b""
    while True:
        if is_pipe and not select.select([fd], [], [], KEEPALIVE_S)[0]:
            yield 0, None
            continue
        try:
            chunk = os.read(fd, _READ_BYTES)
        except OSError as exc:
            raise UsageError(f"cannot read --from-file {path}: {exc}") from None
        if not chunk:
            break
        whole, cut, rest = (rest + chunk).rpartition(b"\n")
        if cut:  # whole lines: a line's end is never inside a UTF-8 character
            for line in _decoded(whole + cut, path, number).splitlines():
                number += 1
                yield number, line
    if rest:
        yield number + 1, _decoded(rest, path, number)


def _is_regular(fd: int) -> bool:

    return stat.S_ISREG(os.fstat(fd).st_mode)


def _decoded(data: bytes, path: str, lines_before: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = lines_before + data[: exc.start].count(b"\n") + 1
        raise UsageError(
            f"cannot read --from-file {path}: line {line} is not UTF-8 text ({exc.reason})"
        ) from None


class _LineChecker:
    """Each line's command against the limits the daemon enforces: the defaults, and
    the config's (read once) when a line is over one of them."""

    def __init__(self, path: str, jobs_per_line: int):
        self.path, self.jobs_per_line, self.count = path, jobs_per_line, 0
        self.limits = limits.DEFAULT
        self._prefix_bytes = sum(map(limits.text_bytes, SHELL))
        self._configured = False

    def check(self, line: str, number: int) -> str:
        self.count += 1
        if not is_text(line, os_text=True):
            raise UsageError(
                f"line {number} of --from-file {self.path} has a NUL character; nothing was queued"
            )
        size = self._prefix_bytes + limits.text_bytes(line)
        while True:
            try:
                if size > self.limits.command_bytes:
                    raise limits.over(
                        "the command", size, self.limits.command_bytes, "limits.command"
                    )
                limits.check_job_count(self.count * self.jobs_per_line, self.limits)
                return line
            except UsageError as exc:
                if self._configured:
                    raise UsageError(
                        f"line {number} of --from-file {self.path}: "
                        f"{exc.message}; nothing was queued"
                    ) from None
                self._use_config()

    def _use_config(self) -> None:
        from gpusched.core.config import load_settings  # noqa: PLC0415 - 70 ms; a sweep's limits only

        self.limits = limits.from_settings(load_settings(client_paths().config_file, environ={}))
        self._configured = True
