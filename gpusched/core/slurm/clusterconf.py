"""The `[clusters.NAME]` tables of the config: Slurm clusters gpusched hands jobs to
(stdlib only; daemon/slurm/poll.py drives them, docs/slurm.md explains each key)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusched.core.errors import ConfigError
from gpusched.core.units import parse_duration, parse_size

BACKENDS = ("slurm",)
# `--cluster local` (or default_cluster = "local") runs a job on this machine.
LOCAL = "local"


@dataclass(frozen=True)
class ClusterConfig:
    """One `[clusters.NAME]` table."""

    name: str
    backend: str = "slurm"
    partition: str = ""
    account: str = ""
    qos: str = ""
    # Where the job wrapper writes its start and exit records and the logs go: a directory
    # that the daemon's host and every compute node see at the same path.
    shared_dir: str = ""
    # Working directories a job may have (compute nodes see them too); () = any.
    shared_roots: tuple[str, ...] = ()
    # GPU memory -> a Slurm GPU type (--gres=gpu:TYPE:N) or node feature (--constraint).
    gpu_types: tuple[tuple[str, int], ...] = ()
    gpu_features: tuple[tuple[str, int], ...] = ()
    default_mem_bytes: int = 0  # --mem for jobs that declare none (0: Slurm's default)
    slurm_conf: str = ""  # SLURM_CONF for the commands; "" = theirs
    bin_dir: str = ""  # where sbatch, squeue, scancel, sacct live; "" = PATH
    poll_min_s: float = 2.0
    poll_max_s: float = 60.0
    lost_grace_s: float = 120.0
    command_timeout_s: float = 30.0


# key -> (field, parse, doc): the keys of one [clusters.NAME] table.
def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value


def _texts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, str) and v.startswith("/") for v in value
    ):
        raise ValueError(f"{value!r} is not a list of absolute paths")
    return tuple(v.rstrip("/") or "/" for v in value)


def _mem_table(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict):
        raise ValueError(f'{value!r} is not a table of NAME = "GPU memory" (a100 = "40G")')
    return tuple(
        sorted(
            ((str(k), parse_size(v)) for k, v in value.items()), key=lambda item: (item[1], item[0])
        )
    )


def _seconds(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def _backend(value: Any) -> str:
    if not isinstance(value, str) or value not in BACKENDS:
        raise ValueError(f"{value!r} is not one of: {', '.join(BACKENDS)}")
    return value


KEYS = {
    "backend": ("backend", _backend, '"slurm" (the only one so far)'),
    "partition": ("partition", _text, 'Slurm partition (--partition); "" = the default'),
    "account": ("account", _text, "Slurm account (--account)"),
    "qos": ("qos", _text, "Slurm QOS (--qos)"),
    "shared_dir": (
        "shared_dir",
        _text,
        "directory seen by this host and the compute nodes: "
        "logs, start and exit records (required)",
    ),
    "shared_roots": (
        "shared_roots",
        _texts,
        "working directories jobs may have (the compute nodes mount them); [] = any",
    ),
    "gpu_types": (
        "gpu_types",
        _mem_table,
        "GPU type = its memory, for --gpu-mem (--gres=gpu:TYPE:N)",
    ),
    "gpu_features": (
        "gpu_features",
        _mem_table,
        "node feature = its GPUs' memory, for --gpu-mem (--constraint)",
    ),
    "default_mem": ("default_mem_bytes", parse_size, "--mem of jobs that give none"),
    "slurm_conf": ("slurm_conf", _text, "SLURM_CONF for the Slurm commands"),
    "bin_dir": ("bin_dir", _text, "directory of sbatch, squeue, scancel, sacct"),
    "poll_min": ("poll_min_s", _seconds, "first poll interval, doubled while nothing changes"),
    "poll_max": ("poll_max_s", _seconds, "longest poll interval"),
    "lost_grace": (
        "lost_grace_s",
        _seconds,
        "how long a job may be missing from Slurm before it is lost",
    ),
    "command_timeout": ("command_timeout_s", _seconds, "longest wait for one Slurm command"),
}
_EXAMPLE = {
    "backend": '"slurm"',
    "partition": '"gpu"',
    "account": '""',
    "qos": '""',
    "shared_dir": '"/shared/gpusched"',
    "shared_roots": '["/home", "/shared"]',
    "gpu_types": '{ a100 = "40G", h100 = "80G" }',
    "gpu_features": "{}",
    "default_mem": '"4G"',
    "slurm_conf": '""',
    "bin_dir": '""',
    "poll_min": '"2s"',
    "poll_max": '"60s"',
    "lost_grace": '"2m"',
    "command_timeout": '"30s"',
}


def parse_clusters(value: Any, source: str) -> tuple[ClusterConfig, ...]:
    """The `clusters` table: one table per cluster, each problem naming its key."""
    if not isinstance(value, dict) or not all(isinstance(t, dict) for t in value.values()):
        raise ConfigError(f"{source}: 'clusters' must hold one table per cluster, [clusters.NAME]")
    return tuple(_cluster(name, table, source) for name, table in value.items())


def _cluster(name: str, table: dict[str, Any], source: str) -> ClusterConfig:
    if name == LOCAL:
        raise ConfigError(
            f"{source}: [clusters.{LOCAL}] is reserved for this machine; name the cluster otherwise"
        )
    changes: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            raise ConfigError(
                f"{source}: unknown key 'clusters.{name}.{key}'. Known keys: {', '.join(KEYS)}"
            )
        field, parse, _ = KEYS[key]
        try:
            changes[field] = parse(value)
        except ValueError as exc:
            raise ConfigError(f"{source}: bad value for 'clusters.{name}.{key}': {exc}") from None
    if not changes.get("shared_dir", "").startswith("/"):
        raise ConfigError(
            f"{source}: [clusters.{name}] needs shared_dir, an absolute path "
            "that this host and the compute nodes both see"
        )
    return ClusterConfig(name=name, **changes)


def refuse_in_system_mode(clusters: tuple[ClusterConfig, ...], source: str) -> None:
    """A system daemon hands no job to a cluster: sbatch runs as the daemon's own user, so
    every user's cluster job would run as root. Its start is refused, naming the table."""
    if clusters:
        raise ConfigError(
            f"{source}: [clusters.{clusters[0].name}] is not for a system "
            "daemon: it would hand every user's job to Slurm as the daemon's "
            "user, not as its submitter. Remove the [clusters.*] tables and "
            "default_cluster from the system config; users hand jobs to a "
            "cluster from a user daemon of their own (docs/slurm.md)."
        )


def check_default(default: Any, clusters: tuple[ClusterConfig, ...], source: str) -> str:
    """default_cluster, which must name a [clusters.NAME] table (or "local")."""
    names = [c.name for c in clusters]
    if default not in ("", LOCAL, *names):
        raise ConfigError(
            f"{source}: default_cluster {default!r} is not a cluster; "
            f"valid: {', '.join([LOCAL, *names])}"
        )
    return "" if default == LOCAL else default


def example() -> list[str]:
    """A commented [clusters.NAME] table for the example config (none by default)."""
    lines = [
        "",
        "# Slurm clusters to hand jobs to with `submit --cluster NAME` (none by default);",
        "# docs/slurm.md explains each key. A user daemon's only: a system daemon refuses them",
        "# (its sbatch would run every user's job as root).",
        '# default_cluster = ""  # top level: submit there unless --cluster local',
        "# [clusters.hpc]",
    ]
    for key, (_, _, doc) in KEYS.items():
        lines += [f"# {key} = {_EXAMPLE[key]}  # {doc}"]
    return lines
