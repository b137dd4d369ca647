"""The NVML backend against a fake NVML C library underneath the real pynvml module."""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from types import SimpleNamespace

import psutil
import pynvml
import pytest

from fake_nvml import (
    OLD_DRIVER_ABSENT,
    FakeDriver,
    FakeNvmlGap,
    FakeProcess,
    fake_nvml,
    make_gpu,
    make_mig,
)
from gpusched.gpus import nvml
from gpusched.gpus.nvml import NvmlBackend

__all__ = ["fake_nvml"]  # the fixture, imported so that pytest finds it here

GIB = 2**30
MIB = 2**20
NOBODY_UID = 65534


def _pid_beyond_pid_max() -> int:
    """A host pid that cannot exist in this pid namespace, as NVML reports from a container."""
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 4242


def _own_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_modern_driver_reads_several_gpu_models(fake_nvml):
    me = os.getpid()
    h100 = make_gpu(
        "H100",
        0,
        mem_used_bytes=20 * GIB,
        mem_reserved_bytes=512 * MIB,
        util_pct=87,
        temperature_c=61,
        power_mw=512_345,
        processes=[FakeProcess(me, 18 * GIB)],
    )
    a100 = make_gpu("A100", 1, mem_used_bytes=0, util_pct=0, temperature_c=30, power_mw=55_000)
    # A C+G process is in both lists: listed once, with the memory that one list knows.
    l4 = make_gpu(
        "L4",
        2,
        mem_used_bytes=3 * GIB,
        util_pct=12,
        temperature_c=44,
        power_mw=30_250,
        processes=[
            FakeProcess(me, 2 * GIB, frozenset({"compute"})),
            FakeProcess(me, None, frozenset({"graphics"})),
        ],
    )
    lib = fake_nvml(
        FakeDriver(gpus=[h100, a100, l4], driver_version="550.54.15", cuda_version=12040)
    )

    inv = NvmlBackend().read()

    assert (inv.backend, inv.problem) == ("nvml", "")
    assert (inv.driver_version, inv.cuda_version) == ("550.54.15", "12.4")
    assert inv.read_at == pytest.approx(time.time(), abs=60)
    assert [g.index for g in inv.gpus] == [0, 1, 2]
    assert [g.uuid for g in inv.gpus] == [h100.uuid, a100.uuid, l4.uuid]
    assert [g.name for g in inv.gpus] == [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA L4",
    ]
    assert [g.bus_id for g in inv.gpus] == [
        "00000000:18:00.0",
        "00000000:28:00.0",
        "00000000:38:00.0",
    ]
    gpu0 = inv.gpus[0]
    # v2 memory: used leaves the driver's reserved memory out, as nvidia-smi shows it.
    assert (gpu0.mem_total_bytes, gpu0.mem_used_bytes) == (81559 * MIB, 20 * GIB)
    assert (gpu0.util_pct, gpu0.temperature_c) == (87.0, 61)
    assert (gpu0.power_w, gpu0.power_limit_w) == (512.345, 700.0)
    assert [g.compute_capability for g in inv.gpus] == [(9, 0), (8, 0), (8, 9)]
    assert all(g.is_healthy and g.health_reason == "" for g in inv.gpus)
    assert all(g.mig_devices == () and g.parent_index is None for g in inv.gpus)
    assert inv.gpus[1].processes == ()
    [proc0] = gpu0.processes
    assert (proc0.pid, proc0.gpu_uuid, proc0.used_mem_bytes) == (me, h100.uuid, 18 * GIB)
    assert proc0.is_visible and proc0.user == _own_user()
    assert proc0.command == " ".join(psutil.Process(me).cmdline())
    [proc2] = inv.gpus[2].processes
    assert (proc2.pid, proc2.gpu_uuid, proc2.used_mem_bytes) == (me, l4.uuid, 2 * GIB)
    assert "nvmlDeviceGetMemoryInfo" not in lib.calls  # v1 only where v2 is missing
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in lib.calls
    assert "nvmlDeviceGetComputeRunningProcesses_v2" not in lib.calls


