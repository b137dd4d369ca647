"""Dependency kinds as Slurm reads them, decided by the one pure function
(core/sched/dependencies.py): afterok, afterany, afternotok, after, aftercorr, singleton, all of
them (`,`) and any of them (`?`), and the scheduler's use of it (--kill-on-invalid-dep)."""

from __future__ import annotations

import pytest

from gpusched.core.errors import UsageError
from gpusched.core.models import Inventory, Job, JobState, job_to_dict
from gpusched.core.sched.dependencies import DependencyStates, dependency_status
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import QueueRules
from gpusched.core.sched.scheduling import schedule
from gpusched.core.spec import jobspec, syntax

S, F, P, R = JobState.SUCCEEDED, JobState.FAILED, JobState.PENDING, JobState.RUNNING
C, T = JobState.CANCELLED, JobState.TIMEOUT


def job(*deps, job_id=50, name="x", uid=1000, index=None, kill=False) -> Job:
    return Job(
        id=job_id,
        command=("true",),
        cwd="/",
        uid=uid,
        user="u",
        name=name,
        dependencies=tuple(deps),
        array_id=None if index is None else 40,
        array_index=index,
        kill_on_invalid_dep=kill,
    )


def states(**by_id) -> DependencyStates:
    return DependencyStates({int(k[1:]): v for k, v in by_id.items()})


def status(the_job, dep_states):
    never, why = dependency_status(the_job, dep_states)
    return "never" if never else "wait" if why else "met"


# -- one kind at a time: the parent's state -> met, wait or never ---------------------------
@pytest.mark.parametrize(
    "kind, parent, expected",
    [
        ("afterok", S, "met"),
        ("afterok", F, "never"),
        ("afterok", C, "never"),
        ("afterok", R, "wait"),
        ("afterok", P, "wait"),
        ("afterany", S, "met"),
        ("afterany", F, "met"),
        ("afterany", T, "met"),
        ("afterany", R, "wait"),
        ("afternotok", F, "met"),
        ("afternotok", T, "met"),
        ("afternotok", S, "never"),
        ("afternotok", R, "wait"),
        ("after", R, "met"),
        ("after", S, "met"),
        ("after", C, "met"),
        ("after", P, "wait"),
        # aftercorr on a job that is not an array: afterok on it, as in Slurm
        ("aftercorr", S, "met"),
        ("aftercorr", F, "never"),
        ("aftercorr", R, "wait"),
    ],
)
def test_each_kind_on_each_parent_state(kind, parent, expected):
    assert status(job((kind, 7)), states(j7=parent)) == expected


@pytest.mark.parametrize("kind", syntax.DEPENDENCY_KINDS)
def test_a_job_that_does_not_exist_never_meets_any_kind(kind):
    never, why = dependency_status(job((kind, 7)), states())
    assert never and why == f"dependency {kind}:7 can never be met: job 7 does not exist"


# -- aftercorr ------------------------------------------------------------------------------
def corr_states(**elements) -> DependencyStates:
    """Array 30 with elements by index (i0=S, i1=F, ...); its whole state is FAILED
    when one failed, as daemon/arrays.array_state says."""
    found = DependencyStates({30: F if F in elements.values() else S})
    found.elements.update({(30, int(k[1:])): v for k, v in elements.items()})
    found.ended_as[30] = "element 30_1 (job 32) ended failed"
    return found


@pytest.mark.parametrize("index, expected", [(0, "met"), (1, "never"), (2, "wait"), (3, "wait")])
def test_aftercorr_waits_on_the_element_of_the_same_index(index, expected):
    dep_states = corr_states(i0=S, i1=F, i2=R, i3=P)
    assert status(job(("aftercorr", 30), index=index), dep_states) == expected


def test_aftercorr_names_the_element_it_waits_on_and_the_one_that_failed():
    dep_states = corr_states(i0=S, i1=F, i2=R)
    assert dependency_status(job(("aftercorr", 30), index=2), dep_states) == (
        False,
        "waiting for aftercorr:30_2",
    )
    assert dependency_status(job(("aftercorr", 30), index=1), dep_states) == (
        True,
        "dependency aftercorr:30 can never be met: element 30_1 ended failed",
    )


