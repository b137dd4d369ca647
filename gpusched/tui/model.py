"""What `gpusched top` shows and how its keys change the view: immutable snapshots, the
jobs and hosts in them, and the view state. Plain data, shared by the snapshot source,
the pure render and the Live loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

from gpusched import __version__
from gpusched.core.config import Settings
from gpusched.core.models import Inventory


def _frozen_map() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class HostInfo:
    hostname: str = ""
    cpu_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    load_avg: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class ProcHost:
    """The host side of a GPU process; None fields could not be read (N/A)."""

    cpu_pct: float | None = None
    rss_bytes: int | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class DaemonInfo:
    pid: int
    uptime_s: float
    version: str


class TopJob(NamedTuple):
    """The fields of a pending or running job that top shows (a tuple: 1,000 are built
    per frame, and a frozen dataclass takes several times as long to make)."""

    id: int
    name: str
    user: str
    uid: int
    state: str
    gpu_indices: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    gpus_requested: int = 0
    gpu_mem_bytes: int | None = None
    priority: int = 0
    command: tuple[str, ...] = ()
    submitted_at: float = 0.0
    started_at: float | None = None
    pending_reason: str = ""
    time_limit_s: float | None = None
    progress_pct: float | None = None  # the job's last gpusched.job.progress() report
    progress_message: str = ""
    cancelling: bool = False  # running, told to stop, not ended yet (it may ignore SIGTERM)
    # A cluster job: where Slurm has it (client/clusterview.py), as of the daemon's poll.
    cluster: Any = None
    preempting: bool = False  # running, being stopped to go back to the queue
    gpu_idle_since: float | None = None  # its GPUs all 0% busy past [idle] after, since
    gpu_mem_over: bool = False  # used more than its --gpu-mem on a shared GPU (gpu_over)
    array_id: int | None = None  # an array's element: shown as ARRAY_INDEX (51_0)
    array_index: int | None = None

    @classmethod
    def from_dict(cls, job: Mapping[str, Any]) -> TopJob:
        progress = job.get("progress") or {}
        fraction = progress.get("fraction")
        return cls(
            id=job["id"],
            name=job.get("name") or "",
            user=job.get("user") or "?",
            uid=job.get("uid", -1),
            state=job["state"],
            gpu_indices=tuple(job.get("gpu_indices") or ()),
            gpu_uuids=tuple(job.get("gpus") or ()),
            gpus_requested=job.get("gpus_requested", 0),
            gpu_mem_bytes=job.get("gpu_mem_bytes"),
            priority=job.get("priority", 0),
            command=tuple(job.get("command") or ()),
            submitted_at=job.get("submitted_at") or 0.0,
            started_at=job.get("started_at"),
            pending_reason=job.get("pending_reason") or "",
            time_limit_s=job.get("time_limit_s"),
            progress_pct=None if fraction is None else 100.0 * fraction,
            progress_message=progress.get("message") or "",
            cancelling=bool(job.get("cancelling")),
            cluster=job.get("cluster"),
            preempting=bool(job.get("preempting")),
            gpu_idle_since=job.get("gpu_idle_since"),
            gpu_mem_over=bool(job.get("gpu_mem_over_by")),
            array_id=job.get("array_id"),
            array_index=job.get("array_index"),
        )


@dataclass(frozen=True)
class Snapshot:
    """Everything one frame shows, read at one moment; render() needs nothing else."""

    now: float
    inventory: Inventory
    host: HostInfo = HostInfo()
    utc_offset_s: int = 0  # local time = now + offset, so frames never ask the host's zone
    version: str = __version__
    daemon: DaemonInfo | None = None
    banner: str = ""
    reserved_bytes: Mapping[str, int] = field(default_factory=_frozen_map)
    pid_jobs: Mapping[int, int] = field(default_factory=_frozen_map)
    jobs: tuple[TopJob, ...] = ()
    proc_host: Mapping[int, ProcHost] = field(default_factory=_frozen_map)
    # Inference services (docs/services.md): name, wanted, ready, req/s, p95 ms, in flight.
    services: tuple[tuple[str, int, int, float, float | None, int], ...] = ()
    # The pending jobs in the queue, everyone's and the viewer's: a long queue's snapshot
    # carries only the first ones. None: all of them are among `jobs` (an older daemon).
    pending_total: int | None = None
    pending_mine: int | None = None
    # GPU reservations not yet ended: (name, GPU indices, start, end), epoch s.
    gpu_reservations: tuple[tuple[str, tuple[int, ...], float, float], ...] = ()


@dataclass(frozen=True)
class ViewState:
    """What the keys change; my_uid/my_user decide what is dimmed and what `u` keeps."""

    my_uid: int = -1
    my_user: str = ""
    paused: bool = False
    only_mine: bool = False
    sort_index: int = 0
    show_help: bool = False
    # Load colours: below warn_pct green, below crit_pct yellow, else red.
    warn_pct: float = Settings.top_warn_pct
    crit_pct: float = Settings.top_crit_pct
    quit: bool = field(default=False, compare=False)


def apply_key(view: ViewState, key: str, sort_count: int) -> ViewState:
    """The view after one key press; unknown keys change nothing."""
    if key in ("q", "Q"):
        return replace(view, quit=True)
    if key == "p":
        return replace(view, paused=not view.paused)
    if key == "u":
        return replace(view, only_mine=not view.only_mine)
    if key == "s":
        return replace(view, sort_index=(view.sort_index + 1) % sort_count)
    if key in ("?", "h"):
        return replace(view, show_help=not view.show_help)
    if key == "\x1b" and view.show_help:  # Esc closes the help, as in most viewers
        return replace(view, show_help=False)
    return view
