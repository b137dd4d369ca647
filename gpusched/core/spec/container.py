"""A job's command run in a container (`submit --container IMAGE`): the runtime's argv, pure.

The daemon turns a container job's command into `podman run ... IMAGE COMMAND` (or
docker's) when it starts the job; the shim runs that like any command, so cancel, time
limits, --signal warnings, logs and exit statuses go the plain job's way:

- `--init` puts a small init (catatonit, docker-init) at PID 1: the job's own process is
  not PID 1, which the kernel shields from every signal it has no handler for, so a
  SIGTERM from a cancel ends it as it ends a plain job;
- `--sig-proxy=true` has the runtime's client pass each signal the shim forwards on to
  the container; the client then exits 128+N for a job ended by signal N, which
  signal_of_exit turns back into that signal;
- `--rm` and a name of the run's own (home token, job id, attempt) let the shim remove the
  container when the job has ended, even when the client was killed (remove_argv).
"""

from __future__ import annotations

import re

RUNTIMES = ("podman", "docker")
# How a job's GPUs reach its container: "cdi" names them by UUID in a CDI spec
# (`nvidia-ctk cdi generate`), "runtime" through the runtime's own GPU option (docker
# --gpus; podman: the NVIDIA hook reads NVIDIA_VISIBLE_DEVICES), "auto" the first when a
# CDI spec names every GPU of the job.
DEVICE_MODES = ("auto", "cdi", "runtime")
CDI_KIND = "nvidia.com/gpu"
# Signals a container's exit status can stand for (128+N): the runtimes report them so.
_MAX_SIGNAL = 64
# Docker and podman accept [a-zA-Z0-9][a-zA-Z0-9_.-]* as a container name.
_NAME_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def container_name(home_token: str, job_id: int, attempt: int) -> str:
    """The container of one attempt of one job of one gpusched home: unique on the
    machine (two homes may both have a job 1), and found again from the job alone."""
    name = f"gpusched-{home_token}-{job_id}-{attempt}"
    return "".join(c if c in _NAME_SAFE else "-" for c in name)


def cdi_gpu_names(spec_texts: list[str]) -> frozenset[str]:
    """The device names of kind nvidia.com/gpu in CDI spec files (YAML or JSON), read
    without a YAML parser: the names `nvidia-ctk cdi generate` writes (indices, UUIDs,
    "all") are plain words, each on a `name:` line of a spec whose kind is nvidia.com/gpu."""
    names: set[str] = set()
    for text in spec_texts:
        if CDI_KIND not in text:
            continue
        names.update(re.findall(r'"?name"?\s*:\s*"?([A-Za-z0-9][A-Za-z0-9_.:-]*)"?', text))
    return frozenset(names)


def device_args(
    runtime: str, devices: str, gpu_uuids: tuple[str, ...], cdi_names: frozenset[str]
) -> list[str]:
    """The options that give the container the job's GPUs, and only those."""
    if not gpu_uuids:
        return []  # NVIDIA_VISIBLE_DEVICES=none (the job's environment) for the hook
    use_cdi = devices == "cdi" or (devices == "auto" and set(gpu_uuids) <= cdi_names)
    if use_cdi:
        return [f"--device={CDI_KIND}={uuid}" for uuid in gpu_uuids]
    if runtime == "docker":
        # --gpus reads a CSV field: a list of devices must be quoted within the value.
        return ["--gpus", '"device=' + ",".join(gpu_uuids) + '"']
    return []  # podman without CDI: its NVIDIA hook reads NVIDIA_VISIBLE_DEVICES


def user_args(runtime: str, uid: int, gid: int) -> list[str]:
    """Run the job as its own user. Podman runs as that user (the shim drops to it in
    system mode), rootless unless it is root: keep-id maps the user to the same uid in
    the container, so files it writes in the working directory are the user's. Docker's
    daemon is root: --user names the uid and gid."""
    if uid == 0:
        return []
    if runtime == "docker":
        return [f"--user={uid}:{gid}"]
    return ["--userns=keep-id"]


def run_argv(
    runtime: str,
    image: str,
    options: tuple[str, ...],
    command: tuple[str, ...],
    *,
    name: str,
    cwd: str,
    uid: int,
    gid: int,
    env_names: list[str],
    gpu_uuids: tuple[str, ...] = (),
    devices: str = "auto",
    cdi_names: frozenset[str] = frozenset(),
    cpu_ids: tuple[int, ...] = (),
    mounts: tuple[str, ...] = (),
) -> list[str]:
    """`RUNTIME run ... IMAGE COMMAND` for one run of a job.

    mounts: directories the job also needs at the same path (where its progress file is).

    env_names: the variables passed in by name (the runtime takes each value from its own
    environment, the job's): the job-environment contract and the job's --env. The user's
    options come last before the image, so that they may override ours.
    """
    argv = [
        runtime,
        "run",
        "--rm",
        "--init",
        "--sig-proxy=true",
        f"--name={name}",
        # The host's network, as a plain job has: MASTER_PORT is held on the host.
        "--network=host",
        f"--volume={cwd}:{cwd}",
        f"--workdir={cwd}",
    ]
    argv += [f"--volume={path}:{path}" for path in mounts if path != cwd]
    argv += user_args(runtime, uid, gid)
    argv += device_args(runtime, devices, gpu_uuids, cdi_names)
    if cpu_ids:
        argv.append("--cpuset-cpus=" + ",".join(str(c) for c in cpu_ids))
    argv += [f"--env={name_}" for name_ in env_names]
    return argv + list(options) + [image, *command]


def visible_inside(cuda_visible_devices: str) -> str:
    """CUDA_VISIBLE_DEVICES as the container sees it. UUIDs stay; host indices do not,
    since the container has only the job's GPUs, numbered from 0 in the host's (PCI)
    order: host GPUs 5,2 are 1,0 inside."""
    ids = [i for i in cuda_visible_devices.split(",") if i]
    indices = sorted(int(i) for i in ids if i.isdigit())
    return ",".join(str(indices.index(int(i))) if i.isdigit() else i for i in ids)


def remove_argv(runtime: str, name: str) -> list[str]:
    """Stop (at once) and remove the run's container, if it is still there."""
    if runtime == "docker":
        return ["docker", "rm", "--force", name]
    return ["podman", "rm", "--force", "--ignore", "--time=0", name]


def signal_of_exit(exit_code: int | None) -> int | None:
    """The signal that ended a container's job, from its runtime's exit status (128+N)."""
    if exit_code is not None and 128 < exit_code <= 128 + _MAX_SIGNAL:
        return exit_code - 128
    return None