def test_aftercorr_without_a_corresponding_element_waits_on_the_whole_array():
    """Slurm: element 4 of a 0-4 array after a 0-3 array waits for all of it (and never
    runs when one element failed); a job that is no array does the same."""
    failed = corr_states(i0=S, i1=F)
    assert dependency_status(job(("aftercorr", 30), index=4), failed) == (
        True,
        "dependency aftercorr:30 can never be met: element 30_1 (job 32) ended failed",
    )
    assert status(job(("aftercorr", 30)), failed) == "never"
    assert status(job(("aftercorr", 30), index=4), corr_states(i0=S, i1=S)) == "met"


# -- singleton ------------------------------------------------------------------------------
def named(*others, name="x", uid=1000) -> DependencyStates:
    found = DependencyStates()
    found.same_name[(uid, name)] = tuple(others)
    return found


@pytest.mark.parametrize(
    "others, expected",
    [
        ((), "met"),
        (((50, P),), "met"),  # itself
        (((10, R),), "wait"),  # an earlier one runs
        (((60, R),), "wait"),  # a later one runs: one at a time, as in Slurm
        (((10, P),), "wait"),  # an earlier one waits ahead of it (held, or for GPUs)
        (((60, P),), "met"),  # a later one waits behind it
        (((10, F),), "met"),  # ended, whatever the state
        (((10, C), (60, P)), "met"),
    ],
)
def test_singleton_waits_while_a_job_of_its_name_runs_or_waits_ahead(others, expected):
    assert status(job((syntax.SINGLETON, 0)), named(*others)) == expected


def test_singleton_asks_only_about_its_own_user_and_name():
    assert status(job((syntax.SINGLETON, 0), name="y"), named((10, R))) == "met"
    assert status(job((syntax.SINGLETON, 0), uid=1001), named((10, R))) == "met"
    assert dependency_status(job((syntax.SINGLETON, 0)), named((10, R))) == (
        False,
        "waiting for singleton (job 10, also named 'x', is running)",
    )


def test_a_job_without_a_name_is_named_by_its_command_for_singleton():
    nameless = Job(
        id=50,
        command=("/opt/bin/train.sh",),
        cwd="/",
        uid=1000,
        user="u",
        dependencies=((syntax.SINGLETON, 0),),
    )
    assert status(nameless, named((10, R), name="train.sh")) == "wait"


# -- all of them (`,`) and any of them (`?`) ------------------------------------------------
ANY = (syntax.ANY_OF, 0)


@pytest.mark.parametrize(
    "first, second, all_of, any_of",
    [
        (S, S, "met", "met"),
        (S, R, "wait", "met"),
        (R, R, "wait", "wait"),
        (F, R, "never", "wait"),
        (F, S, "never", "met"),
        (F, F, "never", "never"),
    ],
)
def test_all_of_and_any_of_two_afterok(first, second, all_of, any_of):
    dep_states = states(j7=first, j8=second)
    assert status(job(("afterok", 7), ("afterok", 8)), dep_states) == all_of
    assert status(job(ANY, ("afterok", 7), ("afterok", 8)), dep_states) == any_of


def test_any_of_says_what_it_waits_for_and_why_it_never_can_be():
    dep_states = states(j7=F, j8=R, j9=S)
    assert dependency_status(job(ANY, ("afterok", 7), ("afterok", 8)), dep_states) == (
        False,
        "waiting for afterok:8",
    )
    assert dependency_status(job(ANY, ("afterok", 7), ("afternotok", 9)), dep_states) == (
        True,
        "dependency afterok:7?afternotok:9 can never be met: job 7 ended failed; "
        "job 9 ended succeeded",
    )
    assert dependency_status(job(ANY, ("afterok", 8), (syntax.SINGLETON, 0)), named((10, R))) == (
        False,
        "waiting for singleton (job 10, also named 'x', is running)",
    )


def test_any_of_with_singleton_is_met_by_either():
    dep_states = named((10, R))
    dep_states[7] = F
    assert status(job(ANY, ("afterok", 7), (syntax.SINGLETON, 0)), dep_states) == "wait"
    assert status(job(ANY, ("afterany", 7), (syntax.SINGLETON, 0)), dep_states) == "met"
    assert status(job(("afterany", 7), (syntax.SINGLETON, 0)), dep_states) == "wait"


