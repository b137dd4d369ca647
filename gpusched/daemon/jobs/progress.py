"""A running job's last gpusched.job.progress() report, as `ls`, `show`, `top` and /metrics
show it."""

from __future__ import annotations

from typing import Any

from gpusched.client.paths import Paths
from gpusched.core.models import Job
from gpusched.job import read_progress_file
from gpusched.proc import runfile


def progress_of(job: Job | None, paths: Paths) -> dict[str, Any] | None:
    """A running job's last gpusched.job.progress() report, one small file read; None for
    other jobs, and for a report from an earlier attempt. It is beside gpusched's own
    logs of the job (jobenv), even when the job's output goes to a file of the user's."""
    if job is None or not job.is_running or not job.stdout_path:
        return None
    own_stdout = runfile.own_log_paths(paths.jobs_dir, paths.log_root, job.user, job.id)[0]
    report = read_progress_file(runfile.progress_path(own_stdout, job.id), owner_uid=job.uid)
    return None if report is None or report["updated_at"] < (job.started_at or 0.0) else report
