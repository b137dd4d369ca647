"""Real GPUs through NVML: the only module that imports pynvml; every failure stays local."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import psutil

from gpusched.core.models import GpuInfo, GpuProcess, Inventory, Job
from gpusched.gpus import nvmltopo

try:
    import pynvml
except Exception as exc:  # a broken install must still let the daemon run CPU-only jobs
    pynvml = None
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = ""

# A driver loaded after the daemon started is picked up, without retrying on every tick.
RETRY_INIT_S = 30.0
_TRY_SIMULATED = "or set GPUSCHED_SIMULATE=4x80GiB to try gpusched on simulated GPUs"
_INIT_PROBLEMS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "NVIDIA's NVML library (libnvidia-ml.so.1) was not found, "
    "so no GPUs can be used; install the NVIDIA driver",
    "NVML_ERROR_DRIVER_NOT_LOADED": "The NVIDIA kernel driver is not loaded, so no GPUs can be "
    "used; load it (nvidia-smi should then list the GPUs)",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "The NVIDIA driver and its NVML library have different "
    "versions (usually a driver upgrade without a reboot); reboot or reload the driver",
    "NVML_ERROR_NO_PERMISSION": "NVML may not open the GPUs (no permission on /dev/nvidia*); "
    "run as a user that may",
}
# After these a GPU gets no new jobs: it has fallen off the bus or needs a reset.
_FATAL_ERRORS = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED")
# The v2 memory call is missing or refused on older drivers and some virtual GPUs.
_MEMORY_V1_ERRORS = (
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
)
_NO_MIG_DEVICES = (
    "MIG mode is on but the GPU has no MIG devices; create GPU and compute "
    "instances (nvidia-smi mig) to use it"
)
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long


def _codes(names: Sequence[str]) -> set[int]:
    return {getattr(pynvml, name) for name in names if hasattr(pynvml, name)}


def _init_problem(exc: Exception) -> str:
    """One sentence saying why NVML did not start and what to do about it."""
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):  # not an NVMLError subclass
        return (
            f"The installed nvidia-ml-py does not match the NVIDIA driver ({exc}); install "
            f"a matching nvidia-ml-py, {_TRY_SIMULATED}."
        )
    code = getattr(exc, "value", None)
    for name, text in _INIT_PROBLEMS.items():
        if code == getattr(pynvml, name, object()):
            return f"{text}, {_TRY_SIMULATED}."
    return (
        f"NVML could not start ({type(exc).__name__}: {exc}), so no GPUs can be used; "
        f"check that nvidia-smi works, {_TRY_SIMULATED}."
    )


class _Probe:
    """Calls NVML for one device: a failing field is None, and a lost GPU is remembered."""

    def __init__(self) -> None:
        self.lost_reason = ""

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if exc.value in _codes(_FATAL_ERRORS) and not self.lost_reason:
                self.lost_reason = f"NVML: {exc}"
            return None


def _memory_bytes(handle: Any) -> tuple[int, int]:
    """(total, used); v2 leaves driver-reserved memory out of `used`, as nvidia-smi does."""
    try:
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except pynvml.NVMLError as exc:
        if exc.value not in _codes(_MEMORY_V1_ERRORS):
            raise
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return int(mem.total), int(mem.used)


def _temperature_c(handle: Any) -> int:
    # The plain call is deprecated for removal; drivers before the V call only have it.
    read_v = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
    if read_v is not None:
        try:
            return int(read_v(handle, pynvml.NVML_TEMPERATURE_GPU))
        except pynvml.NVMLError_FunctionNotFound:
            pass
    return int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))


def _running(handle: Any, kind: str) -> list[Any]:
    # pynvml's unversioned wrapper only tries v3 and raises NVMLLibraryMismatchError on
    # drivers that lack it, so fall back to v2 by hand.
    processes: list[Any]
    try:
        processes = getattr(pynvml, f"nvmlDeviceGet{kind}RunningProcesses_v3")(handle)
    except pynvml.NVMLError_FunctionNotFound:
        processes = getattr(pynvml, f"nvmlDeviceGet{kind}RunningProcesses_v2")(handle)
    return processes


def _known_bytes(value: Any) -> int | None:
    # Containers, WDDM and MIG without privileges report NVML_VALUE_NOT_AVAILABLE.
    if value is None or int(value) >= _NOT_AVAILABLE:
        return None
    return int(value)


def _quietly(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except psutil.Error:
        return None


def _command(proc: psutil.Process) -> str | None:
    return " ".join(_quietly(proc.cmdline) or ()) or _quietly(proc.name)


def _attribute(pid: int, gpu_uuid: str, used: int | None) -> GpuProcess:
    """Who runs `pid`; NVML gives host pids, which another pid namespace cannot see."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return GpuProcess(pid=pid, gpu_uuid=gpu_uuid, used_mem_bytes=used, is_visible=False)
    except psutil.Error:
        return GpuProcess(pid=pid, gpu_uuid=gpu_uuid, used_mem_bytes=used)
    return GpuProcess(
        pid=pid,
        gpu_uuid=gpu_uuid,
        used_mem_bytes=used,
        user=_quietly(proc.username),
        command=_command(proc),
    )


