"""A cluster job's dependencies, decided: on a parent still in Slurm, a Slurm dependency;
on a parent that ended, decided by gpusched (a Slurm id purged long ago counts as met)."""

from __future__ import annotations

from typing import Any

from gpusched.core.models import Job, JobState
from gpusched.core.sched.dependencies import dependency_status

WAIT, NEVER, MET, SLURM = "wait", "never", "met", "slurm"


def dependency_state(
    kind: str, parent: Job | None, run: dict[str, Any] | None, elements: list[Job]
) -> tuple[str, str]:
    """(verdict, Slurm id) of one dependency: WAIT (not yet handed over, or retries may
    follow), NEVER, MET, or SLURM with the id Slurm should wait on. `elements`: the
    parent's array when the dependency names a whole array."""
    if parent is None:
        return NEVER, ""
    whole_array = len(elements) > 1
    states = {parent.id: _array_state(elements) if whole_array else parent.state}
    if states[parent.id].is_final or (
        kind == "after" and states[parent.id] is not JobState.PENDING
    ):
        never, why = dependency_status(
            Job(id=0, command=(), cwd="", uid=0, user="", dependencies=((kind, parent.id),)), states
        )
        return (NEVER if never else WAIT if why else MET), ""
    if run is None or any(j.attempt <= j.retries for j in elements or [parent]):
        # A parent that may be retried is waited for here: its first Slurm job failing
        # would make Slurm cancel this one.
        return WAIT, ""
    key = run["slurm"].get(str(parent.attempt))
    if key is None:
        return WAIT, ""
    return SLURM, key.split("_")[0] if whole_array else key


def _array_state(elements: list[Job]) -> JobState:
    states = [j.state for j in elements]
    if not all(s.is_final for s in states):
        return JobState.RUNNING if JobState.RUNNING in states else JobState.PENDING
    return JobState.SUCCEEDED if all(s is JobState.SUCCEEDED for s in states) else JobState.FAILED
