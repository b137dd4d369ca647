"""Settings: defaults in code, an optional TOML file on top, then the environment."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields, replace
from difflib import get_close_matches
from pathlib import Path
from types import ModuleType
from typing import Any

from gpusched.core.configkeys import KEYS
from gpusched.core.errors import ConfigError
from gpusched.core.notifyconf import NotifyRule, parse_rules
from gpusched.core.notifyconf import example as notify_example
from gpusched.core.quotaconf import OLD_KEYS, parse_quotas
from gpusched.core.quotaconf import example as quotas_example
from gpusched.core.sched.placement import PlacementRules
from gpusched.core.sched.queuerules import QueueRules
from gpusched.core.sched.quotas import Quotas
from gpusched.core.slurm.clusterconf import ClusterConfig, check_default, parse_clusters
from gpusched.core.slurm.clusterconf import example as clusters_example
from gpusched.core.spec import limits

# Placement's own defaults, which the [gpus] and [scheduling] settings start from:
# policies.placement_rules turns the settings back into PlacementRules.
_PLACEMENT = PlacementRules()


@dataclass(frozen=True)
class Settings:
    # [daemon]
    gpu_poll_interval_s: float = 2.0
    cancel_grace_s: float = 10.0
    mode: str = "user"
    max_connections_per_uid: int = 32
    # [gpus]
    simulate: str = ""
    visible_devices: str = "uuid"
    max_util_pct: float = _PLACEMENT.max_util_pct
    mem_headroom_bytes: int = _PLACEMENT.mem_headroom_bytes
    exclusive_idle_mem_bytes: int = _PLACEMENT.exclusive_idle_mem_bytes
    outside: str = _PLACEMENT.outside
    outside_ignore_below_bytes: int = _PLACEMENT.outside_ignore_below_bytes
    outside_idle_after_s: float | None = _PLACEMENT.outside_idle_after_s
    # [scheduling]
    policy: str = _PLACEMENT.policy
    discipline: str = QueueRules.discipline
    gpu_weights: tuple[float, ...] = ()  # PlacementRules.gpu_weights by GPU index
    gpu_order: tuple[int, ...] = _PLACEMENT.gpu_order
    fairshare_half_life_s: float = 7 * 86400.0
    user_weights: tuple[tuple[str, float], ...] = ()
    las_thresholds_gpu_s: tuple[float, ...] = QueueRules.las_thresholds_gpu_s
    las_starvation_factor: float = QueueRules.las_starvation_factor
    las_starvation_floor_s: float = QueueRules.las_starvation_floor_s
    las_preempt_smaller_after_s: float = QueueRules.las_preempt_smaller_after_s
    las_max_preemptions: int = 0  # PreemptionRules.las_max_preemptions
    max_user_priority: int = 0  # higher only for admins (daemon/requests/request.py)
    # [host]
    host_cpus: int = 0
    reserve_cpus: int = 0
    reserve_mem_bytes: int = 0
    cpu_binding: bool = False
    enforce_mem: bool = False
    mem_margin_pct: float = 10.0
    # [top]
    top_warn_pct: float = 50.0
    top_crit_pct: float = 80.0
    # [attach]
    attach_detach_keys: str = "ctrl-]"
    # [jobs]
    master_port_min: int = 29500
    master_port_max: int = 29999
    max_running: int = 0
    job_env: tuple[tuple[str, str], ...] = ()
    keep_finished_s: float | None = 30 * 86400.0  # None: kept however old
    keep_finished_count: int = 100_000  # 0: however many
    max_log_size_bytes: int = 0  # 0: logs grow without a cap
    # [system]
    service_user: str = ""
    user_notify_timeout_s: float = 30.0
    admin_group: str = ""
    show_commands: str = "own"
    # [limits] (core/spec/limits.py: what each bounds, and the defaults)
    limit_command_bytes: int = limits.DEFAULT.command_bytes
    limit_cwd_bytes: int = limits.DEFAULT.cwd_bytes
    limit_env_bytes: int = limits.DEFAULT.env_bytes
    limit_name_bytes: int = limits.DEFAULT.name_bytes
    limit_jobs: int = limits.DEFAULT.jobs
    limit_json_depth: int = limits.DEFAULT.json_depth
    limit_queued_jobs: int = limits.DEFAULT.queued_jobs
    limit_queued_bytes: int = limits.DEFAULT.queued_bytes
    # [metrics]
    metrics_listen: str = ""
    metrics_max_job_series: int = 64
    # [preemption] (core/sched/preemption.py)
    preemption_enabled: bool = True
    default_preemptible: bool = False
    preemptible_users: tuple[tuple[str, bool], ...] = ()
    preempt_grace_s: float = 60.0
    preempt_signal: str = "USR1"
    max_preemptions: int = 3
    min_run_before_preempt_s: float = 300.0
    # [reservations] (core/sched/reservations.py)
    reservation_user_max_gpu_hours: float = 0.0
    # [services]
    haproxy: str = "haproxy"
    # [containers] (core/spec/container.py)
    container_runtime: str = "podman"
    container_devices: str = "auto"
    # [quotas.*] (core/quotaconf.py), with the old scheduling.max_*_per_user keys
    quotas: Quotas = field(default_factory=Quotas)
    # [[notify]] (core/notifyconf.py): an array of tables, not keys of one table
    notify: tuple[NotifyRule, ...] = ()
    # [clusters.NAME] and the top-level default_cluster (core/slurm/clusterconf.py)
    clusters: tuple[ClusterConfig, ...] = ()
    default_cluster: str = ""
    # [memory] (--gpu-mem auto, core/sched/memestimate.py)
    estimate_margin_pct: float = 10.0
    estimate_runs: int = 50
    # [memory] NVIDIA MPS for jobs that share a GPU (proc/mps.py)
    mps: bool = False
    mps_control: str = "nvidia-cuda-mps-control"
    mps_thread_pct: int = 100
    # [memory] GPU memory promises (core/sched/gpupromise.py, daemon/jobs/gpuover.py)
    gpu_over: str = "report"
    gpu_over_margin_pct: float = 10.0
    gpu_free_floor_bytes: int = 2**30
    others_peak_window_s: float = 300.0
    # [idle] (daemon/jobs/idlegpus.py)
    idle_after_s: float | None = None  # None: off
    idle_action: str = "warn"
    idle_all_jobs: bool = False
    # [mcp] (gpusched/mcp/)
    mcp_allow_mutations: bool = True


def _toml() -> ModuleType:
    """tomllib, imported only when a config file exists: `submit` should not pay for it."""
    if sys.version_info >= (3, 11):
        import tomllib  # noqa: PLC0415 - 9 ms of each daemon start without a config file
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib  # noqa: PLC0415 - as tomllib above
    toml: ModuleType = tomllib  # typed here: tomli, which mypy's Python 3.10 sees, has no stubs
    return toml


def _near_key(section: str, key: str) -> str | None:
    """The key a typo most likely meant: one near it in its own section (`host.cpu`), the
    same key in another section, or a near one in any section."""
    own = [k.split(".")[1] for k in KEYS if k.startswith(f"{section}.")]
    near = get_close_matches(key, own, n=1)
    if near:
        return f"{section}.{near[0]}"
    by_name = {k.split(".")[1]: k for k in KEYS}
    near = get_close_matches(key, by_name, n=1, cutoff=0.8)
    return by_name[near[0]] if near else None


def _unknown_key(section: str, key: str | None, source: str) -> ConfigError:
    """An unknown section or key (key None: a bare `key = value` outside any section),
    with the near one when a typo explains it (`host.cpu`, `[hots]`, a key in the wrong
    section); the valid keys only when nothing is near."""
    sections = list(dict.fromkeys(dotted.split(".")[0] for dotted in KEYS))
    if key is None:  # `cpus = 4` before any [section]
        near = _near_key("", section)
        if near:
            owner, name = near.split(".")
            return ConfigError(
                f"'{section}' in {source} is outside any section; did you mean "
                f"{name} under [{owner}]?"
            )
        what = f"'{section}' in {source} is not a known key"
    elif section not in sections and (close := get_close_matches(section, sections, n=1)):
        return ConfigError(f"unknown section [{section}] in {source}; did you mean [{close[0]}]?")
    elif near_key := _near_key(section, key):
        return ConfigError(f"unknown key '{section}.{key}' in {source}; did you mean '{near_key}'?")
    else:
        what = f"unknown key '{section}.{key}' in {source}"
    return ConfigError(f"{what}. Known keys: {', '.join(KEYS)}")


def settings_from_mapping(data: dict[str, Any], source: str) -> Settings:
    """Apply a parsed TOML document to the defaults; unknown keys and bad values name the key."""
    changes: dict[str, Any] = {}
    old_quotas: dict[str, Any] = {}
    for section, table in data.items():
        if section == "quotas":
            continue  # read below, with the old keys
        if section == "notify":
            changes["notify"] = parse_rules(table, source)
            continue
        if section in ("clusters", "default_cluster"):
            changes[section] = table  # checked below, together
            continue
        if not isinstance(table, dict):
            raise _unknown_key(section, None, source)
        for key, value in table.items():
            dotted = f"{section}.{key}"
            if dotted in OLD_KEYS:
                old_quotas[dotted] = value
                continue
            if dotted not in KEYS:
                raise _unknown_key(section, key, source)
            field_name, parse, _, _ = KEYS[dotted]
            try:
                changes[field_name] = parse(value)
            except ValueError as exc:
                raise ConfigError(f"{source}: bad value for '{dotted}': {exc}") from None
    if "quotas" in data or old_quotas:
        changes["quotas"] = parse_quotas(data.get("quotas"), old_quotas, source)
    if "clusters" in changes:
        changes["clusters"] = parse_clusters(changes["clusters"], source)
    if "default_cluster" in changes:
        changes["default_cluster"] = check_default(
            changes["default_cluster"], changes.get("clusters", ()), source
        )
    settings = replace(Settings(), **changes)
    if settings.top_warn_pct >= settings.top_crit_pct:
        raise ConfigError(f"{source}: 'top.warn_pct' must be below 'top.crit_pct'")
    if settings.master_port_min > settings.master_port_max:
        raise ConfigError(f"{source}: 'jobs.master_port_min' is above 'jobs.master_port_max'")
    return settings


def read_config(config_path: Path) -> dict[str, Any]:
    """A config file's TOML document, unchecked."""
    try:
        data: dict[str, Any] = _toml().loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read config {config_path}: {exc}. Fix its permissions or move it away."
        ) from None
    except _toml().TOMLDecodeError as exc:
        raise ConfigError(f"config {config_path} is not valid TOML: {exc}") from None
    return data


