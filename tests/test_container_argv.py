"""Containers (issue 19): the runtime's argv for every option, podman and docker, with and
without a CDI spec; the daemon's launch of a container job; submit's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusched.client.submit.jobrequest import container_field
from gpusched.client.submit.options import SubmitOptions
from gpusched.core.errors import UsageError
from gpusched.core.spec import container, jobspec
from gpusched.daemon.jobs import containers
from inproc import Box

UUIDS = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000")
CDI_YAML = f"""---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: {UUIDS[0]}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
"""


def argv(runtime: str = "podman", **changes) -> list[str]:
    args = {
        "name": "gpusched-abcd1234-7-1",
        "cwd": "/home/ann/proj",
        "uid": 1000,
        "gid": 100,
        "env_names": ["CUDA_VISIBLE_DEVICES", "GPUSCHED_JOB_ID"],
    }
    args.update(changes)
    options = args.pop("options", ())
    return container.run_argv(runtime, "pytorch:24.01", options, ("python", "train.py"), **args)


def test_podman_runs_the_command_removed_at_the_end_with_an_init_that_passes_signals():
    got = argv()
    assert got[:2] == ["podman", "run"]
    for option in (
        "--rm",
        "--init",
        "--sig-proxy=true",
        "--name=gpusched-abcd1234-7-1",
        "--network=host",
    ):
        assert option in got
    # The image, then the job's own command, exactly: nothing of ours after the image.
    assert got[-3:] == ["pytorch:24.01", "python", "train.py"]


def test_the_working_directory_is_mounted_and_entered():
    got = argv(cwd="/data/my proj")
    assert "--volume=/data/my proj:/data/my proj" in got and "--workdir=/data/my proj" in got


def test_the_progress_files_directory_is_mounted_too():
    got = argv(cwd="/w", mounts=("/logs", "/w"))
    volumes = [a for a in got if a.startswith("--volume")]
    assert volumes == ["--volume=/w:/w", "--volume=/logs:/logs"]


def test_the_job_environment_passes_by_name_so_values_come_from_the_jobs_environment():
    got = argv(env_names=["CUDA_VISIBLE_DEVICES", "MASTER_PORT"])
    assert "--env=CUDA_VISIBLE_DEVICES" in got and "--env=MASTER_PORT" in got
    assert not [a for a in got if a.startswith("--env=") and "=" in a[len("--env=") :]]


@pytest.mark.parametrize(
    "runtime, uid, expected",
    [
        ("podman", 1000, ["--userns=keep-id"]),  # rootless podman, as the user: same uid inside
        ("podman", 0, []),  # rootful podman for root's own job
        ("docker", 1000, ["--user=1000:100"]),  # docker's daemon is root: name the user
        ("docker", 0, []),
    ],
)
def test_the_job_runs_as_its_user(runtime: str, uid: int, expected: list[str]):
    got = argv(runtime, uid=uid)
    assert [a for a in got if a.startswith(("--user", "--userns"))] == expected


def test_gpus_by_cdi_name_when_a_cdi_spec_names_them():
    names = container.cdi_gpu_names([CDI_YAML])
    got = argv(gpu_uuids=UUIDS[:1], cdi_names=names)
    assert f"--device=nvidia.com/gpu={UUIDS[0]}" in got
    assert not [a for a in got if a.startswith("--gpus")]
    got = argv("docker", gpu_uuids=UUIDS[:1], cdi_names=names)
    assert f"--device=nvidia.com/gpu={UUIDS[0]}" in got and "--gpus" not in got


def test_without_a_cdi_name_for_every_gpu_the_runtimes_own_option():
    names = container.cdi_gpu_names([CDI_YAML])  # names UUIDS[0] only
    got = argv("docker", gpu_uuids=UUIDS, cdi_names=names)
    assert got[got.index("--gpus") + 1] == f'"device={UUIDS[0]},{UUIDS[1]}"'
    assert not [a for a in got if a.startswith("--device")]
    # podman's NVIDIA hook reads NVIDIA_VISIBLE_DEVICES, from the job's environment.
    got = argv("podman", gpu_uuids=UUIDS, cdi_names=names)
    assert not [a for a in got if a.startswith(("--device", "--gpus"))]


@pytest.mark.parametrize(
    "devices, expected",
    [
        ("cdi", [f"--device=nvidia.com/gpu={UUIDS[0]}"]),  # even without a spec seen
        ("runtime", ["--gpus", f'"device={UUIDS[0]}"']),  # even with one
    ],
)
def test_the_devices_setting_forces_one_way(devices: str, expected: list[str]):
    cdi = frozenset(UUIDS) if devices == "runtime" else frozenset()
    got = argv("docker", gpu_uuids=UUIDS[:1], devices=devices, cdi_names=cdi)
    assert [a for a in got if a.startswith(("--device", "--gpus", '"device'))] == expected


def test_a_job_without_gpus_gets_no_device():
    for runtime in container.RUNTIMES:
        got = argv(runtime, cdi_names=frozenset(UUIDS))
        assert not [a for a in got if a.startswith(("--device", "--gpus"))]


def test_pinned_cores_pin_the_container():
    assert "--cpuset-cpus=2,3" in argv(cpu_ids=(2, 3))
    assert not [a for a in argv() if a.startswith("--cpuset")]


def test_the_users_options_come_last_before_the_image_so_they_override_ours():
    got = argv(options=("--shm-size=8g", "--network=none"))
    assert got[-5:] == ["--shm-size=8g", "--network=none", "pytorch:24.01", "python", "train.py"]


def test_cdi_specs_in_json_and_of_other_kinds():
    as_json = json.dumps(
        {
            "cdiVersion": "0.6.0",
            "kind": "nvidia.com/gpu",
            "devices": [{"name": UUIDS[1]}, {"name": "MIG-abc"}],
        }
    )
    assert container.cdi_gpu_names([as_json]) == {UUIDS[1], "MIG-abc"}
    other = 'kind: vendor.com/fpga\ndevices:\n- name: "GPU-x"\n'
    assert container.cdi_gpu_names([other]) == frozenset()


def test_names_are_unique_per_home_job_and_attempt_and_valid_for_the_runtimes():
    assert container.container_name("ab12", 7, 2) == "gpusched-ab12-7-2"
    assert container.container_name("a/b c", 7, 1) == "gpusched-a-b-c-7-1"
    assert containers.home_token("/a/state") != containers.home_token("/b/state")


@pytest.mark.parametrize(
    "host, inside",
    [
        ("5,2", "1,0"),
        ("3", "0"),
        ("", ""),
        (",".join(UUIDS), ",".join(UUIDS)),
        ("MIG-a,4", "MIG-a,0"),
    ],
)
def test_gpu_indices_are_numbered_as_the_container_sees_them(host: str, inside: str):
    assert container.visible_inside(host) == inside


def test_index_mode_numbers_the_jobs_gpus_from_0_inside(tmp_path: Path):
    box = Box(
        tmp_path / "home",
        gpus="4x80GiB",
        config='[gpus]\nvisible_devices = "index"\n[scheduling]\ngpu_order = [3, 2, 1, 0]\n'
        'policy = "order"\n',
    )
    job_id = box.submit("--gpus", "2", "--container", "img", "--", "true")
    box.step()
    spec = box.shims.launched[job_id]
    assert sorted(box.show(job_id)["gpu_indices"]) == [2, 3]
    assert sorted(spec["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == ["0", "1"]
    assert sorted(spec["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == ["2", "3"]  # the host's


def test_removal_stops_at_once_and_ignores_a_container_already_gone():
    assert container.remove_argv("podman", "n") == [
        "podman",
        "rm",
        "--force",
        "--ignore",
        "--time=0",
        "n",
    ]
    assert container.remove_argv("docker", "n") == ["docker", "rm", "--force", "n"]


@pytest.mark.parametrize(
    "code, expected",
    [
        (143, 15),
        (137, 9),
        (138, 10),
        (3, None),
        (128, None),
        (125, None),
        (None, None),
        (255, None),
    ],
)
def test_the_runtimes_128_plus_n_is_signal_n(code, expected):
    assert container.signal_of_exit(code) == expected


# -- submit and the daemon's checks ------------------------------------------------------------


def test_submit_sends_the_image_its_options_and_the_env_names():
    opts = SubmitOptions(container="busybox", container_opt=["--shm-size=1g"], env=["A=1", "B=x=y"])
    assert container_field(opts) == {
        "container": ["busybox", "--env=A", "--env=B", "--shm-size=1g"]
    }
    assert container_field(SubmitOptions()) == {}


@pytest.mark.parametrize(
    "opts, words",
    [
        ({"container_opt": ["--privileged"]}, "add --container IMAGE"),
        ({"container": "--rm"}, "takes an image name"),
        ({"container": ""}, "takes an image name"),
    ],
)
def test_submit_refuses_what_is_not_a_container(opts: dict, words: str):
    with pytest.raises(UsageError, match=words):
        container_field(SubmitOptions(**opts))


@pytest.mark.parametrize("value", ["busybox", [""], ["-x"], [1], ["a\0b"], {"image": "x"}])
def test_the_daemon_checks_the_container_field(value):
    with pytest.raises(UsageError, match="container"):
        jobspec.check_job_spec({"command": ["true"], "container": value}, [])


# -- the daemon's launch (in process) -----------------------------------------------------------


def test_a_container_job_is_launched_as_the_runtimes_run(tmp_path: Path):
    box = Box(tmp_path / "home", config='[containers]\nruntime = "docker"\n')
    job_id = box.submit(
        "--gpus", "2", "--container", "img:1", "--container-opt=--ipc=host", "--", "python", "t.py"
    )
    box.step()
    spec = box.shims.launched[job_id]
    job = box.show(job_id)
    name = f"gpusched-{containers.home_token(box.paths.state_dir)}-{job_id}-1"
    command = spec["command"]
    assert command[:2] == ["docker", "run"] and f"--name={name}" in command
    assert command[-4:] == ["--ipc=host", "img:1", "python", "t.py"]
    assert command[command.index("--gpus") + 1] == '"device=' + ",".join(job["gpus"]) + '"'
    assert "--env=CUDA_VISIBLE_DEVICES" in command and "--env=GPUSCHED_RUN_TOKEN" in command
    assert spec["container_remove"]["argv"] == ["docker", "rm", "--force", name]
    # The job itself keeps its own command: that is what ls, show and resubmit read.
    assert job["command"] == ["python", "t.py"]


def test_a_plain_job_is_launched_as_before(tmp_path: Path):
    box = Box(tmp_path / "home")
    job_id = box.submit("--", "python", "t.py")
    box.step()
    assert box.shims.launched[job_id]["command"] == ["python", "t.py"]
    assert "container_remove" not in box.shims.launched[job_id]


def test_cdi_specs_are_read_from_their_directories(tmp_path: Path):
    (tmp_path / "nvidia.yaml").write_text(CDI_YAML)
    (tmp_path / "notes.txt").write_text(f"name: {UUIDS[1]}\nnvidia.com/gpu")
    assert containers.read_cdi_names((str(tmp_path), str(tmp_path / "none"))) == {
        "0",
        UUIDS[0],
        "all",
    }


def test_the_container_of_a_job_whose_shim_died_is_removed_once_its_processes_are_gone(
    tmp_path: Path,
):
    box = Box(tmp_path / "home", config='[daemon]\ncancel_grace = "10s"\n')
    job_id = box.submit("--gpus", "1", "--container", "img", "--", "train")
    plain = box.submit("--gpus", "1", "--", "train")
    box.step()
    box.shims.leave_running(job_id, 101, ignores_term=True)
    box.shims.vanish(job_id)
    box.shims.vanish(plain)
    box.step(box.daemon.settings.gpu_poll_interval_s)  # SIGTERM to what it left
    assert box.show(job_id)["state"] == "running" and box.shims.container_removals == []
    box.shims.end_process(101)
    box.step(box.daemon.settings.gpu_poll_interval_s)
    assert box.states(job_id, plain) == ["lost", "lost"]
    (removal,) = box.shims.container_removals  # the plain job has none
    name = f"gpusched-{containers.home_token(box.paths.state_dir)}-{job_id}-1"
    assert removal["container_remove"]["argv"] == container.remove_argv("podman", name)
    assert removal["run_as"] is None and removal["env"]["PATH"]
