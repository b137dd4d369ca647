"""`gpusched demo`: an isolated daemon on 4 simulated GPUs, a small mix of jobs, then clean-up."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console

from gpusched.cli.views.lsview import ls_lines
from gpusched.cli.views.plainout import Screen
from gpusched.client.connection import Client, start_daemon, wait_for_exit
from gpusched.client.paths import resolve_paths

GIB = 2**30
# (name, gpus, GiB per GPU or None for whole GPUs, seconds): more than 4 GPUs can hold.
DEMO_JOBS = [
    ("train-2gpu", 2, None, 4),
    ("finetune", 1, None, 3),
    ("infer-a", 1, 30, 2),
    ("infer-b", 1, 30, 2),
    ("infer-c", 1, 30, 3),
    ("infer-d", 1, 30, 3),
    ("eval-cpu", 0, None, 1),
    ("train-4gpu", 4, None, 2),
]
_REFRESH_S = 1.0
_DEADLINE_S = 120.0


def _submit_all(client: Client, env: dict[str, str], cwd: str) -> list[int]:
    jobs = [
        {
            "command": ["sh", "-c", f"echo $CUDA_VISIBLE_DEVICES; sleep {secs}"],
            "name": name,
            "gpus": gpus,
            "gpu_mem_bytes": mem * GIB if mem else None,
            "priority": 0,
        }
        for name, gpus, mem, secs in DEMO_JOBS
    ]
    ids: list[int] = client.call("submit", jobs=jobs, env=env, cwd=cwd)["ids"]
    return ids


def _show(console: Console, client: Client, started: float) -> bool:
    """Print the queue and the GPUs once; True while jobs are left."""
    jobs = client.call("list", all=True)["jobs"]
    gpus = client.call("gpus")
    # Two requests, two moments: each GPU's jobs are taken from the listing above it, so
    # that a job that started in between is not pending in one table and on a GPU below.
    for gpu in gpus["gpus"]:
        gpu["jobs"] = [
            j["id"] for j in jobs if j["state"] == "running" and gpu["uuid"] in j["gpus"]
        ]
    console.print(f"\n-- t = {time.monotonic() - started:.0f} s --")
    screen = Screen(stream=console.file)
    screen.lines(ls_lines(jobs, screen.width))
    screen.blank()
    screen.gpus(gpus)
    return any(j["state"] in ("pending", "running") for j in jobs)


def _show_outputs(console: Console, client: Client) -> None:
    """What each job printed, its CUDA_VISIBLE_DEVICES (GPU UUIDs), as the GPUs it names."""
    index_of = {gpu["uuid"]: str(gpu["index"]) for gpu in client.call("gpus")["gpus"]}
    console.print(
        "\nWhat each job printed (`gpusched logs ID`): the GPUs its CUDA_VISIBLE_DEVICES named"
    )
    for job in client.call("list", all=True)["jobs"]:
        try:
            printed = Path(job["stdout_path"]).read_text(errors="replace").split()
        except OSError as exc:
            printed = [f"(no log: {exc.strerror})"]
        seen = ",".join(index_of.get(word, word) for word in ",".join(printed).split(",") if word)
        console.print(
            f"  job {job['id']} {job['name']:<11} GPU {seen}"
            if seen
            else f"  job {job['id']} {job['name']:<11} no GPU (empty)",
            markup=False,
            highlight=False,
        )


def run_demo(console: Console) -> int:
    home = tempfile.mkdtemp(prefix="gpusched-demo-")
    # A simulated box of 16 cores, so that a small machine's few cores (each job reserves
    # one) do not hide how the GPUs are shared.
    Path(home, "gpusched.toml").write_text("[host]\ncpus = 16\n")
    env = {**os.environ, "GPUSCHED_HOME": home, "GPUSCHED_SIMULATE": "4x80GiB"}
    env.pop("GPUSCHED_CONFIG", None)
    paths = resolve_paths(env)
    client = Client(paths, autostart=False)  # never start a daemon outside the demo's home
    ids: list[int] = []
    try:  # from here on the home is removed whatever happens, a closed stdout included
        console.print(f"Starting a gpusched daemon on 4 simulated 80 GiB GPUs in {home}")
        start_daemon(paths, environ=env)
        client.wait_until_up().close()
        ids = _submit_all(client, env, home)
        console.print(
            f"Submitted {len(ids)} jobs: whole-GPU, memory-sharing (30 GiB each), "
            "a CPU job, and a 4-GPU job that waits for every GPU."
        )
        started = time.monotonic()
        while _show(console, client, started):
            if time.monotonic() - started > _DEADLINE_S:
                console.print("[red]the demo jobs did not finish in time[/]")
                return 1
            time.sleep(_REFRESH_S)
        _show_outputs(console, client)
        console.print(
            "All jobs finished: each one saw only its GPUs (CUDA_VISIBLE_DEVICES), "
            "and memory-sharing jobs shared a GPU while whole-GPU jobs did not."
        )
        return 0
    finally:
        _clean_up(client, ids, Path(home))


def _clean_up(client: Client, ids: list[int], home: Path) -> None:
    try:
        if ids:
            client.call("cancel", ids=ids)
            client.call("wait", ids=ids, timeout_s=15.0)
        pid = client.call("status")["pid"]
        client.call("stop")
        wait_for_exit(pid, 30.0)
    except Exception:
        pass
    shutil.rmtree(home, ignore_errors=True)
