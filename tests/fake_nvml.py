"""A fake NVML C library installed underneath the real pynvml module, so tests need no GPU.

pynvml's own wrappers run for real: they look the C symbols up on `pynvml.nvmlLib`, pass
ctypes arguments (byref pointers, string buffers, struct arrays), check struct versions,
do the INSUFFICIENT_SIZE handshake for process lists and map return codes to exceptions.
The fake answers those calls from plain dataclasses (FakeDriver, FakeGpu, FakeProcess).

A symbol listed in `FakeDriver.absent` is missing from that driver: pynvml raises
NVMLError_FunctionNotFound, as with a real old driver. A symbol the fake does not
implement at all fails the test: the lookup raises FakeNvmlGap (a BaseException, so no
`except Exception` in the code under test can swallow it) and the fixture checks
`unimplemented` again at teardown.
"""

from __future__ import annotations

import ctypes
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

SUCCESS = pynvml.NVML_SUCCESS
MIB = 2**20
# Symbols a driver from before the v3 process calls (R470 era) does not have.
OLD_DRIVER_ABSENT = frozenset(
    {
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetTemperatureV",
    }
)
# The strings libnvidia-ml's nvmlErrorString gives for codes pynvml has no text for.
_ERROR_STRINGS = {
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: b"Argument version mismatch",
    pynvml.NVML_ERROR_NO_DATA: b"No data",
    pynvml.NVML_ERROR_IN_USE: b"In use by another client",
}
_NO_INIT_NEEDED = frozenset({"nvmlInitWithFlags", "nvmlErrorString"})
_MAX_MIG_DEVICES = 7  # what A100/H100 report, whatever instances exist
_NO_INSTANCE = 0xFFFFFFFF


class FakeNvmlGap(BaseException):
    """The code under test called an NVML symbol that the fake does not implement."""


@dataclass
class FakeProcess:
    pid: int
    used_mem_bytes: int | None  # None: the driver answers NVML_VALUE_NOT_AVAILABLE
    kinds: frozenset[str] = frozenset({"compute"})  # "compute", "graphics" or both (C+G)


@dataclass
class FakeGpu:
    """A GPU or, inside `mig_devices`, a MIG device (with gpu/compute instance ids)."""

    name: str
    uuid: str
    mem_total_bytes: int
    mem_used_bytes: int = 0
    mem_reserved_bytes: int = 0  # v1 memory counts it as used, v2 reports it apart
    bus_id: str = "00000000:00:00.0"
    util_pct: int = 0
    temperature_c: int = 35
    power_mw: int = 60_000
    power_limit_mw: int = 300_000
    compute_capability: tuple[int, int] = (8, 0)
    processes: list[FakeProcess] = field(default_factory=list)
    mig_capable: bool = False  # MIG mode query answers instead of NOT_SUPPORTED
    mig_devices: list[FakeGpu] = field(default_factory=list)
    is_mig_mode_on: bool = False  # also on whenever mig_devices is non-empty
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_profile: str = ""  # what nvmlDeviceGetAttributes_v2 describes: slices and memory
    errors: dict[str, int] = field(default_factory=dict)  # C symbol -> error code
    is_lost: bool = False  # every call answers GPU_IS_LOST, as after falling off the bus
    # Topology (nvlink_box, pcie_box). numa_node None: the PCIe tree is hidden, as in
    # many VMs, and the topology and affinity calls answer NOT_SUPPORTED.
    nvlinks: list[str] = field(default_factory=list)  # per link: the far end's bus id, "" off
    pcie_switch: int | None = None
    numa_node: int | None = None
    cpu_ids: tuple[int, ...] = ()


