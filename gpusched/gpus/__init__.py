"""GPU backends behind one small protocol: `nvml` for real cards, `simulated` for the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

from gpusched.models import Inventory, Job


class GpuBackend(Protocol):
    name: str

    def read(self, running: Sequence[Job] = ()) -> Inventory:
        """Read every GPU now. `running` lets a simulated backend show gpusched's own jobs."""

    def close(self) -> None:
        """Release the library or files the backend holds."""


def open_backend(simulate: str, processes_file: str | Path) -> GpuBackend:
    """Simulated GPUs when `simulate` names some, else NVML (which explains its own absence)."""
    if simulate:
        from gpusched.gpus.simulated import SimulatedBackend

        return SimulatedBackend.from_spec(simulate, processes_file)
    from gpusched.gpus.nvml import NvmlBackend

    return NvmlBackend()