def _processes(handle: Any, gpu_uuid: str, probe: _Probe) -> tuple[GpuProcess, ...]:
    """Compute and graphics processes, once each: a C+G process is in both lists."""
    used_by_pid: dict[int, int | None] = {}
    for kind in ("Compute", "Graphics"):
        for proc in probe(_running, handle, kind) or ():
            used, seen = _known_bytes(proc.usedGpuMemory), used_by_pid.get(int(proc.pid))
            used_by_pid[int(proc.pid)] = used if seen is None else max(seen, used or 0)
    return tuple(_attribute(pid, gpu_uuid, used) for pid, used in used_by_pid.items())


def _bus_id(pci: Any) -> str | None:
    if pci is None:
        return None
    raw = pci.busId  # bytes from older pynvml, str from newer
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    return text.strip("\x00 ").upper() or None


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


def _identity(handle: Any, index: int, probe: _Probe) -> GpuInfo:
    """What every device has: UUID, name, memory; unhealthy when any of it is missing."""
    uuid, name = probe(pynvml.nvmlDeviceGetUUID, handle), probe(pynvml.nvmlDeviceGetName, handle)
    memory = probe(_memory_bytes, handle)
    reason = probe.lost_reason or ("" if uuid and memory else "NVML cannot read its UUID or memory")
    return GpuInfo(
        index=index,
        uuid=uuid or f"unknown-{index}",
        name=name or "Unknown GPU",
        mem_total_bytes=memory[0] if memory else 0,
        mem_used_bytes=memory[1] if memory else None,
        is_healthy=not reason,
        health_reason=reason,
    )


def _is_mig_enabled(handle: Any, probe: _Probe) -> bool:
    mode = probe(pynvml.nvmlDeviceGetMigMode, handle)  # NOT_SUPPORTED on GPUs without MIG
    return bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE


def _read_mig(handle: Any, parent: GpuInfo) -> GpuInfo:
    """One MIG device: its own UUID, memory and processes; the rest is the parent's."""
    probe = _Probe()
    mig = _identity(handle, parent.index, probe)
    if not mig.is_healthy:
        return replace(mig, parent_index=parent.index)
    return replace(
        mig,
        bus_id=parent.bus_id,
        compute_capability=parent.compute_capability,
        processes=_processes(handle, mig.uuid, probe),
        parent_index=parent.index,
        gpu_instance_id=probe(pynvml.nvmlDeviceGetGpuInstanceId, handle),
        compute_instance_id=probe(pynvml.nvmlDeviceGetComputeInstanceId, handle),
        parent_uuid=parent.uuid,
        mig_profile=_mig_profile(handle, mig.name, probe),
        cpu_ids=parent.cpu_ids,
        numa_node=parent.numa_node,
    )


def _mig_profile(handle: Any, name: str, probe: _Probe) -> str | None:
    """'3g.20gb': the end of the MIG device's name ('NVIDIA A100-SXM4-40GB MIG 3g.20gb'),
    else built from its attributes as nvidia-smi names profiles (slices, memory in GB)."""
    if " MIG " in name:
        return name.rsplit(" MIG ", 1)[1].strip() or None
    attrs = probe(pynvml.nvmlDeviceGetAttributes_v2, handle)
    if attrs is None or not attrs.gpuInstanceSliceCount:
        return None
    gi, ci = attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount
    profile = f"{gi}g.{round(attrs.memorySizeMB / 1024)}gb"
    return profile if ci in (0, gi) else f"{ci}c.{profile}"


