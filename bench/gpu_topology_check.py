"""MIG rows and the topology matrix of gpusched's NVML backend against `nvidia-smi -L`,
`nvidia-smi topo -m` and NVML's own calls. Read-only; run by bench/gpu_check.sh.

    python bench/gpu_topology_check.py SMI_L_FILE SMI_TOPO_FILE

The parsing and comparing are plain functions over text and an Inventory, so that the
tests check them against nvidia-smi output of real boxes without a GPU.
"""

from __future__ import annotations

import re
import sys
from typing import Any

# GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-...)
_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)]+)\)")
#   MIG 3g.20gb     Device  0: (UUID: MIG-...)
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)")


def parse_smi_list(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi -L`: each GPU with its MIG devices (profile, uuid), in order."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        if match := _GPU_LINE.match(line):
            gpus.append({"index": int(match[1]), "name": match[2], "uuid": match[3], "migs": []})
        elif (match := _MIG_LINE.match(line)) and gpus:
            gpus[-1]["migs"].append({"profile": match[1], "uuid": match[3]})
    return gpus


def parse_smi_topo(text: str) -> dict[str, Any]:
    """`nvidia-smi topo -m`: the GPU-to-GPU labels and each GPU's CPU and NUMA affinity
    (NIC rows and columns are left out)."""
    lines = [line.rstrip("\n") for line in text.splitlines()]
    header = next((line.split("\t") for line in lines if "\tGPU0" in line), [])
    names = [h.strip() for h in header]
    gpu_cols = [n for n, h in enumerate(names) if re.fullmatch(r"GPU\d+", h)]
    cpu_col = names.index("CPU Affinity") if "CPU Affinity" in names else None
    numa_col = names.index("NUMA Affinity") if "NUMA Affinity" in names else None
    links, cpus, numa = [], [], []
    for line in lines:
        cells = [c.strip() for c in line.split("\t")]
        if not re.fullmatch(r"GPU\d+", cells[0]) or len(cells) < len(gpu_cols) + 1:
            continue
        links.append([cells[n] for n in gpu_cols])
        cpus.append(cells[cpu_col] if cpu_col is not None and cpu_col < len(cells) else "N/A")
        numa.append(cells[numa_col] if numa_col is not None and numa_col < len(cells) else "N/A")
    return {"links": links, "cpu_affinity": cpus, "numa_affinity": numa}


def compare(
    inventory: Any, smi_list: list[dict[str, Any]], smi_topo: dict[str, Any]
) -> list[tuple[str, str, Any, Any, bool | None]]:
    """(what, field, ours, nvidia-smi's, ok) per check; ok None: information only."""
    from gpusched.core.sched.topology import cpu_ranges

    out: list[tuple[str, str, Any, Any, bool | None]] = []
    by_index = {g.index: g for g in inventory.gpus}
    migs_seen = 0
    for smi in smi_list:
        gpu = by_index.get(smi["index"])
        what = f"GPU{smi['index']}"
        if gpu is None:
            out.append((what, "present", None, smi["uuid"], False))
            continue
        out.append((what, "uuid", gpu.uuid, smi["uuid"], gpu.uuid == smi["uuid"]))
        out.append(
            (
                what,
                "mig mode",
                gpu.is_mig_mode,
                bool(smi["migs"]),
                gpu.is_mig_mode or not smi["migs"],
            )
        )
        ours = [(m.mig_profile, m.uuid) for m in gpu.mig_devices]
        theirs = [(m["profile"], m["uuid"]) for m in smi["migs"]]
        migs_seen += len(theirs)
        if ours or theirs:
            out.append((what, "MIG devices", ours, theirs, sorted(ours) == sorted(theirs)))
            for mig in gpu.mig_devices:
                out.append(
                    (
                        f"{what} {mig.label}",
                        "parent_uuid",
                        mig.parent_uuid,
                        gpu.uuid,
                        mig.parent_uuid == gpu.uuid,
                    )
                )
    if not migs_seen:
        out.append(("all", "MIG", "no GPU has MIG devices", "nothing to compare", None))
    links = [list(row) for row in inventory.links] or ([["X"]] if len(inventory.gpus) == 1 else [])
    out.append(("all", "topology matrix", links, smi_topo["links"], links == smi_topo["links"]))
    for n, gpu in enumerate(inventory.gpus):
        if n < len(smi_topo["cpu_affinity"]):
            ours_cpus = cpu_ranges(gpu.cpu_ids)
            out.append(
                (
                    f"GPU{n}",
                    "cpu affinity",
                    ours_cpus,
                    smi_topo["cpu_affinity"][n],
                    ours_cpus == smi_topo["cpu_affinity"][n],
                )
            )
            ours_node = "N/A" if gpu.numa_node is None else str(gpu.numa_node)
            out.append(
                (
                    f"GPU{n}",
                    "numa affinity",
                    ours_node,
                    smi_topo["numa_affinity"][n],
                    ours_node == smi_topo["numa_affinity"][n],
                )
            )
    return out


def nvml_own_calls() -> list[str]:
    """What NVML answers when asked directly, printed beside the comparison."""
    import pynvml

    lines = []
    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        for a, first in enumerate(handles):
            for b in range(a + 1, len(handles)):
                try:
                    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(first, handles[b])
                except pynvml.NVMLError as exc:
                    level = f"error: {exc}"
                lines.append(f"nvmlDeviceGetTopologyCommonAncestor(GPU{a}, GPU{b}) = {level}")
            try:
                mode = pynvml.nvmlDeviceGetMigMode(first)
            except pynvml.NVMLError as exc:
                lines.append(f"nvmlDeviceGetMigMode(GPU{a}): {exc}")
                continue
            lines.append(f"nvmlDeviceGetMigMode(GPU{a}) = {mode}")
            for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(first) if mode[0] else 0):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(first, slot)
                except pynvml.NVMLError:
                    continue
                lines.append(
                    f"  MIG slot {slot}: {pynvml.nvmlDeviceGetName(mig)} gi="
                    f"{pynvml.nvmlDeviceGetGpuInstanceId(mig)} ci="
                    f"{pynvml.nvmlDeviceGetComputeInstanceId(mig)}"
                )
    finally:
        pynvml.nvmlShutdown()
    return lines


def main(smi_list_file: str, smi_topo_file: str) -> int:
    from gpusched.gpus.nvml import NvmlBackend

    backend = NvmlBackend()
    inventory = backend.read()
    backend.close()
    with open(smi_list_file) as f:
        smi_list = parse_smi_list(f.read())
    with open(smi_topo_file) as f:
        smi_topo = parse_smi_topo(f.read())
    failures = 0
    for what, field, ours, theirs, ok in compare(inventory, smi_list, smi_topo):
        verdict = "info" if ok is None else "PASS" if ok else "FAIL"
        failures += ok is False
        print(f"{verdict:<4} {what:<8} {field:<16} gpusched={ours} nvidia-smi={theirs}")
    for line in nvml_own_calls():
        print(f"nvml {line}")
    print(f"MIG/topology checks failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