@dataclass
class FakeDriver:
    gpus: list[FakeGpu]
    driver_version: str = "550.54.15"
    cuda_version: int = 12040
    absent: frozenset[str] = frozenset()  # symbols this driver lacks: FunctionNotFound
    has_library: bool = True  # False: dlopen("libnvidia-ml.so.1") fails
    init_result: int = SUCCESS  # e.g. NVML_ERROR_DRIVER_NOT_LOADED
    init_exception: Exception | None = None
    errors: dict[str, int] = field(default_factory=dict)  # system-level symbol -> code


# Real models, with the sizes and limits their drivers report.
_MODELS = {
    "H100": ("NVIDIA H100 80GB HBM3", 81559 * MIB, 700_000, (9, 0), True),
    "A100": ("NVIDIA A100-SXM4-40GB", 40960 * MIB, 400_000, (8, 0), True),
    "L4": ("NVIDIA L4", 23034 * MIB, 72_000, (8, 9), False),
    "T4": ("Tesla T4", 15360 * MIB, 70_000, (7, 5), False),
    "4090": ("NVIDIA GeForce RTX 4090", 24564 * MIB, 450_000, (8, 9), False),
}
NVSWITCH_BUS_ID = "00000000:C0:00.0"  # where an NVSwitch's links end (not a GPU)


def make_gpu(model: str, index: int, **overrides: Any) -> FakeGpu:
    """A FakeGpu of a known model with a stable UUID and a bus id per index."""
    name, total, limit_mw, capability, mig_capable = _MODELS[model]
    values: dict[str, Any] = {
        "name": name,
        "uuid": f"GPU-{uuid_module.uuid5(uuid_module.NAMESPACE_DNS, f'{model}{index}')}",
        "mem_total_bytes": total,
        "bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        "power_limit_mw": limit_mw,
        "compute_capability": capability,
        "mig_capable": mig_capable,
    }
    return FakeGpu(**{**values, **overrides})


def make_mig(
    parent: FakeGpu, gi: int, ci: int, profile: str, mem_bytes: int, **overrides: Any
) -> FakeGpu:
    """A MIG device named as current drivers name it: '<parent> MIG 3g.20gb'."""
    mig_uuid = f"MIG-{uuid_module.uuid5(uuid_module.NAMESPACE_DNS, f'{parent.uuid}/{gi}/{ci}')}"
    return FakeGpu(
        **{
            **{
                "name": f"{parent.name} MIG {profile}",
                "uuid": mig_uuid,
                "mem_total_bytes": mem_bytes,
                "gpu_instance_id": gi,
                "compute_instance_id": ci,
                "mig_profile": profile,
            },
            **overrides,
        }
    )