def load_settings(config_path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    """Defaults, then the TOML file if it exists, then GPUSCHED_SIMULATE from the environment."""
    env = os.environ if environ is None else environ
    config_path = Path(config_path)
    settings = Settings()
    if config_path.exists():
        settings = settings_from_mapping(read_config(config_path), str(config_path))
    if env.get("GPUSCHED_SIMULATE"):
        settings = replace(settings, simulate=env["GPUSCHED_SIMULATE"])
    return settings


def example_toml() -> str:
    """The example config: every key with its default, grouped by section."""
    lines = ["# gpusched configuration. Every key is optional; shown with its default."]
    section = None
    for dotted, (_, _, default, doc) in KEYS.items():
        name, key = dotted.split(".")
        if name != section:
            lines += ["", f"[{name}]"]
            section = name
        value = (
            f'"{default}"'
            if isinstance(default, str)
            else str(default).lower()
            if isinstance(default, bool)
            else str(default)
        )
        lines += [f"# {doc}", f"{key} = {value}"]
    lines += quotas_example()
    lines += notify_example()
    lines += clusters_example()
    return "\n".join(lines) + "\n"


assert {f.name for f in fields(Settings)} == {v[0] for v in KEYS.values()} | {
    "notify",
    "quotas",
    "clusters",
    "default_cluster",
}
