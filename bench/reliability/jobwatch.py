"""What really runs: a home's job processes by job id and GPU, sampled beside the store's
view, to find orphans (processes of a job recorded as ended) and double leases (two jobs
on one whole GPU)."""

from __future__ import annotations

import threading
import time

import psutil

from reliability.harness import Home

ENDED = ("succeeded", "failed", "cancelled", "timeout", "oom", "lost")


def job_processes(home: Home) -> dict[int, list[tuple[int, tuple[str, ...]]]]:
    """{job id: [(pid, GPUs from CUDA_VISIBLE_DEVICES)]} of this home's live job processes."""
    out: dict[int, list[tuple[int, tuple[str, ...]]]] = {}
    for proc in psutil.process_iter(["environ", "status"]):
        try:
            env = proc.info["environ"] or {}
        except psutil.Error:
            continue
        if (
            env.get("GPUSCHED_HOME") != str(home.path)
            or "GPUSCHED_JOB_ID" not in env
            or proc.info["status"] == psutil.STATUS_ZOMBIE
        ):
            continue
        gpus = tuple(g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g)
        out.setdefault(int(env["GPUSCHED_JOB_ID"]), []).append((proc.pid, gpus))
    return out


def holders(home: Home, jobs: list[dict]) -> dict[str, set[int]]:
    """{GPU: the jobs on it}: running in the store, or with live processes on it."""
    on_gpu: dict[str, set[int]] = {}
    for job in jobs:
        if job["state"] == "running":
            for gpu in job.get("gpus") or ():
                on_gpu.setdefault(gpu, set()).add(job["id"])
    for job_id, procs in job_processes(home).items():
        for _, gpus in procs:
            for gpu in gpus:
                on_gpu.setdefault(gpu, set()).add(job_id)
    return on_gpu


class LeaseWatch(threading.Thread):
    """Samples holders() until stopped; a GPU held by two jobs in two samples in a row
    (so not the instant between a job's end and its record) is a double lease."""

    def __init__(self, home: Home, interval_s: float = 0.3):
        super().__init__(daemon=True)
        self.home, self.interval_s = home, interval_s
        self.double: set[tuple[str, frozenset[int]]] = set()
        self._done = threading.Event()

    def run(self) -> None:
        seen_last: set[tuple[str, frozenset[int]]] = set()
        while not self._done.is_set():
            jobs = self.home.json("ls", "--all", "--json", timeout_s=10)
            if jobs is not None:
                now = {
                    (gpu, frozenset(ids))
                    for gpu, ids in holders(self.home, jobs).items()
                    if len(ids) > 1
                }
                self.double |= now & seen_last
                seen_last = now
            time.sleep(self.interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join()


def orphans(home: Home, jobs: list[dict], settle_s: float = 10.0) -> dict[int, list[int]]:
    """Job processes still alive settle_s after their job was recorded as ended (or of a
    job the store does not have)."""
    state = {job["id"]: job["state"] for job in jobs}
    deadline = time.monotonic() + settle_s
    while True:
        left = {
            job_id: [pid for pid, _ in procs]
            for job_id, procs in job_processes(home).items()
            if state.get(job_id) in (*ENDED, None)
        }
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
