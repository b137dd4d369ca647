"""MIG shown as nvidia-smi shows it: the parent GPU is a row of its own, its MIG devices
under it with their ids and profile; the parent is never given out whole; a job can ask
for a MIG profile. A real daemon and the real CLI, on fake NVML underneath pynvml."""

from __future__ import annotations

import pynvml

from conftest import wait_until
from fake_nvml import FakeDriver, FakeProcess, fake_nvml, make_gpu, make_mig
from gpusched.gpus.nvml import NvmlBackend
from nvmlhome import nvml_home

__all__ = ["fake_nvml"]

MIB = 2**20


def _a100_in_mig_mode(index: int):
    """An A100 with two 3g.20gb instances, as the issue's box has."""
    parent = make_gpu("A100", index, temperature_c=41, power_mw=88_500)
    parent.mig_devices = [
        make_mig(parent, gi=1, ci=0, profile="3g.20gb", mem_bytes=19968 * MIB),
        make_mig(
            parent,
            gi=2,
            ci=0,
            profile="3g.20gb",
            mem_bytes=19968 * MIB,
            processes=[FakeProcess(1, 512 * MIB)],
        ),
    ]
    return parent


def _box(lost_4090: bool = False) -> FakeDriver:
    return FakeDriver(
        gpus=[
            make_gpu("H100", 0, util_pct=3),
            make_gpu("4090", 1, is_lost=lost_4090),
            _a100_in_mig_mode(2),
        ]
    )


def _rows_by_uuid(home) -> dict:
    return {row["uuid"]: row for row in home.json("gpus")["gpus"]}


def _check_parent_and_migs(home, driver: FakeDriver) -> None:
    a100 = driver.gpus[2]
    result = home.json("gpus")
    uuids = [row["uuid"] for row in result["gpus"]]
    mig1, mig2 = (m.uuid for m in a100.mig_devices)
    # The parent, then its MIG devices right under it.
    assert uuids[uuids.index(a100.uuid) :] == [a100.uuid, mig1, mig2]
    parent = _rows_by_uuid(home)[a100.uuid]
    assert parent["name"] == "NVIDIA A100-SXM4-40GB" and parent["mig_mode"] is True
    assert (parent["temperature_c"], parent["power_w"], parent["util_pct"]) == (41, 88.5, None)
    assert parent["jobs"] == [] and parent["parent_uuid"] is None
    for mig, (gi, ci) in ((mig1, (1, 0)), (mig2, (2, 0))):
        row = _rows_by_uuid(home)[mig]
        assert (
            row["parent_uuid"],
            row["gpu_instance_id"],
            row["compute_instance_id"],
            row["mig_profile"],
            row["mig_mode"],
        ) == (a100.uuid, gi, ci, "3g.20gb", False)


def test_gpus_lists_the_mig_parent_with_its_devices(make_home, tmp_path):
    driver = _box()
    home = nvml_home(make_home, tmp_path, driver)
    home.start()
    _check_parent_and_migs(home, driver)
    a100 = driver.gpus[2]
    query = home.run(
        "gpus",
        "--query",
        "index,uuid,mig.mode.current,mig.profile,"
        "mig.parent_uuid,mig.gpu_instance_id,temperature.gpu",
        "--format",
        "csv,noheader",
    ).stdout.splitlines()
    assert f"2, {a100.uuid}, Enabled, [N/A], [N/A], [N/A], 41" in query
    assert f"2, {a100.mig_devices[0].uuid}, [N/A], 3g.20gb, {a100.uuid}, 1, [N/A]" in query
    human = home.run("gpus").stdout
    assert "NVIDIA A100-SXM4-40GB " in human and "MIG mode" in human
    assert "└ 2/1" in human and "└ 2/2" in human
    top = home.run("top", "--once").stdout
    assert "A100-SXM4-40GB" in top and "2/1" in top


