"""Right-sizing: GPU memory asked for against the peak used, per run and summed (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpusched.core.models import Inventory

OVER_ASK_FACTOR = 2  # a run that asked for more than twice its peak could have shared more


def gpu_mem_totals(inventory: Inventory) -> dict[str, int]:
    """Each GPU's (and MIG device's) memory by UUID: what a whole-GPU job asked for."""
    devices = [d for gpu in inventory.gpus for d in (gpu, *gpu.mig_devices)]
    return {d.uuid: d.mem_total_bytes for d in devices}


def asked_bytes(
    gpu_mem_bytes: int | None, gpu_uuids: Iterable[str], totals: Mapping[str, int]
) -> int | None:
    """A run's ask per GPU: its --gpu-mem, or for whole GPUs the smallest of their memories
    (None when one of them is no longer seen, or it never had a GPU)."""
    if gpu_mem_bytes:
        return gpu_mem_bytes
    sizes = [totals.get(uuid) for uuid in gpu_uuids]
    if not sizes or None in sizes:
        return None
    return min(size for size in sizes if size is not None)


class Sizing:
    """Asked-for against peak GPU memory (per GPU) over the runs where both are known."""

    def __init__(self) -> None:
        self.jobs, self.asked_bytes, self.peak_bytes, self.over_asked = 0, 0, 0, 0

    def add(self, asked: int | None, peak: int | None) -> None:
        if not asked or not peak:
            return  # no ask known, or no GPU reading recorded a peak
        self.jobs += 1
        self.asked_bytes += asked
        self.peak_bytes += peak
        self.over_asked += asked > OVER_ASK_FACTOR * peak

    def merge(self, other: Sizing) -> None:
        self.jobs += other.jobs
        self.asked_bytes += other.asked_bytes
        self.peak_bytes += other.peak_bytes
        self.over_asked += other.over_asked

    def to_dict(self) -> dict[str, Any]:
        """The `right_sizing` object of `history --json` and `usage --json`."""
        return {
            "jobs": self.jobs,
            "asked_bytes": self.asked_bytes,
            "peak_bytes": self.peak_bytes,
            "over_asked": self.over_asked,
            "over_asked_share": self.over_asked / self.jobs if self.jobs else None,
        }
