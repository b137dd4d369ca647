"""Whether a job's dependencies are met, may still be, or never can be (pure, as Slurm reads
them): afterok, afterany, afternotok, after, aftercorr, singleton, all of them (`,`) or any
one of them (`?`). The daemon's scheduler and the preemption check both ask here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpusched.core.models import Job, JobState
from gpusched.core.spec.syntax import ANY_OF, SINGLETON

MET, WAIT, NEVER = "met", "wait", "never"
# In every reason of a dependency that can never be met: `wait` looks for it to stop.
NEVER_MET = "can never be met"


SameName = tuple[tuple[int, JobState], ...]  # (job id, state) of a user's jobs of one name


class SameNames(Protocol):
    """(uid, name) -> SameName: a dict, or the daemon's lookup that fills itself on demand."""

    def get(self, key: tuple[int, str], default: SameName, /) -> SameName: ...


class DependencyStates(dict[int, JobState]):
    """Job id -> JobState of the jobs depended on (an array's id: the whole array), and:
    `ended_as`, how an array ended in words ("element 12_3 (job 15) ended failed"), so
    that a reason names the element that failed, not the array's id (its first element);
    `elements`, (array id, index) -> state of the arrays aftercorr names;
    `same_name`, (uid, name) -> ((job id, state), ...) of the active jobs singleton asks
    about."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.ended_as: dict[int, str] = {}
        self.elements: dict[tuple[int, int], JobState] = {}
        self.same_name: SameNames = {}


def dependency_status(job: Job, states: Mapping[int, JobState]) -> tuple[bool, str]:
    """(can never be met, reason) for a job's unmet dependencies; (False, "") when met:
    all of them, or with Slurm's `?` (ANY_OF first) any one of them."""
    any_of = bool(job.dependencies) and job.dependencies[0][0] == ANY_OF
    # (the dependency as the user wrote it, verdict, what it waits for or why never)
    checked = [
        (kind if kind == SINGLETON else f"{kind}:{dep}", *_verdict(kind, dep, job, states))
        for kind, dep in job.dependencies
        if kind != ANY_OF
    ]
    waiting = [text for _, verdict, text in checked if verdict == WAIT]
    if any_of and checked:
        if any(verdict == MET for _, verdict, _ in checked):
            return False, ""
        if not waiting:
            return True, (
                f"dependency {'?'.join(word for word, _, _ in checked)} {NEVER_MET}"
                f": {'; '.join(text for _, _, text in checked)}"
            )
        return False, f"waiting for {' or '.join(waiting)}"
    for word, verdict, text in checked:
        if verdict == NEVER:
            return True, f"dependency {word} {NEVER_MET}: {text}"
    return False, f"waiting for {', '.join(waiting)}" if waiting else ""


def _verdict(kind: str, dep: int, job: Job, states: Mapping[int, JobState]) -> tuple[str, str]:
    """(MET, ""), (WAIT, what it waits for) or (NEVER, why not) for one dependency."""
    if kind == SINGLETON:
        return _singleton(job, getattr(states, "same_name", {}))
    label = f"{kind}:{dep}"
    state = states.get(dep)
    ended_as = getattr(states, "ended_as", {}).get(dep)
    if kind == "aftercorr":
        # Element N waits on element N of the array; without one (or not an array
        # itself), on the whole job, as afterok: both as Slurm does.
        element = getattr(states, "elements", {}).get((dep, job.array_index))
        if element is not None and job.array_index is not None:
            state, label = element, f"aftercorr:{dep}_{job.array_index}"
            ended_as = f"element {dep}_{job.array_index} ended {element.value}"
        kind = "afterok"
    if state is None:
        return NEVER, f"job {dep} does not exist"
    if kind == "after":  # met once the job started, or ended without starting
        return (WAIT, label) if state is JobState.PENDING else (MET, "")
    if not state.is_final:
        return WAIT, label
    ok = state is JobState.SUCCEEDED
    if (kind == "afterok" and not ok) or (kind == "afternotok" and ok):
        return NEVER, ended_as or f"job {dep} ended {state.value}"
    return MET, ""


def _singleton(job: Job, same_name: SameNames) -> tuple[str, str]:
    """Slurm's singleton: wait while another job of the same user and name runs, or waits
    ahead of this one in submission order; met whatever state they ended in."""
    for other_id, state in same_name.get((job.uid, job.display_name), ()):
        if (
            other_id != job.id
            and not state.is_final
            and (state is not JobState.PENDING or other_id < job.id)
        ):
            return (
                WAIT,
                f"singleton (job {other_id}, also named {job.display_name!r}, is {state.value})",
            )
    return MET, ""
