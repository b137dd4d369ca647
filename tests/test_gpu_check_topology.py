"""bench/gpu_topology_check.py, the real-GPU check of MIG rows and the topology matrix,
run here against nvidia-smi's output for the fake NVML boxes (no GPU is needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fake_nvml import FakeDriver, fake_nvml, make_gpu, make_mig, pcie_box
from gpusched.gpus.nvml import NvmlBackend

__all__ = ["fake_nvml"]

MIB = 2**20
_SPEC = importlib.util.spec_from_file_location(
    "gpu_topology_check", Path(__file__).resolve().parent.parent / "bench" / "gpu_topology_check.py"
)
check = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(check)


def _topo_m(rows: list[str]) -> str:
    """nvidia-smi topo -m as a 535 driver prints it (with its GPU NUMA ID column)."""
    n = len(rows)
    header = (
        "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    )
    return "\n".join([header, *rows, "", "Legend:", "", "  X    = Self"]) + "\n"


def test_a_pcie_box_with_a_mig_gpu_matches(fake_nvml):
    gpus = pcie_box("A100", count=2)
    gpus[1].mig_devices = [make_mig(gpus[1], gi=1, ci=0, profile="3g.20gb", mem_bytes=19968 * MIB)]
    fake_nvml(FakeDriver(gpus=gpus))
    inventory = NvmlBackend().read()
    smi_list = check.parse_smi_list(
        f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {gpus[0].uuid})\n"
        f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {gpus[1].uuid})\n"
        f"  MIG 3g.20gb     Device  0: (UUID: {gpus[1].mig_devices[0].uuid})\n"
    )
    smi_topo = check.parse_smi_topo(
        _topo_m(["GPU0\t X \tPIX\t0-47\t0\t\tN/A", "GPU1\tPIX\t X \t0-47\t0\t\tN/A"])
    )
    results = check.compare(inventory, smi_list, smi_topo)
    assert [r for r in results if r[4] is False] == []
    assert ("GPU1", "MIG devices") in {(r[0], r[1]) for r in results}


def test_a_wrong_matrix_fails_and_one_gpu_without_mig_is_said(fake_nvml):
    gpus = pcie_box(count=2)
    fake_nvml(FakeDriver(gpus=gpus))
    inventory = NvmlBackend().read()
    smi_topo = check.parse_smi_topo(
        _topo_m(["GPU0\t X \tSYS\t0-47\t0\t\tN/A", "GPU1\tSYS\t X \t0-47\t0\t\tN/A"])
    )
    failed = [r[1] for r in check.compare(inventory, [], smi_topo) if r[4] is False]
    assert failed == ["topology matrix"]
    fake_nvml(FakeDriver(gpus=[make_gpu("H100", 0)]))
    single = NvmlBackend().read()
    results = check.compare(single, [], check.parse_smi_topo(_topo_m(["GPU0\t X \t0-15\t\t\tN/A"])))
    assert ("all", "MIG", "no GPU has MIG devices", "nothing to compare", None) in results
    assert next(r for r in results if r[1] == "topology matrix")[4] is True
