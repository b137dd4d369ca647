"""The --output/--error patterns, against what Slurm 22.05 made of them (sbatch on the
one-node Slurm of tests/slurmnode.py: job 2 with name myname of user root on host vm,
and elements 2 and 3 of array 21, whose ids were 27 and 21)."""

from __future__ import annotations

import pytest

from gpusched.core.spec.outpattern import expand, expand_path, known_dir

JOB = {"job_id": 2, "name": "myname", "user": "root", "host": "vm.example.org"}

# (pattern, what Slurm wrote for a job that is not an array element)
MEASURED = [
    ("o-%j.out", "o-2.out"),
    ("o-%4j.out", "o-0002.out"),
    ("o-%12j.out", "o-0000000002.out"),  # at most 10 wide
    ("o-%A_%a.out", "o-2_4294967294.out"),  # outside an array: own id, NO_VAL
    ("o-%5A.out", "o-00002.out"),
    ("o-%x.out", "o-myname.out"),
    ("o-%3x.out", "o-myname.out"),  # no padding for names
    ("o-%u.out", "o-root.out"),
    ("o-%N.out", "o-vm.out"),  # the short host name
    ("o-%%.out", "o-%.out"),
    ("o-%J.out", "o-2.out"),  # the batch step has no number
    ("o-%s.out", "o-batch.out"),
    ("o-%t.out", "o-0.out"),
    ("o-%n.out", "o-0.out"),
    ("o-%q.out", "o-%q.out"),  # not a field: kept
    ("o-%b.out", "o-%b.out"),
    ("o-%.out", "o-%.out"),
    ("o-%", "o-%"),
    ("o-\\%j.out", "o-%j.out"),  # a backslash: nothing expanded
]


@pytest.mark.parametrize("pattern,expected", MEASURED)
def test_patterns_expand_as_slurm_expanded_them(pattern, expected):
    assert expand(pattern, **JOB) == expected


def test_array_elements_expand_as_slurm_expanded_them():
    pattern = "a-%A_%a-%j-%3a.out"
    assert (
        expand(pattern, **{**JOB, "job_id": 27}, array_id=21, array_index=2) == "a-21_2-27-002.out"
    )
    assert (
        expand(pattern, **{**JOB, "job_id": 21}, array_id=21, array_index=3) == "a-21_3-21-003.out"
    )


def test_a_relative_pattern_is_relative_to_the_working_directory():
    assert expand_path("logs/%j.out", "/home/ann/run", **JOB) == "/home/ann/run/logs/2.out"
    assert expand_path("/scratch/%x.out", "/home/ann/run", **JOB) == "/scratch/myname.out"


def test_the_directory_is_known_before_the_id_unless_it_names_the_id():
    fields = {"name": "myname", "user": "ann", "host": "vm"}
    assert known_dir("logs/%x/%j.out", "/w", **fields) == "/w/logs/myname"
    assert known_dir("%j.out", "/w", **fields) == "/w"
    assert known_dir("run-%j/out", "/w", **fields) is None
    assert known_dir("run-%4A/out", "/w", **fields) is None
    assert known_dir("run-%%j/out", "/w", **fields) == "/w/run-%j"
