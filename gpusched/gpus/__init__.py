"""GPU backends behind one small protocol: `nvml` for real cards, `simulated` for the rest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from gpusched.core.errors import ConfigError
from gpusched.core.models import Inventory, Job
from gpusched.gpus.simulated import SimulatedBackend


class GpuBackend(Protocol):
    name: str

    def read(self, running: Sequence[Job] = ()) -> Inventory:
        """Read every GPU now. `running` lets a simulated backend show gpusched's own jobs."""

    def close(self) -> None:
        """Release the library or files the backend holds."""


def open_backend(simulate: str, processes_file: str | Path) -> GpuBackend:
    """Simulated GPUs when `simulate` names some, else NVML (which explains its own absence).

    A `simulate` that names no GPUs is a ConfigError naming both places it comes from.
    """
    if simulate:
        try:
            return SimulatedBackend.from_spec(simulate, processes_file)
        except ValueError as exc:
            raise ConfigError(f"gpus.simulate / GPUSCHED_SIMULATE: {exc}") from None
    # psutil and pynvml: 40 ms of a daemon's start, not for simulated GPUs
    from gpusched.gpus.nvml import NvmlBackend  # noqa: PLC0415

    return NvmlBackend()