def test_the_mig_parent_stays_listed_when_another_gpu_is_lost(make_home, tmp_path):
    driver = _box(lost_4090=True)
    home = nvml_home(make_home, tmp_path, driver)
    home.start()
    _check_parent_and_migs(home, driver)
    lost = _rows_by_uuid(home)
    assert not any(row["healthy"] for row in lost.values() if row["index"] == 1)


def test_a_job_asks_for_a_mig_profile_and_never_gets_the_parent(make_home, tmp_path):
    driver = _box()
    home = nvml_home(make_home, tmp_path, driver)
    home.start()
    a100 = driver.gpus[2]
    ids = [home.submit("--gpu-type", "3g.20gb", "--", "sleep", "60") for _ in range(3)]
    first, second = (home.wait_state(i, "running") for i in ids[:2])
    given = {first["gpus"][0], second["gpus"][0]}
    assert given == {m.uuid for m in a100.mig_devices}
    # ls names each job's MIG device (2/1, 2/2), as gpus does, not only its GPU.
    listed = {line.split()[0]: set(line.split()) for line in home.run("ls").stdout.splitlines()}
    labels = sorted(home.show(i)["gpu_labels"][0] for i in ids[:2])
    assert labels == ["2/1", "2/2"]
    assert {label for i in ids[:2] for label in labels if label in listed[str(i)]} == set(labels)
    assert home.run("ls", "--format", "jobid,gpuids", "--noheader").stdout.split()[:4] == [
        str(ids[0]),
        home.show(ids[0])["gpu_labels"][0],
        str(ids[1]),
        home.show(ids[1])["gpu_labels"][0],
    ]
    third = home.show(ids[2])
    assert third["state"] == "pending" and a100.uuid not in third["gpus"]
    # Whole GPUs: the H100 and the 4090 are free, the A100 never counts as one.
    whole = [home.submit("--gpus", "1", "--", "sleep", "60") for _ in range(3)]
    given = {home.wait_state(i, "running")["gpus"][0] for i in whole[:2]}
    assert given == {driver.gpus[0].uuid, driver.gpus[1].uuid}
    wait_until(lambda: home.show(whole[2])["pending_reason"], "a reason for the third")
    assert home.show(whole[2])["state"] == "pending"
    for job_id in ids + whole:
        home.run("cancel", str(job_id))


def test_mig_calls_answer_as_the_real_library_does(fake_nvml):
    parent = _a100_in_mig_mode(0)
    lib = fake_nvml(FakeDriver(gpus=[parent]))
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1)
        assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
        back = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert pynvml.nvmlDeviceGetUUID(back) == parent.uuid
        attrs = pynvml.nvmlDeviceGetAttributes_v2(mig)
        assert (attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (3, 19968)
        for call in (pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetUtilizationRates):
            try:
                call(mig)
            except pynvml.NVMLError_NotSupported:
                continue
            raise AssertionError(f"{call.__name__} answered on a MIG device")
        try:
            pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        except pynvml.NVMLError_InvalidArgument:
            pass
        else:
            raise AssertionError("a whole GPU's handle was taken for a MIG device's")
    finally:
        pynvml.nvmlShutdown()
    assert not lib.unimplemented


def test_profile_from_attributes_when_the_name_lacks_it(fake_nvml):
    # Drivers before R470 named a MIG device like its GPU: the profile comes from its
    # slices and memory, as nvidia-smi names it.
    parent = make_gpu("A100", 0)
    parent.mig_devices = [
        make_mig(parent, gi=3, ci=0, profile="1c.2g.10gb", mem_bytes=9728 * MIB, name=parent.name)
    ]
    fake_nvml(FakeDriver(gpus=[parent]))
    [gpu] = NvmlBackend().read().gpus
    assert gpu.is_mig_mode and gpu.mig_devices[0].mig_profile == "1c.2g.10gb"
    assert gpu.mig_devices[0].parent_uuid == parent.uuid