def test_old_driver_without_v3_process_symbols_falls_back(fake_nvml):
    me = os.getpid()
    gpu = make_gpu(
        "T4",
        0,
        mem_used_bytes=5 * GIB,
        mem_reserved_bytes=256 * MIB,
        temperature_c=52,
        processes=[FakeProcess(me, 4 * GIB), FakeProcess(1, None, frozenset({"graphics"}))],
    )
    lib = fake_nvml(
        FakeDriver(
            gpus=[gpu], driver_version="470.256.02", cuda_version=11040, absent=OLD_DRIVER_ABSENT
        )
    )

    backend = NvmlBackend()
    inv = backend.read()

    assert (inv.problem, inv.driver_version, inv.cuda_version) == ("", "470.256.02", "11.4")
    [gpu0] = inv.gpus
    assert gpu0.is_healthy and gpu0.name == "Tesla T4"
    assert {(p.pid, p.used_mem_bytes) for p in gpu0.processes} == {(me, 4 * GIB), (1, None)}
    # v1 memory has no reserved field: reserved memory shows as used.
    assert (gpu0.mem_total_bytes, gpu0.mem_used_bytes) == (15360 * MIB, 5 * GIB + 256 * MIB)
    assert gpu0.temperature_c == 52
    assert set(lib.absent_lookups) == OLD_DRIVER_ABSENT
    assert {
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetTemperature",
    } <= set(lib.calls)
    # pynvml's own unversioned wrapper breaks on this driver: the reason for the fallback.
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    backend.close()


def test_library_not_found_explains_and_suggests_simulated_gpus(fake_nvml):
    fake_nvml(FakeDriver(gpus=[make_gpu("H100", 0)], has_library=False))

    backend = NvmlBackend()  # must not raise
    inv = backend.read()

    assert (inv.gpus, inv.backend) == ((), "nvml")
    assert "libnvidia-ml.so.1" in inv.problem and "not found" in inv.problem
    assert "GPUSCHED_SIMULATE=4x80GiB" in inv.problem
    assert inv.problem.count(". ") == 0 and inv.problem.endswith(".")  # one sentence
    assert pynvml.nvmlLib is None
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):  # what pynvml itself raised
        pynvml.nvmlInit()
    backend.close()


def test_driver_not_loaded_explains_and_retries_every_30s(fake_nvml):
    lib = fake_nvml(
        FakeDriver(gpus=[make_gpu("A100", 0)], init_result=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    )
    clock = _Clock()
    backend = NvmlBackend(clock=clock)

    inv = backend.read()
    assert inv.gpus == ()
    assert "driver is not loaded" in inv.problem and "GPUSCHED_SIMULATE" in inv.problem
    clock.now += 10
    assert backend.read().problem == inv.problem
    assert lib.calls.count("nvmlInitWithFlags") == 1  # no retry within 30 s

    lib.driver.init_result = pynvml.NVML_SUCCESS  # the driver gets loaded
    clock.now += nvml.RETRY_INIT_S
    inv = backend.read()
    assert inv.problem == "" and [g.name for g in inv.gpus] == ["NVIDIA A100-SXM4-40GB"]
    assert lib.calls.count("nvmlInitWithFlags") == 2
    backend.close()


@pytest.mark.parametrize(
    "code, expected",
    [
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "driver upgrade without a reboot"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission on /dev/nvidia*"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML could not start (NVMLError_Unknown: Unknown Error)"),
    ],
    ids=["rm-version-mismatch", "no-permission", "unknown"],
)
def test_other_init_failures_explain_themselves(fake_nvml, code, expected):
    fake_nvml(FakeDriver(gpus=[make_gpu("L4", 0)], init_result=code))

    inv = NvmlBackend().read()

    assert inv.gpus == () and expected in inv.problem and "GPUSCHED_SIMULATE" in inv.problem


def test_zero_gpus_explains(fake_nvml):
    fake_nvml(FakeDriver(gpus=[], driver_version="535.183.01"))

    inv = NvmlBackend().read()

    assert inv.gpus == ()
    assert "no NVIDIA GPUs" in inv.problem and "535.183.01" in inv.problem
    assert "GPUSCHED_SIMULATE=4x80GiB" in inv.problem
    assert inv.driver_version == "535.183.01"


