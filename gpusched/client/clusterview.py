"""A cluster job's place in Slurm, in words: what ls, show and top print beside it."""

from __future__ import annotations

from gpusched.core.units import duration_human

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the fast command path
    from typing import Any


def cluster_human(cluster: dict[str, Any], now: float) -> str:
    """`hpc 123 RUNNING on n7, as of 4s ago`; `STALE (why)` while Slurm does not answer:
    the state shown is then the last one Slurm gave, never a guess."""
    parts = [
        cluster["name"],
        cluster["slurm_job_id"] or "(not submitted yet)",
        cluster["slurm_state"],
    ]
    if cluster["node"]:
        parts.append(f"on {cluster['node']}")
    if cluster.get("gpu_ids"):
        parts.append(f"GPUs {','.join(map(str, cluster['gpu_ids']))}")
    text = " ".join(p for p in parts if p)
    if cluster["as_of"] is not None:
        text += f", as of {duration_human(max(0.0, now - cluster['as_of']))} ago"
    if cluster["stale"]:
        text += f", STALE ({cluster['stale']})"
    return text