# -- the scheduler: --kill-on-invalid-dep=yes cancels, =no keeps it pending with the reason -
@pytest.mark.parametrize("kill", [True, False])
def test_a_never_met_dependency_cancels_only_with_kill_on_invalid_dep(kill):
    pending = [job(ANY, ("afterok", 7), ("afterok", 8), kill=kill)]
    plan = schedule(
        pending,
        [],
        {},
        Inventory(),
        PlacementRules(),
        QueueRules(),
        now=0.0,
        dep_states=states(j7=F, j8=C),
    )
    why = (
        "dependency afterok:7?afterok:8 can never be met: job 7 ended failed; job 8 ended cancelled"
    )
    assert (plan.cancels, plan.reasons) == (({50: why}, {}) if kill else ({}, {50: why}))
    assert not plan.starts


def test_the_scheduler_holds_a_singleton_when_no_job_id_is_depended_on():
    """States for singleton alone hold no job ids: an empty dict, still to be asked."""
    plan = schedule(
        [job((syntax.SINGLETON, 0))],
        [],
        {},
        Inventory(),
        PlacementRules(),
        QueueRules(),
        now=0.0,
        dep_states=named((10, R)),
    )
    assert not plan.starts
    assert plan.reasons[50].startswith("waiting for singleton")


# -- the parser, shared by submit, its fast path and #SBATCH lines --------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("singleton", [("singleton", 0)]),
        ("afterok:3,singleton", [("afterok", 3), ("singleton", 0)]),
        ("aftercorr:5", [("aftercorr", 5)]),
        ("aftercorr:5_2", [("aftercorr", "5_2")]),
        ("afterok:3?afterany:4:5", [ANY, ("afterok", 3), ("afterany", 4), ("afterany", 5)]),
        ("afterok:3?singleton", [ANY, ("afterok", 3), ("singleton", 0)]),
        ("AFTERCORR:5?SINGLETON", [ANY, ("aftercorr", 5), ("singleton", 0)]),
    ],
)
def test_parse_dependencies_new_kinds(text, expected):
    assert syntax.parse_dependencies([], [text]) == expected


@pytest.mark.parametrize(
    "after, dependency, words",
    [
        ([], ["afterok:3?afterok:4,afterany:5"], "mixes '?' (any of) with ','"),
        ([], ["afterok:3,afterok:4?afterany:5"], "mixes '?' (any of) with ','"),
        (["3"], ["afterok:4?afterany:5"], "mixes '?'"),
        ([], ["afterok:4?afterany:5", "afterok:6"], "mixes '?'"),
        ([], ["singleton:3"], "or singleton, not 'singleton:3'"),
        ([], ["aftercorr"], "KIND:ID"),
    ],
)
def test_parse_dependencies_refuses_mixes_and_bad_forms(after, dependency, words):
    with pytest.raises(UsageError) as caught:
        syntax.parse_dependencies(after, dependency)
    assert words in caught.value.message


def test_dependencies_are_shown_as_slurm_writes_them():
    deps = jobspec.check_job_spec(
        {"command": ["true"], "dependencies": [["afterok", 3], ["?", 0], ["singleton", 0]]},
        ("default",),
    )["dependencies"]
    assert deps == (ANY, ("afterok", 3), ("singleton", 0))  # the marker comes first
    the_job = job(*deps)
    assert job_to_dict(the_job)["dependencies"] == ["afterok:3?singleton"]
    assert job_to_dict(job(("afterok", 3), ("singleton", 0)))["dependencies"] == [
        "afterok:3",
        "singleton",
    ]


@pytest.mark.parametrize(
    "deps", [[["singleton", 3]], [["?", 1]], [["aftercorr", -1]], [["singleton", False]]]
)
def test_the_daemon_refuses_malformed_id_less_kinds(deps):
    with pytest.raises(UsageError, match="dependencies must be"):
        jobspec.check_job_spec({"command": ["true"], "dependencies": deps}, ("default",))