def test_one_gpu_lost_while_others_work(fake_nvml):
    good0 = make_gpu("H100", 0, mem_used_bytes=GIB, temperature_c=40)
    lost = make_gpu("H100", 1, is_lost=True)  # fallen off the bus: even the handle fails
    # Lost after its handle was taken: the memory call is the first to say so.
    lost_late = make_gpu(
        "H100", 2, errors={"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_GPU_IS_LOST}
    )
    # Lost while reading its power: the fields read so far are kept.
    lost_mid = make_gpu(
        "H100", 3, errors={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_GPU_IS_LOST}
    )
    good4 = make_gpu("H100", 4, mem_used_bytes=2 * GIB, temperature_c=41)
    lib = fake_nvml(FakeDriver(gpus=[good0, lost, lost_late, lost_mid, good4]))

    inv = NvmlBackend().read()

    assert inv.problem == ""
    assert [g.is_healthy for g in inv.gpus] == [True, False, False, False, True]
    assert inv.gpus[1].health_reason == "NVML cannot open GPU 1: GPU is lost"
    assert inv.gpus[1].uuid == "unknown-1"
    assert inv.gpus[2].health_reason == "NVML: GPU is lost"
    assert inv.gpus[2].uuid == lost_late.uuid and inv.gpus[2].mem_used_bytes is None
    assert inv.gpus[3].health_reason == "NVML: GPU is lost"
    assert (inv.gpus[3].uuid, inv.gpus[3].power_w) == (lost_mid.uuid, None)
    assert inv.gpus[3].temperature_c == 35
    assert (inv.gpus[0].mem_used_bytes, inv.gpus[0].temperature_c) == (GIB, 40)
    assert (inv.gpus[4].mem_used_bytes, inv.gpus[4].temperature_c) == (2 * GIB, 41)
    assert [g.uuid for g in inv.schedulable() if g.is_healthy] == [good0.uuid, good4.uuid]
    # A lost GPU can take seconds per call: it is asked nothing after the failing one.
    asked_lost_late = [name for uuid, name in lib.device_calls if uuid == lost_late.uuid]
    assert asked_lost_late[-1] == "nvmlDeviceGetMemoryInfo_v2"


def test_power_not_supported_is_none_and_the_rest_is_read(fake_nvml):
    gpu = make_gpu(
        "L4",
        0,
        temperature_c=50,
        util_pct=33,
        mem_used_bytes=GIB,
        errors={
            "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetEnforcedPowerLimit": pynvml.NVML_ERROR_NOT_SUPPORTED,
        },
    )
    fake_nvml(FakeDriver(gpus=[gpu]))

    [gpu0] = NvmlBackend().read().gpus

    assert (gpu0.power_w, gpu0.power_limit_w) == (None, None)
    assert gpu0.is_healthy and gpu0.health_reason == ""
    assert (gpu0.temperature_c, gpu0.util_pct, gpu0.mem_used_bytes) == (50, 33.0, GIB)


def test_memory_v2_refused_falls_back_to_v1(fake_nvml):
    gpu = make_gpu(
        "A100",
        0,
        mem_used_bytes=GIB,
        mem_reserved_bytes=MIB,
        errors={"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_NOT_SUPPORTED},
    )
    lib = fake_nvml(FakeDriver(gpus=[gpu]))

    [gpu0] = NvmlBackend().read().gpus

    assert gpu0.is_healthy and gpu0.mem_used_bytes == GIB + MIB
    calls = lib.calls
    assert calls.index("nvmlDeviceGetMemoryInfo_v2") < calls.index("nvmlDeviceGetMemoryInfo")


def test_per_process_memory_not_available_is_none(fake_nvml):
    me = os.getpid()
    gpu = make_gpu("A100", 0, mem_used_bytes=7 * GIB, processes=[FakeProcess(me, None)])
    fake_nvml(FakeDriver(gpus=[gpu]))

    [gpu0] = NvmlBackend().read().gpus

    [proc] = gpu0.processes
    assert (proc.pid, proc.used_mem_bytes, proc.user) == (me, None, _own_user())
    assert gpu0.mem_used_bytes == 7 * GIB  # what accounting falls back to


def test_mig_gpu_with_two_instances(fake_nvml):
    me = os.getpid()
    parent = make_gpu("A100", 0, mem_used_bytes=9 * GIB)
    parent.mig_devices = [
        make_mig(
            parent,
            gi=1,
            ci=0,
            profile="3g.20gb",
            mem_bytes=19968 * MIB,
            mem_used_bytes=6 * GIB,
            processes=[FakeProcess(me, 6 * GIB)],
        ),
        make_mig(
            parent,
            gi=2,
            ci=0,
            profile="3g.20gb",
            mem_bytes=19968 * MIB,
            mem_used_bytes=3 * GIB,
            processes=[FakeProcess(1, None)],
        ),
    ]
    other = make_gpu("A100", 1)  # MIG-capable, MIG mode off
    fake_nvml(FakeDriver(gpus=[parent, other]))

    inv = NvmlBackend().read()

    gpu0 = inv.gpus[0]
    assert gpu0.uuid == parent.uuid and gpu0.processes == () and gpu0.util_pct is None
    assert gpu0.is_healthy
    mig1, mig2 = gpu0.mig_devices
    assert mig1.uuid.startswith("MIG-") and mig1.uuid == parent.mig_devices[0].uuid
    assert mig2.uuid == parent.mig_devices[1].uuid
    assert (mig1.index, mig1.parent_index, mig1.gpu_instance_id, mig1.compute_instance_id) == (
        0,
        0,
        1,
        0,
    )
    assert (mig2.gpu_instance_id, mig2.compute_instance_id, mig2.label) == (2, 0, "0/2")
    assert mig1.name == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert (mig1.mem_total_bytes, mig1.mem_used_bytes) == (19968 * MIB, 6 * GIB)
    assert (mig1.bus_id, mig1.compute_capability) == ("00000000:18:00.0", (8, 0))
    assert [(p.pid, p.gpu_uuid, p.used_mem_bytes) for p in mig1.processes] == [
        (me, mig1.uuid, 6 * GIB)
    ]
    assert [(p.pid, p.gpu_uuid, p.used_mem_bytes) for p in mig2.processes] == [(1, mig2.uuid, None)]
    assert inv.gpus[1].mig_devices == ()
    assert [g.uuid for g in inv.schedulable()] == [mig1.uuid, mig2.uuid, other.uuid]


def test_mig_mode_without_instances_is_never_given_out(fake_nvml):
    parent = make_gpu("H100", 0, is_mig_mode_on=True)  # MIG on, no instances created yet
    fake_nvml(FakeDriver(gpus=[parent, make_gpu("H100", 1)]))

    inv = NvmlBackend().read()

    gpu0 = inv.gpus[0]
    assert (gpu0.uuid, gpu0.mig_devices, gpu0.is_healthy) == (parent.uuid, (), False)
    assert "no MIG devices" in gpu0.health_reason
    assert [g.is_healthy for g in inv.schedulable()] == [False, True]


def test_process_from_another_pid_namespace_is_kept_as_not_visible(fake_nvml):
    host_pid = _pid_beyond_pid_max()
    gpu = make_gpu("H100", 0, processes=[FakeProcess(host_pid, 30 * GIB)])
    fake_nvml(FakeDriver(gpus=[gpu]))

    [proc] = NvmlBackend().read().gpus[0].processes

    assert (proc.pid, proc.used_mem_bytes, proc.is_visible) == (host_pid, 30 * GIB, False)
    assert (proc.user, proc.command) == (None, None)


@pytest.fixture
def other_users_process():
    """A real `sleep` owned by another uid (spawned as nobody when we are root)."""
    if os.geteuid() != 0:
        mine = os.getuid()
        for proc in psutil.process_iter(["uids", "cmdline"]):
            if proc.info["uids"] and proc.info["uids"].real != mine and proc.info["cmdline"]:
                yield proc.pid, proc.info["uids"].real, " ".join(proc.info["cmdline"])
                return
        pytest.skip("no process of another user is visible and we cannot start one")
    child = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: os.setuid(NOBODY_UID))
    try:
        yield child.pid, NOBODY_UID, "sleep 30"
    finally:
        child.kill()
        child.wait(timeout=10)


@pytest.mark.system
def test_process_of_another_user_is_attributed(fake_nvml, other_users_process):
    pid, uid, command = other_users_process
    gpu = make_gpu("H100", 0, processes=[FakeProcess(pid, 10 * GIB)])
    fake_nvml(FakeDriver(gpus=[gpu]))

    [proc] = NvmlBackend().read().gpus[0].processes

    assert proc.user == pwd.getpwuid(uid).pw_name and proc.user != _own_user()
    assert (proc.pid, proc.command, proc.is_visible) == (pid, command, True)


def test_library_mismatch_error_at_init_is_a_problem_not_a_crash(fake_nvml):
    error = pynvml.NVMLLibraryMismatchError("Unversioned function called")
    assert not isinstance(error, pynvml.NVMLError)  # why it needs its own except
    fake_nvml(FakeDriver(gpus=[make_gpu("H100", 0)], init_exception=error))

    inv = NvmlBackend().read()

    assert inv.gpus == ()
    assert "nvidia-ml-py does not match" in inv.problem and "GPUSCHED_SIMULATE" in inv.problem


def test_pynvml_not_importable_is_a_problem(monkeypatch):
    monkeypatch.setattr(nvml, "pynvml", None)
    monkeypatch.setattr(nvml, "_IMPORT_ERROR", "ImportError: No module named 'pynvml'")

    inv = NvmlBackend().read()

    assert inv.gpus == () and "nvidia-ml-py" in inv.problem and "No module" in inv.problem


def test_driver_gone_after_start_is_a_problem_and_shuts_down(fake_nvml):
    lib = fake_nvml(FakeDriver(gpus=[make_gpu("L4", 0)]))
    backend = NvmlBackend(clock=_Clock())
    assert len(backend.read().gpus) == 1

    lib.driver.errors["nvmlDeviceGetCount_v2"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    inv = backend.read()

    assert inv.gpus == () and "NVML stopped answering (Driver Not Loaded)" in inv.problem
    assert not lib.is_initialized and "nvmlShutdown" in lib.calls


def test_close_shuts_nvml_down_once(fake_nvml):
    lib = fake_nvml(FakeDriver(gpus=[make_gpu("L4", 0)]))
    backend = NvmlBackend()
    backend.read()
    assert lib.is_initialized and pynvml._nvmlLib_refcount == 1

    backend.close()
    backend.close()

    assert not lib.is_initialized and pynvml._nvmlLib_refcount == 0
    assert lib.calls.count("nvmlShutdown") == 1


def test_bus_id_bytes_from_older_pynvml_are_normalized():
    assert nvml._bus_id(SimpleNamespace(busId=b"00000000:41:00.0\x00")) == "00000000:41:00.0"
    assert nvml._bus_id(SimpleNamespace(busId="00000000:c1:00.0")) == "00000000:C1:00.0"
    assert nvml._bus_id(None) is None


def test_fake_fails_the_test_when_a_symbol_is_not_implemented(fake_nvml):
    lib = fake_nvml(FakeDriver(gpus=[make_gpu("L4", 0)]))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    with pytest.raises(FakeNvmlGap, match="nvmlDeviceGetFanSpeed"):
        pynvml.nvmlDeviceGetFanSpeed(handle)
    assert lib.unimplemented == ["nvmlDeviceGetFanSpeed"]
    lib.unimplemented.clear()  # or the fixture would fail this test at teardown
    pynvml.nvmlShutdown()


def test_fake_reports_an_absent_symbol_as_function_not_found(fake_nvml):
    fake_nvml(FakeDriver(gpus=[make_gpu("L4", 0)], absent=frozenset({"nvmlDeviceGetPowerUsage"})))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    pynvml.nvmlShutdown()