def nvlink_box(switched: bool = False) -> list[FakeGpu]:
    """A real 8-GPU NVLink box: 8 H100s on two sockets (cores 0-47 and 48-95), two GPUs per
    PCIe switch. Without `switched`, two NVLink islands (0-3, 4-7), each GPU with 6 links
    to each of its 3 island peers (NV6); with it, all 18 links into NVSwitches (NV18 all
    to all, as a DGX H100)."""
    gpus = [_placed(make_gpu("H100", i), i) for i in range(8)]
    for i, gpu in enumerate(gpus):
        if switched:
            gpu.nvlinks = [NVSWITCH_BUS_ID] * 18
        else:
            island = [g for g in gpus[i // 4 * 4 : i // 4 * 4 + 4] if g is not gpu]
            gpu.nvlinks = [peer.bus_id for peer in island for _ in range(6)]
    return gpus


def pcie_box(model: str = "L4", count: int = 8) -> list[FakeGpu]:
    """A PCIe box: two sockets, two GPUs per PCIe switch, no NVLink."""
    return [_placed(make_gpu(model, i), i) for i in range(count)]


def _placed(gpu: FakeGpu, index: int) -> FakeGpu:
    socket = index // 4
    gpu.pcie_switch, gpu.numa_node = index // 2, socket
    gpu.cpu_ids = tuple(range(48 * socket, 48 * socket + 48))
    return gpu


def _value(arg: Any) -> int:
    """A ctypes int or a plain one: pynvml passes some arguments unconverted."""
    return int(getattr(arg, "value", arg))


def _write_mask(array: Any, members: tuple[int, ...]) -> None:
    """A bitmask in an array of 64-bit words; members past its end are cut off, as NVML does."""
    for bit in members:
        if bit // 64 < len(array):
            array[bit // 64] |= 1 << (bit % 64)


class _Fail(Exception):
    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _or_no_instance(instance_id: int | None) -> int:
    return _NO_INSTANCE if instance_id is None else instance_id


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def _write_handle(ref: Any, address: int) -> None:
    ctypes.cast(ctypes.pointer(ref._obj), ctypes.POINTER(ctypes.c_void_p))[0] = address


def _write_text(buf: Any, length: Any, text: str) -> None:
    data = text.encode()
    if len(data) + 1 > length.value:
        raise _Fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    buf.value = data


class _Symbol:
    """One C function: records the call, needs init, maps _Fail to a return code.

    An object rather than a bound method because pynvml sets `restype` on some symbols.
    """

    def __init__(self, lib: FakeNvmlLib, name: str, impl: Callable[..., Any]):
        self.lib, self.name, self.impl = lib, name, impl

    def __call__(self, *args: Any) -> Any:
        self.lib.calls.append(self.name)
        if not self.lib.is_initialized and self.name not in _NO_INIT_NEEDED:
            return pynvml.NVML_ERROR_UNINITIALIZED
        try:
            if self.name in self.lib.driver.errors:
                raise _Fail(self.lib.driver.errors[self.name])
            if self.name.startswith("nvmlDevice") and self.name not in _BY_INDEX:
                args = (self.lib.device(self.name, args[0]), *args[1:])
            if self.name in _TWO_DEVICES:
                args = (args[0], self.lib.device(self.name, args[1]), *args[2:])
            result = self.impl(*args)
        except _Fail as fail:
            return fail.code
        return SUCCESS if result is None else result


_BY_INDEX = frozenset({"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"})
_TWO_DEVICES = frozenset({"nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetP2PStatus"})
# What a MIG device handle cannot answer: the parent GPU's sensors and bus.
_NOT_ON_MIG = frozenset(
    {
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetCpuAffinity",
        "nvmlDeviceGetMemoryAffinity",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetP2PStatus",
    }
)


class FakeNvmlLib:
    """Stands in for the CDLL of libnvidia-ml.so.1."""

    def __init__(self, driver: FakeDriver):
        self.driver = driver
        self.calls: list[str] = []
        self.device_calls: list[tuple[str, str]] = []  # (uuid, symbol) per device call
        self.absent_lookups: list[str] = []
        self.unimplemented: list[str] = []
        self.is_initialized = False
        self._c = _CFunctions(self)
        self._gpus: dict[int, FakeGpu] = {}
        self._parents: dict[int, FakeGpu] = {}
        for index, gpu in enumerate(driver.gpus):
            self._gpus[0x1000 * (index + 1)] = gpu
            for slot, mig in enumerate(gpu.mig_devices):
                self._gpus[0x1000 * (index + 1) + 0x10 * (slot + 1)] = mig
                self._parents[id(mig)] = gpu

    def load(self, path: str, *args: Any, **kwargs: Any) -> FakeNvmlLib:
        """Replaces pynvml.CDLL, so pynvml's own loading code runs."""
        if path != "libnvidia-ml.so.1":
            self.unimplemented.append(f"CDLL({path!r})")
            raise FakeNvmlGap(f"pynvml tried to load {path!r}; the fake only is libnvidia-ml.so.1")
        if not self.driver.has_library:
            raise OSError(f"{path}: cannot open shared object file: No such file or directory")
        return self

    def __getattr__(self, name: str) -> _Symbol:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self.driver.absent:
            self.absent_lookups.append(name)
            raise AttributeError(name)  # pynvml turns this into NVMLError_FunctionNotFound
        impl = getattr(self._c, name, None)
        if impl is None:
            self.unimplemented.append(name)
            raise FakeNvmlGap(
                f"the fake NVML library does not implement {name}: add it to "
                "tests/fake_nvml.py, or list it in FakeDriver.absent"
            )
        return _Symbol(self, name, impl)

    def handle_of(self, gpu: FakeGpu) -> int:
        return next(address for address, known in self._gpus.items() if known is gpu)

    def device(self, name: str, handle: Any) -> FakeGpu:
        gpu = self._gpus.get(_address(handle) or 0)
        if gpu is None:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.device_calls.append((gpu.uuid, name))
        parent = self._parents.get(id(gpu))
        if gpu.is_lost or (parent is not None and parent.is_lost):
            raise _Fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.errors:
            raise _Fail(gpu.errors[name])
        if parent is not None and name in _NOT_ON_MIG:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def parent_of(self, gpu: FakeGpu) -> FakeGpu | None:
        return self._parents.get(id(gpu))

    def is_mig_device(self, gpu: FakeGpu) -> bool:
        return id(gpu) in self._parents


class _CFunctions:
    """The C functions, named as in nvml.h; device functions get the FakeGpu for the handle."""

    def __init__(self, lib: FakeNvmlLib):
        self.lib = lib

    def nvmlInitWithFlags(self, flags: int) -> None:
        driver = self.lib.driver
        if driver.init_exception is not None:
            raise driver.init_exception
        if driver.init_result != SUCCESS:
            raise _Fail(driver.init_result)
        self.lib.is_initialized = True

    def nvmlShutdown(self) -> None:
        self.lib.is_initialized = False

    def nvmlErrorString(self, code: int) -> bytes:
        return _ERROR_STRINGS.get(code, b"Unknown Error")

    def nvmlSystemGetDriverVersion(self, buf: Any, length: Any) -> None:
        _write_text(buf, length, self.lib.driver.driver_version)

    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> None:
        ref._obj.value = self.lib.driver.cuda_version

    def nvmlDeviceGetCount_v2(self, ref: Any) -> None:
        ref._obj.value = len(self.lib.driver.gpus)

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> None:
        gpus = self.lib.driver.gpus
        if not 0 <= index.value < len(gpus):
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = gpus[index.value]
        if gpu.is_lost:
            raise _Fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        if "nvmlDeviceGetHandleByIndex_v2" in gpu.errors:
            raise _Fail(gpu.errors["nvmlDeviceGetHandleByIndex_v2"])
        _write_handle(ref, self.lib.handle_of(gpu))

    def nvmlDeviceGetUUID(self, gpu: FakeGpu, buf: Any, length: Any) -> None:
        _write_text(buf, length, gpu.uuid)

    def nvmlDeviceGetName(self, gpu: FakeGpu, buf: Any, length: Any) -> None:
        _write_text(buf, length, gpu.name)

    def nvmlDeviceGetMemoryInfo_v2(self, gpu: FakeGpu, ref: Any) -> None:
        mem = ref._obj
        if mem.version != pynvml.nvmlMemory_v2:
            raise _Fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        mem.total, mem.reserved, mem.used = (
            gpu.mem_total_bytes,
            gpu.mem_reserved_bytes,
            gpu.mem_used_bytes,
        )
        mem.free = gpu.mem_total_bytes - gpu.mem_reserved_bytes - gpu.mem_used_bytes

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, ref: Any) -> None:
        mem = ref._obj
        mem.total, mem.used = gpu.mem_total_bytes, gpu.mem_used_bytes + gpu.mem_reserved_bytes
        mem.free = gpu.mem_total_bytes - mem.used

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu, ref: Any) -> None:
        if gpu.is_mig_mode_on or gpu.mig_devices or self.lib.is_mig_device(gpu):
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        ref._obj.gpu, ref._obj.memory = gpu.util_pct, gpu.util_pct // 2

    def nvmlDeviceGetPciInfo_v3(self, gpu: FakeGpu, ref: Any) -> None:
        domain, bus, rest = gpu.bus_id.split(":")
        info = ref._obj
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)

    def nvmlDeviceGetTemperatureV(self, gpu: FakeGpu, ref: Any) -> None:
        temp = ref._obj
        if temp.version != pynvml.nvmlTemperature_v1:
            raise _Fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if temp.sensorType != pynvml.NVML_TEMPERATURE_GPU:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        temp.temperature = gpu.temperature_c

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: Any, ref: Any) -> None:
        if sensor.value != pynvml.NVML_TEMPERATURE_GPU:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        ref._obj.value = gpu.temperature_c

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu, ref: Any) -> None:
        ref._obj.value = gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu, ref: Any) -> None:
        ref._obj.value = gpu.power_limit_mw

    def nvmlDeviceGetCudaComputeCapability(self, gpu: FakeGpu, major: Any, minor: Any) -> None:
        major._obj.value, minor._obj.value = gpu.compute_capability

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu, current: Any, pending: Any) -> None:
        if not (gpu.mig_capable or gpu.mig_devices):
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        current._obj.value = pending._obj.value = int(gpu.is_mig_mode_on or bool(gpu.mig_devices))

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu, ref: Any) -> None:
        if not (gpu.mig_capable or gpu.mig_devices):
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        ref._obj.value = _MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: Any, ref: Any) -> None:
        if not 0 <= index.value < _MAX_MIG_DEVICES:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index.value >= len(gpu.mig_devices):
            raise _Fail(pynvml.NVML_ERROR_NOT_FOUND)
        _write_handle(ref, self.lib.handle_of(gpu.mig_devices[index.value]))

    def nvmlDeviceGetGpuInstanceId(self, gpu: FakeGpu, ref: Any) -> None:
        if gpu.gpu_instance_id is None:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        ref._obj.value = gpu.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, gpu: FakeGpu, ref: Any) -> None:
        if gpu.compute_instance_id is None:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        ref._obj.value = gpu.compute_instance_id

    def nvmlDeviceIsMigDeviceHandle(self, gpu: FakeGpu, ref: Any) -> None:
        ref._obj.value = int(self.lib.is_mig_device(gpu))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, gpu: FakeGpu, ref: Any) -> None:
        parent = self.lib.parent_of(gpu)
        if parent is None:  # a whole GPU's handle is not a MIG device handle
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _write_handle(ref, self.lib.handle_of(parent))

    def nvmlDeviceGetAttributes_v2(self, gpu: FakeGpu, ref: Any) -> None:
        if not self.lib.is_mig_device(gpu):  # "currently only supports MIG device handles"
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        *compute, gpu_slices = gpu.mig_profile.split(".")[0:-1]  # 1c.3g.20gb, 3g.20gb
        attrs = ref._obj
        attrs.gpuInstanceSliceCount = int(gpu_slices.rstrip("g"))
        attrs.computeInstanceSliceCount = (
            int(compute[0].rstrip("c")) if compute else attrs.gpuInstanceSliceCount
        )
        attrs.memorySizeMB = gpu.mem_total_bytes // MIB
        attrs.multiprocessorCount = 14 * attrs.computeInstanceSliceCount

    def nvmlDeviceGetTopologyCommonAncestor(self, gpu: FakeGpu, other: FakeGpu, ref: Any) -> None:
        if gpu.numa_node is None or other.numa_node is None:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.pcie_switch is not None and gpu.pcie_switch == other.pcie_switch:
            ref._obj.value = pynvml.NVML_TOPOLOGY_SINGLE
        elif gpu.numa_node == other.numa_node:
            ref._obj.value = pynvml.NVML_TOPOLOGY_NODE
        else:
            ref._obj.value = pynvml.NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: Any, ref: Any) -> None:
        ref._obj.value = bool(self._nvlink(gpu, link))

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, gpu: FakeGpu, link: Any, ref: Any) -> None:
        remote = self._nvlink(gpu, link)
        if not remote:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # an inactive link has no far end
        ref._obj.busId = remote.encode()

    def _nvlink(self, gpu: FakeGpu, link: Any) -> str:
        if not gpu.nvlinks:  # a GPU without NVLink refuses every link
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= _value(link) < len(gpu.nvlinks):
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[_value(link)]

    def nvmlDeviceGetP2PStatus(self, gpu: FakeGpu, other: FakeGpu, index: Any, ref: Any) -> None:
        if _value(index) == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            linked = other.bus_id in gpu.nvlinks or (
                NVSWITCH_BUS_ID in gpu.nvlinks and NVSWITCH_BUS_ID in other.nvlinks
            )
        else:  # over PCIe: within one socket
            linked = gpu.numa_node is not None and gpu.numa_node == other.numa_node
        ref._obj.value = (
            pynvml.NVML_P2P_STATUS_OK if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        )

    def nvmlDeviceGetCpuAffinity(self, gpu: FakeGpu, size: Any, ref: Any) -> None:
        if gpu.numa_node is None:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _write_mask(ref._obj, gpu.cpu_ids)

    def nvmlDeviceGetMemoryAffinity(self, gpu: FakeGpu, size: Any, ref: Any, scope: Any) -> None:
        if gpu.numa_node is None:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _write_mask(ref._obj, (gpu.numa_node,))

    def _processes(self, gpu: FakeGpu, kind: str, count: Any, array: Any) -> int:
        """The INSUFFICIENT_SIZE handshake: a NULL array (or a short one) gets the count."""
        if gpu.is_mig_mode_on or gpu.mig_devices:  # root only, on a MIG parent
            raise _Fail(pynvml.NVML_ERROR_NO_PERMISSION)
        procs = [p for p in gpu.processes if kind in p.kinds]
        if array is None or count._obj.value < len(procs):
            count._obj.value = len(procs)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if procs else SUCCESS
        for slot, proc in zip(array, procs):
            slot.pid = proc.pid
            slot.usedGpuMemory = 2**64 - 1 if proc.used_mem_bytes is None else proc.used_mem_bytes
            slot.gpuInstanceId = _or_no_instance(gpu.gpu_instance_id)
            slot.computeInstanceId = _or_no_instance(gpu.compute_instance_id)
        count._obj.value = len(procs)
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, gpu: FakeGpu, count: Any, array: Any) -> int:
        return self._processes(gpu, "compute", count, array)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, gpu: FakeGpu, count: Any, array: Any) -> int:
        return self._processes(gpu, "compute", count, array)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, gpu: FakeGpu, count: Any, array: Any) -> int:
        return self._processes(gpu, "graphics", count, array)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, gpu: FakeGpu, count: Any, array: Any) -> int:
        return self._processes(gpu, "graphics", count, array)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`fake_nvml(FakeDriver(...))` installs the fake; pynvml's state is restored afterwards."""
    installed: list[FakeNvmlLib] = []

    def install(driver: FakeDriver) -> FakeNvmlLib:
        lib = FakeNvmlLib(driver)
        # Everything pynvml keeps between calls: the loaded library, the symbol cache,
        # the init refcount and the error strings it learned from nvmlErrorString.
        monkeypatch.setattr(pynvml, "nvmlLib", None)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
        monkeypatch.setattr(
            pynvml.NVMLError, "_errcode_to_string", dict(pynvml.NVMLError._errcode_to_string)
        )
        monkeypatch.setattr(pynvml, "CDLL", lib.load)
        installed.append(lib)
        return lib

    yield install
    gaps = [name for lib in installed for name in lib.unimplemented]
    assert not gaps, f"the code under test called NVML symbols the fake lacks: {gaps}"
