"""`gpusched top` marks a running job whose GPUs sat idle past [idle] after."""

from __future__ import annotations

import re

from test_tui import NOW, _job, _jobs, frame


def test_an_idle_job_says_so_in_the_running_panel():
    idle = _job(
        20,
        "running",
        "me",
        1000,
        "notebook",
        gpu_indices=(3,),
        gpus_requested=1,
        started_at=NOW - 3600,
        gpu_idle_since=NOW - 1800,
    )
    for width in (60, 80, 140):
        text = frame(width, jobs=_jobs() + (idle,))
        assert re.search(r"│ +20 +me +notebook +idle ", text), text
        assert re.search(r"│ +9 +me +eval +running ", text), text
