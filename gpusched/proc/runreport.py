"""A runner's word to the daemon, for both runners (the supervisor and the shim): the run
file begun, a start that failed, an end recorded, the daemon woken, and the record made
durable unless the daemon says it stored the end. Standard library only."""

from __future__ import annotations

import os
import socket
import time

from gpusched.proc import runfile

TYPE_CHECKING = False  # not typing: in the shim's import chain (tests/test_boundaries.py)
if TYPE_CHECKING:
    from typing import Any


def begin_run(
    spec: dict[str, Any], spec_line: bytes | None, supervised: tuple[int, int] | None = None
) -> str | None:
    """runfile.begin_run_file; None if it cannot be made, the daemon told (start_failed)."""
    try:
        return runfile.begin_run_file(spec, spec_line, supervised)
    except OSError as exc:
        start_failed(spec, f"cannot create its run file: {exc}")
        return None


def start_failed(spec: dict[str, Any], why: str, run_path: str | None = None) -> None:
    """The one way a runner tells the daemon that the job did not start: an exit record
    (127, why) in its run file, flushed, then a wake-up; or, when the job has no run file
    (run_path None), a wake-up that says why (runfile.launch_failure)."""
    if run_path is None:
        notify_daemon(spec, runfile.launch_failure(spec["job_id"], why))
        return
    try:
        runfile.append_exit(
            run_path, runfile.ExitRecord(127, None, time.time(), why), spec.get("run")
        )
    except OSError:  # its file went since: the wake-up says why instead
        notify_daemon(spec, runfile.launch_failure(spec["job_id"], why))
        return
    make_durable([run_path])
    reply_on = notify_daemon(spec)
    if reply_on is not None:
        reply_on.close()


# How long a runner waits for the daemon to say it stored the job's end before it makes the
# exit record durable itself. A daemon answers within its pass (milliseconds); one that
# is stopped, or cannot write its queue, never does.
STORED_WAIT_S = 1.0


def notify_daemon(spec: dict[str, Any], message: bytes = runfile.WAKE) -> socket.socket | None:
    """Best effort: wake the daemon now rather than at its next pass (half a second).

    One datagram: the daemon reads the exit record itself, so the usual message carries
    nothing and a lost one costs only that wait. The plain wake-up goes from a socket
    named for the run (runfile.end_address), returned for the daemon's answer (None if it
    could not be sent so).
    """
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        if message == runfile.WAKE and spec.get("run"):
            try:
                sock.bind(runfile.end_address(os.getpid(), spec["run"]))
            except OSError:
                pass  # not Linux, or the name is taken: a wake-up all the same
        sock.setblocking(False)
        sock.sendto(message[: runfile.WAKE_MAX_BYTES], spec["wake"])
        if sock.getsockname():
            return sock
    except OSError:
        pass
    sock.close()
    return None


def end_is_stored(sock: socket.socket, wake_path: str) -> bool:
    """Whether the daemon says, within STORED_WAIT_S, that it stored the job's end in its
    queue. Only its wake socket can send from that path (a private directory)."""
    deadline = time.monotonic() + STORED_WAIT_S
    with sock:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                message, sender = sock.recvfrom(64)
            except OSError:  # the wait ran out
                return False
            if message == runfile.STORED and sender == wake_path:
                return True
    return False


def record_exit(run_path: str, spec: dict[str, Any], record: runfile.ExitRecord) -> None:
    """Append the exit record, wake the daemon, and make the record durable unless the
    daemon says it has stored the end in its queue (synchronous) already.

    The record's own fsync (of the file and its directory) matters only while no daemon
    runs; a running one answers within milliseconds, which spares two disk flushes a job
    (and, on ext4, the directory's lock that every other job's file creations wait for).
    The supervisor does the same for many jobs at once, in its loop (supervisor/ends.py).
    """
    runfile.append_exit(run_path, record, spec.get("run"))
    reply_on = notify_daemon(spec)
    if reply_on is not None and end_is_stored(reply_on, spec["wake"]):
        return
    make_durable([run_path])


def make_durable(paths: list[str]) -> None:
    """fsync each run file, then each of their directories once, so that the records and
    the names survive a power cut. A file gone is no failure: the daemon has read its
    record already and cleared it for a retry."""
    for path in paths:
        _fsync(path)
    for directory in {os.path.dirname(path) or "." for path in paths}:
        _fsync(directory)


def _fsync(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
