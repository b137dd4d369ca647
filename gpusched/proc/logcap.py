"""[jobs] max_log_size: with a cap, the shim reads the job's output through pipes and keeps
each log under it, dropping the oldest part and saying so in a line at the log's head.

Without a cap the job writes its logs itself, straight to the files (the fast path).
With one, a thread of the shim per log copies what the job writes; when the log passes
the cap it is rewritten in place to its newest half under a mark line (core/logmark.py)
that counts every byte dropped, so nothing but the oldest part is lost and `logs -f`
keeps its place. The shim outlives the daemon, and so does the copying. Standard
library only: the shim imports this module when a job has a cap.
"""

from __future__ import annotations

import os
import socket
import stat
import threading

from gpusched.core import logmark

TYPE_CHECKING = False  # not typing: in the shim's import chain (tests/test_boundaries.py)
if TYPE_CHECKING:
    from typing import Any

_CHUNK_BYTES = 1 << 16
_FINISH_S = 10.0  # a process that escaped the job's end may hold a pipe open: not for ever
_pumps: list[threading.Thread] = []


def layout(out_fd: int, err_fd: int) -> tuple[bool, bool, bool]:
    """Of a job's two opened outputs: whether each is a regular file, which a capped copy
    keeps (/dev/null or a terminal is written directly), and whether both are the
    one file (`--output` without `--error`: one log, so one copy of both)."""
    out_info, err_info = os.fstat(out_fd), os.fstat(err_fd)
    same = (out_info.st_dev, out_info.st_ino) == (err_info.st_dev, err_info.st_ino)
    return stat.S_ISREG(out_info.st_mode), stat.S_ISREG(err_info.st_mode), same


def outputs(spec: dict[str, Any], out_fd: int, err_fd: int) -> tuple[int, int]:
    """For a job with a cap (spec["max_log_bytes"]), given its opened outputs: what the
    job writes to instead, pipes whose other ends the shim's threads copy into the logs
    once start() runs, after the job is spawned (see layout). The caller closes both."""
    cap = int(spec["max_log_bytes"])
    out_capped, err_capped, same = layout(out_fd, err_fd)
    out_end = _piped(out_fd, cap) if out_capped else out_fd
    if same:
        os.close(err_fd)
        return out_end, os.dup(out_end)
    return out_end, _piped(err_fd, cap) if err_capped else err_fd


def _piped(log_fd: int, cap: int) -> int:
    """A pipe's write end, whose read end a thread copies into the log (taken over)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    _pumps.append(
        threading.Thread(target=_copy, daemon=True, args=(read_end, CappedLog(log_fd, cap)))
    )
    return write_end


class Handoff:
    """System mode: the job's child opens its logs as the job's user (root never opens a
    user-named path) and hands them to the shim over a socket, before it execs the job
    with pipes for its output. Made before the fork; in_child and in_parent after it."""

    def __init__(self, spec: dict[str, Any]):
        self.cap = int(spec["max_log_bytes"])
        self.pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(2)]  # (read end, write end)
        self.parent_sock, self.child_sock = socket.socketpair()

    def in_child(self, out_fd: int, err_fd: int) -> tuple[int, int]:
        """Send the logs that get a capped copy (see layout), saying which; what the
        job's stdout and stderr are instead: a pipe's write end, or the file itself."""
        out_capped, err_capped, same = layout(out_fd, err_fd)
        capped = (out_capped, err_capped and not same)
        socket.send_fds(
            self.child_sock,
            [b"".join(b"1" if c else b"0" for c in capped)],
            [fd for fd, c in zip((out_fd, err_fd), capped) if c],
        )
        ends = [out_fd, err_fd]
        for i, is_capped in enumerate(capped):
            if is_capped:
                os.close(ends[i])
                ends[i] = self.pipes[i][1]
        if same and out_capped:
            os.close(err_fd)
            ends[1] = ends[0]  # one pipe, one copy, for both
        return ends[0], ends[1]

    def in_parent(self) -> None:
        """The logs from the child (unless it failed before sending them), each copied
        from its pipe once start() runs; a pipe without a log is closed."""
        self.child_sock.close()
        for _, write_end in self.pipes:
            os.close(write_end)
        which, fds, _, _ = socket.recv_fds(self.parent_sock, 16, 2)
        self.parent_sock.close()
        logs = iter(fds)
        for i, (read_end, _) in enumerate(self.pipes):
            if which[i : i + 1] == b"1" and len(fds) == which.count(b"1"):
                _pumps.append(
                    threading.Thread(
                        target=_copy, daemon=True, args=(read_end, CappedLog(next(logs), self.cap))
                    )
                )
            else:
                os.close(read_end)
        if len(fds) != which.count(b"1"):
            for fd in fds:
                os.close(fd)


def start() -> None:
    """Copying starts (threads only once the job is spawned: nothing forks after)."""
    for pump in _pumps:
        pump.start()


def finish() -> None:
    """Once the job and its leftovers are gone: wait for the last of their output."""
    for pump in _pumps:
        if pump.is_alive():
            pump.join(_FINISH_S)


def _copy(read_end: int, log: CappedLog) -> None:
    try:
        while chunk := os.read(read_end, _CHUNK_BYTES):
            try:
                log.write(chunk)
            except OSError:
                pass  # a full disk: the output is lost, but the job must not get SIGPIPE
    finally:
        os.close(read_end)
        os.close(log.fd)


class CappedLog:
    """A log file that never grows past cap_bytes (its mark line aside)."""

    def __init__(self, fd: int, cap_bytes: int):
        # fd was opened for appending; pread needs it readable, so reopen it read-write
        # through /proc: the same file, whatever has become of its path since.
        self.fd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
        self.cap_bytes = cap_bytes
        self.cap = max(cap_bytes, 2 * logmark.MARK_MAX_BYTES)  # room for the mark line
        self.size = os.fstat(self.fd).st_size  # a retry's log goes on after the last run's

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, self.size)
            self.size += written
            view = view[written:]
        if self.size > self.cap:
            self.trim()

    def trim(self) -> None:
        """Keep the newest half, from a line's start when one is near, under a mark line
        counting every byte dropped so far (earlier trims' too)."""
        dropped, mark_bytes = logmark.read_mark(os.pread(self.fd, logmark.MARK_MAX_BYTES, 0))
        keep = self.cap // 2
        kept = os.pread(self.fd, keep, self.size - keep)
        line_start = kept.find(b"\n", 0, min(len(kept) - 1, 4096))
        if line_start >= 0:
            kept = kept[line_start + 1 :]
        dropped += self.size - mark_bytes - len(kept)
        text = logmark.mark_line(dropped, self.cap_bytes) + kept
        os.pwrite(self.fd, text, 0)
        os.ftruncate(self.fd, len(text))
        self.size = len(text)
