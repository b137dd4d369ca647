"""Simulated GPUs: stable NVIDIA-style identities, job usage, and declared outside processes."""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.core.models import GpuInfo, GpuProcess, Inventory, Job
from gpusched.core.sched import topology
from gpusched.core.units import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_PART_RE = re.compile(r"^(?:(\d+)x)?(?:([A-Za-z][\w ]*?)-)?(\d+(?:\.\d+)?\s*[KMGT]i?B?)$", re.I)
_UUID_NAMESPACE = uuid.UUID("5d1b7c0e-3f0a-4b8e-9c71-0d6e2a9f4b11")
# Compute capability by model, so `--min-compute-capability` behaves as on real cards.
_CAPABILITY = {
    "H200": (9, 0),
    "H100": (9, 0),
    "A100": (8, 0),
    "A30": (8, 0),
    "L40": (8, 9),
    "L4": (8, 9),
    "A40": (8, 6),
    "A10": (8, 6),
    "V100": (7, 0),
    "T4": (7, 5),
}
# What a running job looks like when it does not declare GPUSCHED_SIM_MEM_USED/UTIL_PCT.
_EXCLUSIVE_MEM_FRACTION = 0.9
_EXCLUSIVE_UTIL_PCT = 90.0
_SHARED_UTIL_PCT = 30.0


@dataclass(frozen=True)
class SimGpu:
    model: str
    mem_total_bytes: int


def parse_spec(spec: str) -> list[SimGpu]:
    """'4x80GiB' or '2xH100-80GiB,2xA100-40GiB' -> one SimGpu per card."""
    gpus: list[SimGpu] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = _PART_RE.match(part)
        if not match:
            raise ValueError(f"bad simulated GPU spec {part!r}: write e.g. 4x80GiB or 2xH100-80GiB")
        count = int(match.group(1) or 1)
        if not 1 <= count <= 64:
            raise ValueError(f"bad simulated GPU count in {part!r}: use 1 to 64")
        mem = parse_size(match.group(3).replace(" ", ""))
        if mem <= 0:
            raise ValueError(f"bad simulated GPU memory in {part!r}")
        gpus += [SimGpu(match.group(2) or "", mem)] * count
    if not gpus:
        raise ValueError(f"bad simulated GPU spec {spec!r}: write e.g. 4x80GiB")
    return gpus


def _sim_uuid(index: int, gpu: SimGpu) -> str:
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{index}:{gpu.model}:{gpu.mem_total_bytes}"))


def _job_usage(job: Job, total: int) -> tuple[int, float]:
    """Memory and utilization one running job shows on each of its GPUs."""
    declared = job.env.get("GPUSCHED_SIM_MEM_USED")
    util = job.env.get("GPUSCHED_SIM_UTIL_PCT")
    if declared:
        mem = parse_size(declared)
    elif job.request.gpu_mem_bytes is not None:
        mem = job.request.gpu_mem_bytes
    else:
        mem = int(total * _EXCLUSIVE_MEM_FRACTION)
    default_util = _EXCLUSIVE_UTIL_PCT if job.request.is_exclusive else _SHARED_UTIL_PCT
    return mem, float(util) if util else default_util


def _outside_entry(raw: dict[str, Any]) -> dict[str, Any]:
    """One [[process]] table of the outside-processes file, checked and normalized."""
    return {
        "gpu": int(raw["gpu"]),
        "pid": int(raw.get("pid", 0)),
        "user": str(raw.get("user", "")) or None,
        "memory": parse_size(raw.get("memory", 0)),
        "util": float(raw.get("util", 0)),
        "command": str(raw.get("command", "")),
    }


def parse_links(spec: str, gpu_count: int) -> tuple[tuple[str, ...], ...]:
    """The topology after the GPUs: '8xH100-80GiB:nvlink=0-3,4-7'; () when none is given."""
    _, _, options = spec.partition(":")
    if not options:
        return ()
    key, _, value = options.partition("=")
    if key.strip() != "nvlink" or not value.strip():
        raise ValueError(
            f"bad simulated topology {options!r}: write e.g. 8xH100-80GiB:nvlink=0-3,4-7"
        )
    return tuple(map(tuple, topology.nvlink_islands(value.strip(), gpu_count)))


class SimulatedBackend:
    name = "simulated"

    def __init__(
        self,
        gpus: list[SimGpu],
        processes_file: str | Path,
        links: tuple[tuple[str, ...], ...] = (),
    ):
        self._gpus = gpus
        self._links = links
        self._processes_file = Path(processes_file)
        self._outside_cache: tuple[float, list[dict[str, Any]]] = (-1.0, [])

    @classmethod
    def from_spec(cls, spec: str, processes_file: str | Path) -> SimulatedBackend:
        gpus = parse_spec(spec.partition(":")[0])
        return cls(gpus, processes_file, parse_links(spec, len(gpus)))

    def _outside(self) -> list[dict[str, Any]]:
        """Re-read the declared outside processes when the file changes; a bad file counts as empty."""
        try:
            mtime = self._processes_file.stat().st_mtime_ns
        except OSError:
            return []
        if mtime != self._outside_cache[0]:
            try:
                data = tomllib.loads(self._processes_file.read_text(encoding="utf-8"))
                entries = [_outside_entry(p) for p in data.get("process", [])]
            except (OSError, ValueError, TypeError, AttributeError, KeyError):
                entries = []
            self._outside_cache = (mtime, entries)
        return self._outside_cache[1]

    def read(self, running: Sequence[Job] = ()) -> Inventory:
        gpus = []
        outside = self._outside()
        for index, sim in enumerate(self._gpus):
            gpu_uuid = _sim_uuid(index, sim)
            mem_used, util, procs = 0, 0.0, []
            for job in running:
                # A job uses its GPU once its shim runs (its pid known), not before.
                if gpu_uuid in job.gpu_uuids and job.runner_pid:
                    mem, job_util = _job_usage(job, sim.mem_total_bytes)
                    mem_used, util = mem_used + mem, util + job_util
                    procs.append(
                        GpuProcess(
                            pid=job.runner_pid,
                            gpu_uuid=gpu_uuid,
                            used_mem_bytes=mem,
                            user=job.user,
                            command=" ".join(job.command),
                            util_pct=job_util,
                        )
                    )
            for entry in outside:
                if entry["gpu"] != index:
                    continue
                mem, proc_util = entry["memory"], entry["util"]
                mem_used, util = mem_used + mem, util + proc_util
                procs.append(
                    GpuProcess(
                        pid=entry["pid"],
                        gpu_uuid=gpu_uuid,
                        used_mem_bytes=mem,
                        user=entry["user"],
                        command=entry["command"],
                        util_pct=proc_util,
                    )
                )
            util = min(100.0, util)
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=gpu_uuid,
                    name=f"NVIDIA {sim.model}" if sim.model else "Simulated GPU",
                    mem_total_bytes=sim.mem_total_bytes,
                    mem_used_bytes=min(mem_used, sim.mem_total_bytes),
                    util_pct=util,
                    bus_id=f"00000000:{0x18 + index * 0x10:02X}:00.0",
                    temperature_c=int(32 + util * 0.4),
                    power_w=round(60 + util * 3.4, 1),
                    power_limit_w=700.0 if sim.model.upper() in ("H100", "H200") else 400.0,
                    compute_capability=_CAPABILITY.get(sim.model.upper()),
                    processes=tuple(procs),
                )
            )
        return Inventory(
            gpus=tuple(gpus), backend=self.name, read_at=time.time(), links=self._links
        )

    def close(self) -> None:
        pass