def _read_migs(handle: Any, parent: GpuInfo, probe: _Probe) -> tuple[GpuInfo, ...]:
    migs = []
    for slot in range(probe(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        # Slots beyond the instances that exist answer NOT_FOUND.
        mig_handle = probe(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig_handle is not None:
            migs.append(_read_mig(mig_handle, parent))
    return tuple(migs)


def _read_gpu(index: int) -> GpuInfo:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as exc:
        return _unreadable(index, f"NVML cannot open GPU {index}: {exc}")
    probe = _Probe()
    gpu = _identity(handle, index, probe)
    if not gpu.is_healthy:  # a lost GPU can be slow to answer; ask it nothing more
        return gpu
    util = probe(pynvml.nvmlDeviceGetUtilizationRates, handle)
    gpu = replace(
        gpu,
        util_pct=None if util is None else float(util.gpu),
        bus_id=_bus_id(probe(pynvml.nvmlDeviceGetPciInfo, handle)),
        temperature_c=probe(_temperature_c, handle),
        power_w=_watts(probe(pynvml.nvmlDeviceGetPowerUsage, handle)),
        power_limit_w=_watts(probe(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        compute_capability=probe(pynvml.nvmlDeviceGetCudaComputeCapability, handle),
    )
    cpu_ids, numa_node = nvmltopo.read_affinity(pynvml, handle)
    gpu = replace(gpu, cpu_ids=cpu_ids, numa_node=numa_node)
    if _is_mig_enabled(handle, probe):
        # Processes belong to MIG devices; asking the parent needs root in MIG mode.
        gpu = replace(gpu, is_mig_mode=True, mig_devices=_read_migs(handle, gpu, probe))
        if not gpu.mig_devices:  # CUDA cannot use the parent itself: never give it out
            return replace(gpu, is_healthy=False, health_reason=_NO_MIG_DEVICES)
    else:
        gpu = replace(gpu, processes=_processes(handle, gpu.uuid, probe))
    if probe.lost_reason:
        gpu = replace(gpu, is_healthy=False, health_reason=probe.lost_reason)
    return gpu


def _read_gpu_safely(index: int) -> GpuInfo:
    try:
        return _read_gpu(index)
    except Exception as exc:  # one broken GPU must never break the whole listing
        return _unreadable(index, f"reading GPU {index} failed: {type(exc).__name__}: {exc}")


def _unreadable(index: int, reason: str) -> GpuInfo:
    """A GPU that could not be read, listed as unhealthy with the reason."""
    return GpuInfo(
        index=index,
        uuid=f"unknown-{index}",
        name="Unknown GPU",
        mem_total_bytes=0,
        is_healthy=False,
        health_reason=reason,
    )


def _cuda_version(probe: _Probe) -> str | None:
    version = probe(pynvml.nvmlSystemGetCudaDriverVersion)  # 12040 -> "12.4"
    return None if not version else f"{version // 1000}.{version % 1000 // 10}"


class NvmlBackend:
    name = "nvml"

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._is_initialized = False
        self._next_init_at = 0.0
        self._problem = ""
        self._driver_version: str | None = None
        self._cuda_version: str | None = None
        self._links_key: tuple[str, ...] = ()
        self._links_cache: tuple[tuple[str, ...], ...] = ()

    def _start(self) -> bool:
        """Initialize NVML unless it failed less than RETRY_INIT_S ago."""
        if self._is_initialized or self._clock() < self._next_init_at:
            return self._is_initialized
        self._next_init_at = self._clock() + RETRY_INIT_S
        if pynvml is None:
            self._problem = (
                f"The pynvml module (package nvidia-ml-py) cannot be imported "
                f"({_IMPORT_ERROR}); reinstall gpusched, {_TRY_SIMULATED}."
            )
            return False
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLLibraryMismatchError is not an NVMLError
            self._problem = _init_problem(exc)
            return False
        probe = _Probe()
        self._driver_version = probe(pynvml.nvmlSystemGetDriverVersion)
        self._cuda_version = _cuda_version(probe)
        self._is_initialized, self._problem = True, ""
        return True

    def _inventory(self, gpus: tuple[GpuInfo, ...] = (), problem: str = "") -> Inventory:
        return Inventory(
            gpus=gpus,
            backend=self.name,
            problem=problem,
            driver_version=self._driver_version,
            cuda_version=self._cuda_version,
            read_at=time.time(),
        )

    def read(self, running: Sequence[Job] = ()) -> Inventory:
        if not self._start():
            return self._inventory(problem=self._problem)
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:  # the driver went away under us: start again later
            self.close()
            self._next_init_at = self._clock() + RETRY_INIT_S
            self._problem = (
                f"NVML stopped answering ({exc}), so no GPUs can be used; check "
                f"that nvidia-smi works, {_TRY_SIMULATED}."
            )
            return self._inventory(problem=self._problem)
        if count == 0:
            return self._inventory(
                problem=(
                    f"NVML found no NVIDIA GPUs (driver {self._driver_version or 'unknown'}); check "
                    f"that nvidia-smi lists them and that /dev/nvidia* is visible here, "
                    f"{_TRY_SIMULATED}."
                )
            )
        gpus = tuple(_read_gpu_safely(i) for i in range(count))
        return replace(self._inventory(gpus=gpus), links=self._links(gpus))

    def _links(self, gpus: tuple[GpuInfo, ...]) -> tuple[tuple[str, ...], ...]:
        """The link matrix, read again only when the set of GPUs changes: it is fixed by
        the hardware, and reading it is tens of calls per GPU."""
        key = tuple(g.uuid if g.is_healthy else "" for g in gpus)
        if key != self._links_key:
            # A lost GPU is asked nothing (it can be slow to answer): its links are N/A.
            handles = [
                _Probe()(pynvml.nvmlDeviceGetHandleByIndex, g.index) if g.is_healthy else None
                for g in gpus
            ]
            links = nvmltopo.read_links(pynvml, handles, [g.bus_id or "" for g in gpus])
            self._links_key, self._links_cache = key, links
        return self._links_cache

    def close(self) -> None:
        if self._is_initialized:
            self._is_initialized = False
            try:
                pynvml.nvmlShutdown()
            except Exception:  # shutting down a vanished driver has nothing left to release
                pass
