"""`gpusched logs`: print a job's log file, and follow it while the job runs."""

from __future__ import annotations

import sys
import time
from typing import Any

from gpusched.errors import GpuschedError

_FOLLOW_POLL_S = 0.2


def print_log(client: Any, job_id: int, stderr: bool = False, follow: bool = False) -> None:
    job = client.call("show", ids=[job_id])["jobs"][0]
    path = job["stderr_path" if stderr else "stdout_path"]
    out = sys.stdout.buffer
    offset = 0
    while True:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""  # not started yet: the shim creates the file
        except OSError as exc:
            raise GpuschedError(f"cannot read the log of job {job_id} ({path}): {exc}") from None
        out.write(chunk)
        out.flush()
        offset += len(chunk)
        if not follow or job["state"] not in ("pending", "running"):
            return
        time.sleep(_FOLLOW_POLL_S)
        job = client.call("show", ids=[job_id])["jobs"][0]
