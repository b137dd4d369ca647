"""Human output of `daemon status`: the daemon's state, its GPUs, queue and fair share."""

from __future__ import annotations

from typing import Any

from gpusched.cli.views.lsview import host_line, write_problem_line
from gpusched.core.units import duration_human


def usage_line(usage: dict[str, float], half_life_s: float | None, shown: int = 5) -> str:
    """Fair share's count of GPU time per user, most first: "ada 2h10m, bob 4m05s"."""
    users = sorted(usage, key=lambda user: (-usage[user], user))
    listed = ", ".join(f"{user} {duration_human(usage[user])}" for user in users[:shown])
    if len(users) > shown:
        listed += f" and {len(users) - shown} more"
    return (
        f"GPU time used (fair share, halving every {duration_human(half_life_s)}): "
        f"{listed or 'none yet'}"
    )


def status_lines(status: dict[str, Any]) -> list[str]:
    gpus = f"{status['gpu_count']} GPU(s) via {status['backend']}"
    if status.get("gpu_problem"):
        gpus += f" ({status['gpu_problem']})"
    writes = write_problem_line(status.get("write_problem"))
    return [
        f"gpusched daemon {status['version']} running, pid {status['pid']}, "
        f"up {duration_human(status['uptime_s'])}",
        f"GPUs: {gpus}",
        f"jobs: {status['running']} running, {status['pending']} pending"
        + (" (draining)" if status.get("draining") else ""),
        *([f"writes: FAILING: {writes}"] if writes else []),
        f"scheduling: policy {status.get('policy')}, discipline {status.get('discipline')}",
        host_line(status["host"]),
        usage_line(status.get("fairshare_usage") or {}, status.get("fairshare_half_life_s")),
        f"host memory limits: {status.get('mem_enforcement')}",
        f"state: {status['state_dir']}",
        f"socket: {status['socket']}",
        f"metrics: {status.get('metrics', 'off')}",
        mps_line(status.get("mps") or {}),
    ] + damaged_lines(status.get("damaged_jobs") or [])


def mps_line(mps: dict[str, Any]) -> str:
    """memory.mps: off, not started yet, running (on which GPUs), or why it cannot run."""
    state = mps.get("state", "off")
    if state == "unavailable":
        return f"MPS: unavailable ({mps.get('problem')}); sharing jobs run without it"
    if state == "idle":
        return "MPS: on, control daemon not started yet (the first job that shares a GPU starts it)"
    if state == "running":
        gpus = ", ".join(map(str, mps.get("gpus") or ())) or "none yet"
        pid = f"pid {mps['pid']}, " if mps.get("pid") else ""
        return f"MPS: running ({pid}pipe {mps.get('pipe_dir')}); GPUs under MPS: {gpus}"
    return "MPS: off"


def damaged_lines(damaged: list[dict[str, Any]]) -> list[str]:
    """Quarantined rows: skipped, never run; what is wrong with each."""
    if not damaged:
        return []
    lines = [f"damaged jobs: {len(damaged)} skipped and never run (`gpusched doctor` tells more)"]
    return lines + [f"  job {d['id']}: {d['reason']}" for d in damaged]
