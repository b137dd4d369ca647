"""Topology: the best-linked GPU set (a pure function, under property tests), used by the
daemon and the simulator alike; `--topology strict`; the simulated topology."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import wait_until
from gpusched.core.sched import topology
from gpusched.sim.simulator import simulate
from gpusched.sim.traces import TraceJob

ISLANDS = topology.nvlink_islands("0-3,4-7", 8)
PCIE_LABELS = ("PIX", "PXB", "PHB", "NODE", "SYS")


@st.composite
def boxes(draw):
    """A symmetric link matrix, the GPUs in the policy's order, and how many a job asks."""
    n = draw(st.integers(2, 9))
    labels = st.sampled_from(("NV4", "NV12", *PCIE_LABELS))
    links = [["X"] * n for _ in range(n)]
    for a, b in combinations(range(n), 2):
        links[a][b] = links[b][a] = draw(labels)
    ordered = draw(st.permutations(range(n)))
    return links, list(ordered), draw(st.integers(1, n))


@settings(max_examples=300, deadline=None)
@given(boxes())
def test_the_chosen_set_is_the_best_linked_one(box):
    links, ordered, count = box
    chosen = topology.best_set(ordered, count, links)
    assert len(chosen) == len(set(chosen)) == count and set(chosen) <= set(ordered)
    best = min(topology.set_cost(c, links) for c in combinations(ordered, count))
    if count > 1 and len(ordered) > count:
        assert topology.set_cost(chosen, links) == best
    # In the policy's order: the first GPU is the one the policy likes best.
    assert list(chosen) == sorted(chosen, key=ordered.index)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=2, max_size=16, unique=True), st.integers(2, 8))
def test_one_nvlink_island_before_two_also_when_greedy(free, count):
    # 16 GPUs in four islands: C(16, 8) sets are too many to search, so this is greedy.
    links = topology.nvlink_islands("0-3,4-7,8-11,12-15", 16)
    count = min(count, len(free))
    chosen = topology.best_set(free, count, links)
    fits_one = any(sum(1 for g in free if g // 4 == island) >= count for island in range(4))
    assert len(chosen) == count
    if fits_one:
        assert len({g // 4 for g in chosen}) == 1


@given(st.permutations(range(8)), st.integers(0, 8))
def test_without_topology_the_policys_order_stands(ordered, count):
    assert topology.best_set(ordered, count, ()) == tuple(ordered[:count])


def test_simulator_places_by_the_same_code():
    jobs = [TraceJob("a", "u", 0.0, 2, 100.0, 200.0), TraceJob("b", "u", 1.0, 3, 50.0, 150.0)]
    flat = {r.job_id: r.gpu_indices for r in simulate(jobs, gpus=8)}
    linked = {r.job_id: r.gpu_indices for r in simulate(jobs, gpus=8, links=ISLANDS)}
    assert len({g // 4 for g in flat["b"]}) == 2  # the plain policy spans both islands
    assert len({g // 4 for g in linked["b"]}) == 1 and len(linked["b"]) == 3


def test_a_bad_simulated_topology_names_the_fix(make_home):
    home = make_home("8xH100-80GiB:nvlink=0-3,4-9")
    proc = home.run("daemon", "start", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "NVLink group '4-9'" in proc.stderr and "nvlink=0-3,4-7" in proc.stderr


def test_multi_gpu_jobs_get_one_nvlink_island_and_strict_waits(make_home):
    home = make_home("8xH100-80GiB:nvlink=0-3,4-7")
    home.start()
    first = home.submit("--gpus", "2", "--", "sleep", "300")
    assert sorted(home.wait_state(first, "running")["gpu_indices"]) == [6, 7]
    # Pack alone would take 3,4,5 across the islands; the island 0-3 has room for all.
    three = home.submit("--gpus", "3", "--", "sleep", "300")
    assert {g // 4 for g in home.wait_state(three, "running")["gpu_indices"]} == {0}
    home.run("cancel", str(three))
    home.wait_state(three, "cancelled")
    pair = home.submit("--gpus", "2", "--gpu-ids", "2,3", "--", "sleep", "300")
    home.wait_state(pair, "running")
    # Free: 0, 1, 4, 5: four GPUs, but across the islands.
    strict = home.submit("--gpus", "4", "--topology", "strict", "--", "sleep", "300")
    reason = wait_until(lambda: home.show(strict)["pending_reason"], "strict's reason")
    assert "--topology strict" in reason and "NVLink" in reason and "SYS" in reason
    assert "topology=strict" in home.run("show", str(strict)).stdout
    home.run("cancel", str(pair))
    assert {g // 4 for g in home.wait_state(strict, "running")["gpu_indices"]} == {0}
    for job_id in (first, strict):
        home.run("cancel", str(job_id))


def test_topology_takes_only_its_choices(make_home):
    home = make_home("8xH100-80GiB:nvlink=0-3,4-7")
    home.start()
    proc = home.run("submit", "--gpus", "2", "--topology", "strcit", "--", "true", check=False)
    assert proc.returncode in (1, 2) and "best, strict" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_gpus_topology_prints_the_simulated_matrix(make_home):
    home = make_home("8xH100-80GiB:nvlink=0-3,4-7")
    home.start()
    for env in ({}, {"GPUSCHED_NO_FAST_PATH": "1"}):
        lines = home.run("gpus", "--topology", env=env).stdout.splitlines()
        assert lines[0].split("\t")[1:] == [f"GPU{i}" for i in range(8)] + [
            "CPU Affinity",
            "NUMA Affinity",
        ]
        assert lines[1].split("\t")[:9] == [
            "GPU0",
            " X ",
            "NV18",
            "NV18",
            "NV18",
            "SYS",
            "SYS",
            "SYS",
            "SYS",
        ]
        assert "Legend:" in lines and any(line.startswith("  NV#") for line in lines)
    data = home.json("gpus", "--topology")
    assert data["links"] == [list(row) for row in ISLANDS]


@pytest.mark.parametrize("spec, expected", [("1xH100-80GiB", "\tGPU0"), ("4x80GiB", "unknown")])
def test_gpus_topology_without_links(make_home, spec, expected):
    home = make_home(spec)
    home.start()
    assert expected in home.run("gpus", "--topology").stdout
