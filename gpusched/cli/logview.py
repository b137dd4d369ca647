"""`gpusched logs`: print a job's log file, and follow it while the job runs."""

from __future__ import annotations

import os
import sys
import time

from gpusched.core import logmark
from gpusched.core.errors import GpuschedError
from gpusched.proc.privileges import PrivilegeError, open_as_owner

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the fast command path
    from typing import Any

_FOLLOW_POLL_S = 0.2
# A terminal's control sequences: CSI (colours, cursor moves), OSC (titles, links) ended by
# BEL or ST, a character set's choice, and the other two-byte escapes; then the control
# characters but for tab and newline. And what may be the start of one, at a read's end.
_CONTROL = (
    rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()*+].|\x1b[ -~]"
    rb"|[\x00-\x08\x0b-\x1f\x7f]"
)
_UNFINISHED = rb"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[()*+])?\Z|\r\Z"


class PlainText:
    """`logs --plain`: a log without its terminal's control sequences, fed in pieces (a
    sequence split between two reads is held back until its end comes). Line ends become
    newlines: a carriage return alone (a redrawn progress bar) starts a line of its own."""

    def __init__(self) -> None:
        import re  # noqa: PLC0415 - 4 ms of every `logs`: --plain's only

        self.held = b""
        self.control, self.unfinished = re.compile(_CONTROL), re.compile(_UNFINISHED)

    def feed(self, data: bytes, final: bool = False) -> bytes:
        data = self.held + data
        unfinished = None if final else self.unfinished.search(data[-4096:])
        cut = len(data) - (len(unfinished.group()) if unfinished else 0)
        data, self.held = data[:cut], data[cut:]
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return self.control.sub(b"", data)


def pending_note(job: dict[str, Any], follow: bool) -> str:
    """Said once on stderr for a job that has not started: why it waits, what comes next."""
    started = (
        "has not started yet"
        if job["attempt"] <= 1  # else the log holds earlier runs
        else f"waits to start attempt {job['attempt']}"
    )
    reason = f" (pending: {job['pending_reason']})" if job["pending_reason"] else " (pending)"
    then = (
        "waiting for it to start, then following its output"
        if follow
        else f"`gpusched logs -f {job['id']}` waits for it and follows its output"
    )
    return f"job {job['id']} {started}{reason}; {then}"


def _read_on(fh: Any, shown: int) -> tuple[bytes, int]:
    """What follows the `shown` bytes of output already printed, and the new count. A log
    capped by [jobs] max_log_size may have been trimmed since: its mark line says how
    many bytes went (core/logmark.py), which places `shown` in what is left; the
    whole of it (mark line first) when nothing was printed yet or more went than was."""
    dropped, mark_bytes = logmark.read_mark(fh.read(logmark.MARK_MAX_BYTES))
    if shown and shown >= dropped:
        fh.seek(mark_bytes + shown - dropped)
        chunk = fh.read()
        return chunk, shown + len(chunk)
    fh.seek(0)
    chunk = fh.read()
    return chunk, dropped + len(chunk) - mark_bytes


def _read_log(job: dict[str, Any], path: str, shown: int) -> tuple[bytes, int]:
    """_read_on of the job's log, a regular file of its owner's, opened as the owner
    (root too: the path is the user's choice, and may name /etc/shadow or a device)."""
    try:
        with os.fdopen(open_as_owner(path, os.O_RDONLY, job["uid"]), "rb") as fh:
            return _read_on(fh, shown)
    except FileNotFoundError:
        return b"", shown  # not started yet: the shim creates the file
    except PrivilegeError:
        raise GpuschedError(
            f"not showing the log of job {job['id']}: {path} is not a regular "
            f"file of {job['user']}'s. Only such a file is shown"
        ) from None
    except PermissionError:
        who = "they may not read it either" if os.geteuid() == 0 else "read it as them or as root"
        raise GpuschedError(
            f"cannot read the log of job {job['id']} ({path}): it is "
            f"{job['user']}'s own file; {who}"
        ) from None
    except OSError as exc:
        raise GpuschedError(f"cannot read the log of job {job['id']} ({path}): {exc}") from None


def print_log(
    client: Any, job_id: int | str, stderr: bool = False, follow: bool = False, plain: bool = False
) -> None:
    # `logs`, not `show`: the daemon refuses (and audits) anyone but the owner or an admin.
    job = client.call("logs", id=job_id)["job"]
    path = job["stderr_path" if stderr else "stdout_path"]
    out = sys.stdout.buffer
    shown = 0  # bytes of the job's output shown so far, counting any dropped before
    if job["state"] == "pending":
        sys.stderr.write(pending_note(job, follow) + "\n")
        sys.stderr.flush()
    text = PlainText() if plain else None
    while True:
        chunk, shown = _read_log(job, path, shown)
        done = not follow or job["state"] not in ("pending", "running")
        out.write(text.feed(chunk, final=done) if text is not None else chunk)
        out.flush()
        if done:
            return
        time.sleep(_FOLLOW_POLL_S)
        job = client.call("logs", id=job_id)["job"]
