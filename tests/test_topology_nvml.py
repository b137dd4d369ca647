"""Topology read through NVML (fake NVML underneath the real pynvml): an 8-GPU NVLink box
(two islands, or NVSwitch all to all), a PCIe box on two sockets; `gpus --topology` from a
real daemon; cpu_binding takes the cores nearest the job's GPUs."""

from __future__ import annotations

import os

import pytest

from fake_nvml import FakeDriver, fake_nvml, make_gpu, nvlink_box, pcie_box
from gpusched.core.models import GpuInfo
from gpusched.core.sched import topology
from gpusched.daemon.host import Host, near_cpus, pick_cpus
from gpusched.gpus.nvml import NvmlBackend
from nvmlhome import nvml_home

__all__ = ["fake_nvml"]


def test_two_nvlink_islands(fake_nvml):
    fake_nvml(FakeDriver(gpus=nvlink_box()))
    inv = NvmlBackend().read()
    links = inv.links
    assert links[0] == ("X", "NV6", "NV6", "NV6", "SYS", "SYS", "SYS", "SYS")
    assert links[5] == ("SYS", "SYS", "SYS", "SYS", "NV6", "X", "NV6", "NV6")
    assert [g.numa_node for g in inv.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv.gpus[4].cpu_ids == tuple(range(48, 96))
    assert topology.best_set([0, 4, 5, 6, 1, 7], 4, links) == (4, 5, 6, 7)


def test_nvswitch_links_every_gpu(fake_nvml):
    fake_nvml(FakeDriver(gpus=nvlink_box(switched=True)))
    links = NvmlBackend().read().links
    assert all(links[a][b] == ("X" if a == b else "NV18") for a in range(8) for b in range(8))


def test_pcie_box_on_two_sockets(fake_nvml):
    lib = fake_nvml(FakeDriver(gpus=pcie_box()))
    backend = NvmlBackend()
    links = backend.read().links
    assert links[0] == ("X", "PIX", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS")
    assert links[6][7] == "PIX" and links[6][5] == "NODE"
    # Same PCIe switch before crossing sockets.
    assert topology.best_set([0, 4, 2, 3], 2, links) == (2, 3)
    # The links are fixed by the hardware: read once, not on every tick.
    asked = lib.calls.count("nvmlDeviceGetTopologyCommonAncestor")
    backend.read()
    assert lib.calls.count("nvmlDeviceGetTopologyCommonAncestor") == asked


def test_a_box_that_hides_its_pcie_tree_has_no_topology(fake_nvml):
    fake_nvml(FakeDriver(gpus=[make_gpu("H100", 0), make_gpu("H100", 1)]))
    inv = NvmlBackend().read()
    assert inv.links == () and inv.gpus[0].cpu_ids == () and inv.gpus[0].numa_node is None


def test_a_lost_gpu_is_not_asked_for_its_links(fake_nvml):
    gpus = pcie_box(count=4)
    gpus[1].is_lost = True
    fake_nvml(FakeDriver(gpus=gpus))
    links = NvmlBackend().read().links
    assert links[0] == ("X", "N/A", "NODE", "NODE") and links[2][3] == "PIX"


def test_gpus_topology_matches_nvidia_smi(make_home, tmp_path):
    home = nvml_home(make_home, tmp_path, FakeDriver(gpus=pcie_box(count=4)))
    home.start()
    for env in ({}, {"GPUSCHED_NO_FAST_PATH": "1"}):
        lines = home.run("gpus", "--topology", env=env).stdout.splitlines()
        assert lines[:5] == [
            "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity",
            "GPU0\t X \tPIX\tNODE\tNODE\t0-47\t0",
            "GPU1\tPIX\t X \tNODE\tNODE\t0-47\t0",
            "GPU2\tNODE\tNODE\t X \tPIX\t0-47\t0",
            "GPU3\tNODE\tNODE\tPIX\t X \t0-47\t0",
        ]
        assert "  PIX  = Connection traversing at most a single PCIe bridge" in lines


def test_cpu_binding_takes_the_cores_near_the_jobs_gpu(make_home, tmp_path):
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs cores 0 and 1 in this process's affinity")
    gpus = pcie_box(count=2)
    gpus[0].cpu_ids, gpus[1].cpu_ids = (0,), (1,)  # as if each sat on a socket of its own
    gpus[1].numa_node = 1
    home = nvml_home(make_home, tmp_path, FakeDriver(gpus=gpus))
    home.write_config("[host]\ncpu_binding = true\nreserve_cpus = 0\n")
    home.start()
    # The lowest free core would be 0; the job's GPU 1 sits next to core 1.
    job_id = home.submit("--gpu-ids", "1", "--gpus", "1", "--", "sleep", "60")
    assert home.wait_state(job_id, "running")["cpu_ids"] == [1]
    home.run("cancel", str(job_id))


def test_pick_cpus_prefers_the_near_ones():
    host = Host(cpu_ids=tuple(range(8)), cpus=8, mem_bytes=0)
    assert pick_cpus(host, 2, taken=[4], near={4, 5, 6, 7}) == (5, 6)
    assert pick_cpus(host, 3, taken=[5, 6], near={4, 5, 6, 7}) == (4, 7, 0)
    assert pick_cpus(host, 2, taken=[]) == (0, 1)


def test_near_cpus_of_several_gpus():
    a = GpuInfo(index=0, uuid="a", name="", mem_total_bytes=1, cpu_ids=(0, 1, 2))
    b = GpuInfo(index=1, uuid="b", name="", mem_total_bytes=1, cpu_ids=(2, 3))
    c = GpuInfo(index=2, uuid="c", name="", mem_total_bytes=1, cpu_ids=(8,))
    assert near_cpus([a, b]) == {2} and near_cpus([a, c]) == {0, 1, 2, 8}
    assert near_cpus([]) == set()
