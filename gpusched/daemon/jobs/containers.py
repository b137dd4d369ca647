"""A container job's launch: its command wrapped in the runtime's `run`, and how its shim
removes the container (core/spec/container.py builds both; this module reads what they need:
the CDI specs on the machine, the user's group, the home's token)."""

from __future__ import annotations

import glob
import hashlib
import os
from typing import Any

from gpusched.client.paths import Paths
from gpusched.core.config import Settings
from gpusched.core.models import Job
from gpusched.core.spec import container
from gpusched.proc import jobenv, privileges

# Where CDI specs live (the CDI specification's static and dynamic directories).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_CDI_MAX_BYTES = 4 * 1024 * 1024
# podman may refuse to remove a container whose monitor it has just lost: retry it.
_REMOVE_TRIES = {"podman": 8, "docker": 1}  # docker fails for a container already gone


def read_cdi_names(dirs: tuple[str, ...] = CDI_DIRS) -> frozenset[str]:
    """The nvidia.com/gpu device names in the machine's CDI specs (none: no spec)."""
    texts = []
    for directory in dirs:
        for path in sorted(glob.glob(os.path.join(directory, "*"))):
            if not path.endswith((".yaml", ".yml", ".json")):
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as spec:
                    texts.append(spec.read(_CDI_MAX_BYTES))
            except OSError:
                continue  # unreadable: as if it were not there
    return container.cdi_gpu_names(texts)


def home_token(state_dir: str) -> str:
    """Short and stable for one gpusched home: two homes' job 1 get different containers."""
    return hashlib.sha256(state_dir.encode()).hexdigest()[:8]


def _gid_of(uid: int) -> int:
    try:
        return privileges.identity_of(uid).gid
    except privileges.PrivilegeError:  # a uid without a passwd entry: its own number
        return uid


def _progress_dir(env: dict[str, str]) -> tuple[str, ...]:
    """Where gpusched.job.progress() writes: beside the job's logs, the user's own files."""
    path = env.get(jobenv.PROGRESS_FILE)
    return (os.path.dirname(path),) if path else ()


def removal_of(job: Job, runtime: str, state_dir: str) -> dict[str, Any]:
    """How the run's container is removed (by proc/containerrun.py): its name, the
    runtime's argv, how many tries."""
    name = container.container_name(home_token(state_dir), job.id, job.attempt)
    return {
        "argv": container.remove_argv(runtime, name),
        "name": name,
        "tries": _REMOVE_TRIES[runtime],
    }


def lost_removal(job: Job, settings: Settings, paths: Paths) -> dict[str, Any]:
    """What removes the container of a job whose shim died (which would have removed
    it): as the job's user, in the environment it was submitted with."""
    removal = removal_of(job, settings.container_runtime, paths.state_dir)
    return {
        "container_remove": removal,
        "env": dict(job.env),
        "run_as": job.uid if paths.is_system else None,
    }


def in_container(
    spec: dict[str, Any],
    job: Job,
    runtime: str,
    devices: str,
    state_dir: str,
    cdi_dirs: tuple[str, ...] = CDI_DIRS,
) -> dict[str, Any]:
    """A plain job's shim spec turned into the container job's: its command run by the
    runtime, and the removal its shim runs when the job has ended."""
    image, options = job.container[0], job.container[1:]
    removal = removal_of(job, runtime, state_dir)
    name = removal["name"]
    env_names = [var for var in jobenv.VARIABLES if var in spec["env"]]
    argv = container.run_argv(
        runtime,
        image,
        options,
        job.command,
        name=name,
        cwd=job.cwd,
        uid=job.uid,
        gid=_gid_of(job.uid),
        env_names=env_names,
        gpu_uuids=job.gpu_uuids,
        devices=devices,
        cdi_names=read_cdi_names(cdi_dirs) if job.gpu_uuids else frozenset(),
        cpu_ids=job.cpu_ids,
        mounts=_progress_dir(spec["env"]),
    )
    env, visible = dict(spec["env"]), jobenv.CUDA_VISIBLE_DEVICES
    if visible in env:  # visible_devices = "index": the job's GPUs are numbered anew inside
        env[visible] = container.visible_inside(env[visible])
    return {**spec, "command": argv, "env": env, "container_remove": removal}
