"""What the pending jobs' dependencies need to know, read once per scheduling pass: the
states of the jobs and arrays they name, the elements aftercorr pairs them with, and the
active jobs of the same user and name for singleton (core/dependencies.py decides)."""

from __future__ import annotations

from gpusched.core.dependencies import DependencyStates
from gpusched.core.models import Job, JobState
from gpusched.core.syntax import ANY_OF, SINGLETON
from gpusched.daemon.arrays import array_ended_as, array_state
from gpusched.daemon.state import DaemonState


def dependency_states(state: DaemonState, pending: list[Job]) -> DependencyStates:
    active, store = state.jobs, state.store
    wanted, paired, names = _named(pending)
    states = DependencyStates((i, active[i].state) for i in wanted if i in active)
    states.update(store.states(wanted - states.keys()))
    for array_id in wanted:
        elements = store.array(array_id)
        if len(elements) > 1:
            current = [active.get(j.id, j) for j in elements]
            states[array_id] = array_state([j.state for j in current])
            states.ended_as[array_id] = array_ended_as(array_id, current)
            if array_id in paired:
                states.elements.update(((array_id, j.array_index), j.state) for j in current)
    if names:
        states.same_name.update(_same_name(active.values(), names))
    return states


def _named(pending: list[Job]) -> tuple[set, set, set]:
    """The jobs named, the arrays aftercorr names, and the (uid, name) of singletons: one
    walk of a queue that may hold 100,000 jobs, most with no dependency."""
    wanted, paired, names = set(), set(), set()
    for job in pending:
        for kind, dep in job.dependencies:
            if kind == SINGLETON:
                names.add((job.uid, job.display_name))
            elif kind != ANY_OF:  # SINGLETON and ANY_OF name no job
                wanted.add(dep)
                if kind == "aftercorr":
                    paired.add(dep)
    return wanted, paired, names


def _same_name(active, names: set) -> dict:
    """(uid, name) -> the lowest started and the lowest pending of those active jobs: all
    that singleton needs (a queue may hold a 100,000-element array of one name)."""
    lowest: dict[tuple, dict[bool, tuple[int, JobState]]] = {}
    for job in active:  # every job that has not ended is active
        key = (job.uid, job.display_name)
        if key in names:
            kept = lowest.setdefault(key, {})
            started = job.state is not JobState.PENDING
            if started not in kept or job.id < kept[started][0]:
                kept[started] = (job.id, job.state)
    return {key: tuple(kept.values()) for key, kept in lowest.items()}
