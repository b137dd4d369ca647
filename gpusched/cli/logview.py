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


def print_log(client: Any, job_id: int | str, stderr: bool = False, follow: bool = False) -> None:
    # `logs`, not `show`: the daemon refuses (and audits) anyone but the owner or an admin.
    job = client.call("logs", id=job_id)["job"]
    path = job["stderr_path" if stderr else "stdout_path"]
    out = sys.stdout.buffer
    shown = 0  # bytes of the job's output shown so far, counting any dropped before
    if job["state"] == "pending":
        sys.stderr.write(pending_note(job, follow) + "\n")
        sys.stderr.flush()
    while True:
        chunk, shown = _read_log(job, path, shown)
        out.write(chunk)
        out.flush()
        if not follow or job["state"] not in ("pending", "running"):
            return
        time.sleep(_FOLLOW_POLL_S)
        job = client.call("logs", id=job_id)["job"]
