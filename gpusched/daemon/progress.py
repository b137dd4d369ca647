"""A running job's last gpusched.job.progress() report, as `ls`, `show`, `top` and /metrics
show it."""

from __future__ import annotations

from gpusched.core.models import Job
from gpusched.job import read_progress_file
from gpusched.proc import runfile


def progress_of(job: Job | None) -> dict | None:
    """A running job's last gpusched.job.progress() report, one small file read; None for
    other jobs, and for a report from an earlier attempt."""
    if job is None or not job.is_running or not job.stdout_path:
        return None
    report = read_progress_file(runfile.progress_path(job.stdout_path, job.id),
                                owner_uid=job.uid)
    return None if report is None or report["updated_at"] < (job.started_at or 0.0) else report
