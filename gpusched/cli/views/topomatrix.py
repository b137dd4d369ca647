"""`gpusched gpus --topology`: the links between the GPUs in `nvidia-smi topo -m`'s shape."""

from __future__ import annotations

from gpusched.core.sched.topology import LEGEND, cpu_ranges

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the fast command path
    from typing import Any

NO_TOPOLOGY = (
    "The links between the GPUs are unknown: NVML does not give them here (a VM "
    "often hides the PCIe tree), or the GPUs are simulated without a topology "
    "(GPUSCHED_SIMULATE=8xH100-80GiB:nvlink=0-3,4-7)."
)


def whole_gpus(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of whole GPUs: MIG devices share their GPU's links."""
    return [gpu for gpu in result["gpus"] if not gpu.get("parent_uuid")]


def matrix(result: dict[str, Any]) -> dict[str, Any]:
    """The matrix as data, for --json: GPU labels, link labels, affinities."""
    gpus = whole_gpus(result)
    links = result.get("links") or ([["X"]] if len(gpus) == 1 else [])
    return {
        "gpus": [f"GPU{g['index']}" for g in gpus],
        "links": links,
        "cpu_affinity": [cpu_ranges(g.get("cpu_affinity") or ()) for g in gpus],
        "numa_affinity": [g.get("numa_node") for g in gpus],
    }


def render(result: dict[str, Any]) -> str:
    """Tab-separated as nvidia-smi prints it, then its legend."""
    data = matrix(result)
    if not data["links"]:
        return NO_TOPOLOGY + "\n"
    lines = ["\t" + "\t".join(data["gpus"] + ["CPU Affinity", "NUMA Affinity"])]
    for name, row, cpus, node in zip(
        data["gpus"], data["links"], data["cpu_affinity"], data["numa_affinity"]
    ):
        cells = [f" {label} " if label == "X" else label for label in row]
        lines.append("\t".join([name, *cells, cpus, "N/A" if node is None else str(node)]))
    lines += ["", "Legend:", ""]
    lines += [f"  {key:<4} = {text}" for key, text in LEGEND]
    return "\n".join(lines) + "\n"
