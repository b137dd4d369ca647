"""Settings: defaults in code, an optional TOML file on top, then the environment."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

from gpusched.core import container, limits
from gpusched.core.errors import ConfigError
from gpusched.core.models import DISCIPLINES
from gpusched.core.clusterconf import ClusterConfig, check_default, parse_clusters
from gpusched.core.clusterconf import example as clusters_example
from gpusched.core.notifyconf import NotifyRule, parse_rules
from gpusched.core.notifyconf import example as notify_example
from gpusched.core.placement import BUILTIN_POLICIES, PlacementRules
from gpusched.core.scheduling import QueueRules
from gpusched.core.syntax import WARN_SIGNAL_NAMES
from gpusched.core.units import parse_duration, parse_size

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
    max_gpus_per_user: int = 0
    max_running_per_user: int = 0
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
    admin_group: str = ""
    show_commands: str = "own"
    # [limits] (core/limits.py: what each bounds, and the defaults)
    limit_command_bytes: int = limits.DEFAULT.command_bytes
    limit_cwd_bytes: int = limits.DEFAULT.cwd_bytes
    limit_env_bytes: int = limits.DEFAULT.env_bytes
    limit_name_bytes: int = limits.DEFAULT.name_bytes
    limit_jobs: int = limits.DEFAULT.jobs
    limit_json_depth: int = limits.DEFAULT.json_depth
    # [metrics]
    metrics_listen: str = ""
    metrics_max_job_series: int = 64
    # [preemption] (core/preemption.py)
    preemption_enabled: bool = True
    default_preemptible: bool = False
    preemptible_users: tuple[tuple[str, bool], ...] = ()
    preempt_grace_s: float = 60.0
    preempt_signal: str = "USR1"
    max_preemptions: int = 3
    min_run_before_preempt_s: float = 300.0
    # [services]
    haproxy: str = "haproxy"
    # [containers] (core/container.py)
    container_runtime: str = "podman"
    container_devices: str = "auto"
    # [[notify]] (core/notifyconf.py): an array of tables, not keys of one table
    notify: tuple[NotifyRule, ...] = ()
    # [clusters.NAME] and the top-level default_cluster (core/clusterconf.py)
    clusters: tuple[ClusterConfig, ...] = ()
    default_cluster: str = ""
    # [memory] (--gpu-mem auto, core/memestimate.py)
    estimate_margin_pct: float = 10.0
    estimate_runs: int = 50
    # [idle] (daemon/idlegpus.py)
    idle_after_s: float | None = None  # None: off
    idle_action: str = "warn"
    idle_all_jobs: bool = False


def _toml():
    """tomllib, imported only when a config file exists: `submit` should not pay for it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    return tomllib


def _choice(*valid: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in valid:
            raise ValueError(f"{value!r} is not one of: {', '.join(valid)}")
        return value
    return parse


def _number(low: float, high: float, kind: type = float) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{value!r} is not a number")
        if kind is int and not isinstance(value, int):
            raise ValueError(f"{value!r} is not a whole number")
        if not low <= value <= high:
            raise ValueError(f"{value} is outside {low:g}..{high:g}")
        return kind(value)
    return parse


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value


def _optional_duration(value: Any) -> float | None:
    return None if value in ("", None) else parse_duration(value)


def _optional_size(value: Any) -> int:
    return 0 if value in ("", None) else _size_up_to(2**62)(value)


def _list_of(kind: type, low: float) -> Callable[[Any], tuple]:
    def parse(value: Any) -> tuple:
        if not isinstance(value, list):
            raise ValueError(f"{value!r} is not a list")
        return tuple(_number(low, 1e9, kind)(v) for v in value)
    return parse


def _env_table(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{value!r} is not a table of NAME = \"value\" strings")
    return tuple(sorted(value.items()))


def _user_weights(value: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"{value!r} is not a table of user = weight")
    return tuple((str(user), _number(0.001, 1e6)(w)) for user, w in sorted(value.items()))


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


def _user_flags(value: Any) -> tuple[tuple[str, bool], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"{value!r} is not a table of user = true or false")
    return tuple((str(user), _bool(flag)) for user, flag in sorted(value.items()))


def parse_listen(value: str) -> tuple[str, int]:
    """"HOST:PORT" (an IPv6 host in brackets: "[::1]:19400") as (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r} is not HOST:PORT with a port in 0..65535 (0: any free one), "
                         "e.g. \"127.0.0.1:19400\"")
    return host.strip("[]"), int(port)


def _listen(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):  # a bare port
        raise ValueError(f"{value!r} is not a string; write \"127.0.0.1:{value}\"")
    if _text(value):
        parse_listen(value)
    return value


IDLE_ACTIONS = ("warn", "requeue", "cancel")  # [idle] action (daemon/idlegpus.py)


def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


# TOML key -> (Settings field, parser, default as written in TOML, what it does). One
# table drives loading, the example file and the test that keeps the two in step.
KEYS: dict[str, tuple[str, Callable[[Any], Any], Any, str]] = {
    "daemon.gpu_poll_interval": ("gpu_poll_interval_s", _positive_duration, "2s",
                                 "How often the daemon reads the GPUs (jobs still start at once)."),
    "daemon.cancel_grace": ("cancel_grace_s", parse_duration, "10s",
                            "Between SIGTERM and SIGKILL when a running job is cancelled."),
    "daemon.mode": ("mode", _choice("user", "system"), "user",
                    '"system": one root daemon for all users (read from /etc/gpusched/gpusched.toml).'),
    "daemon.max_connections_per_uid": ("max_connections_per_uid", _number(0, 10**6, int), 32,
                                       "Open connections one user may hold (0: no limit; root and "
                                       "the daemon's own user are exempt)."),
    "gpus.simulate": ("simulate", _text, "",
                      'Simulated GPUs instead of NVML, e.g. "4x80GiB" or '
                      '"2xH100-80GiB,2xA100-40GiB" (env GPUSCHED_SIMULATE wins).'),
    "gpus.visible_devices": ("visible_devices", _choice("uuid", "index"), "uuid",
                             'CUDA_VISIBLE_DEVICES as GPU UUIDs ("uuid") or indices ("index").'),
    "gpus.max_util_pct": ("max_util_pct", _number(0, 100), 90,
                          "A GPU this busy (percent) takes no new jobs."),
    "gpus.mem_headroom": ("mem_headroom_bytes", parse_size, "512MiB",
                          "Free memory kept on a GPU beyond what a sharing job asks for."),
    "gpus.exclusive_idle_mem": ("exclusive_idle_mem_bytes", parse_size, "1GiB",
                                "A whole-GPU job needs a GPU whose other users hold at most this."),
    "gpus.outside": ("outside", _choice("count", "block"), "count",
                     'Processes gpusched did not start: "count" their memory, or "block" the GPU.'),
    "gpus.outside_ignore_below": ("outside_ignore_below_bytes", parse_size, "0MiB",
                                  "Ignore outside processes holding less than this."),
    "gpus.outside_idle_after": ("outside_idle_after_s", _optional_duration, "",
                                'Ignore an outside process idle (0% busy) this long, e.g. "2h"; '
                                '"" never.'),
    "scheduling.policy": ("policy", _text, "pack",
                          f"{', '.join(BUILTIN_POLICIES)}, or a policy from the "
                          "gpusched.policies entry points."),
    "scheduling.discipline": ("discipline", _choice(*DISCIPLINES), "fifo",
                              f"Queue order: {', '.join(DISCIPLINES)} (fifo skips ahead)."),
    "scheduling.gpu_weights": ("gpu_weights", _list_of(float, 0.001), [],
                               "weighted-round-robin: a weight per GPU index, e.g. [2, 1, 1, 1]."),
    "scheduling.gpu_order": ("gpu_order", _list_of(int, 0), [],
                             "order: GPU indices in the order to fill them, e.g. [3, 2, 1, 0]."),
    "scheduling.fairshare_half_life": ("fairshare_half_life_s", _positive_duration, "7d",
                                       "fairshare: past usage counts half after this long."),
    "scheduling.user_weights": ("user_weights", _user_weights, {},
                                "fairshare: shares per user, e.g. { alice = 2 } (default 1)."),
    "scheduling.max_gpus_per_user": ("max_gpus_per_user", _number(0, 10**6, int), 0,
                                     "At most this many GPUs held by one user's jobs (0: no limit)."),
    "scheduling.max_running_per_user": ("max_running_per_user", _number(0, 10**6, int), 0,
                                        "At most this many running jobs per user (0: no limit)."),
    "host.cpus": ("host_cpus", _number(0, 100_000, int), 0,
                  "Cores jobs may use; 0 = those in the daemon's CPU affinity."),
    "host.reserve_cpus": ("reserve_cpus", _number(0, 100_000, int), 0,
                          "Cores kept for the system (the lowest-numbered ones)."),
    "host.reserve_mem": ("reserve_mem_bytes", parse_size, "0MiB",
                         "Host memory kept for the system."),
    "host.cpu_binding": ("cpu_binding", _bool, False,
                         "Pin each job to its own cores with CPU affinity (those nearest "
                         "its GPUs first)."),
    "host.enforce_mem": ("enforce_mem", _bool, False,
                         "Stop a job (state oom) that uses more host memory than --mem + margin."),
    "host.mem_margin_pct": ("mem_margin_pct", _number(0, 1000), 10,
                            "How far past its --mem a job may go before it is reported (percent)."),
    "top.warn_pct": ("top_warn_pct", _number(0, 100), 50,
                     "`gpusched top` colours a load from this percent yellow..."),
    "top.crit_pct": ("top_crit_pct", _number(0, 100), 80, "...and from this percent red."),
    "jobs.max_running": ("max_running", _number(0, 10**6, int), 0,
                         "At most this many jobs run at once, like `tsp -S` (0: no limit)."),
    "jobs.env": ("job_env", _env_table, {},
                 'Variables every job gets unless its own environment sets them, e.g. '
                 '{ TF_FORCE_GPU_ALLOW_GROWTH = "true" }.'),
    "jobs.keep_finished": ("keep_finished_s", _optional_duration, "30d",
                           "Finished jobs that ended longer ago than this are removed, with "
                           "their files; their usage stays in a summary (\"\": keep them)."),
    "jobs.keep_finished_count": ("keep_finished_count", _number(0, 10**9, int), 100000,
                                 "At most this many finished jobs are kept, the newest (0: "
                                 "no limit)."),
    "jobs.max_log_size": ("max_log_size_bytes", _optional_size, "",
                          "A job's log beyond this size loses its oldest part, and says so "
                          "(\"\": no cap), e.g. \"100M\"."),
    "jobs.master_port_min": ("master_port_min", _number(1024, 65535, int), 29500,
                             "Lowest MASTER_PORT given to a job (torchrun's default is 29500)."),
    "jobs.master_port_max": ("master_port_max", _number(1024, 65535, int), 29999,
                             "Highest MASTER_PORT given to a job."),
    "system.service_user": ("service_user", _text, "",
                            "System mode: a non-root user the daemon runs as, trusted by clients "
                            "besides root."),
    "system.admin_group": ("admin_group", _text, "",
                           "System mode: members of this group may cancel, hold, update and "
                           "inspect anyone's jobs."),
    "system.show_commands": ("show_commands", _choice("own", "all"), "own",
                             'Whose command lines `ls`, `show` and `top` show: "own" (the '
                             'owner\'s and to admins) or "all".'),
    "metrics.listen": ("metrics_listen", _listen, "",
                       'Serve Prometheus metrics at http://HOST:PORT/metrics, e.g. '
                       '"127.0.0.1:19400" (docs/monitoring.md); "" off.'),
    "metrics.max_job_series": ("metrics_max_job_series", _number(0, 100_000, int), 64,
                               "Running jobs given per-job series; the rest are counted in "
                               "gpusched_metrics_job_series_dropped."),
    "memory.estimate_margin_pct": ("estimate_margin_pct", _number(0, 1000), 10,
                                   "--gpu-mem auto adds this much (percent) to the p95 of "
                                   "earlier runs' GPU memory peaks."),
    "memory.estimate_runs": ("estimate_runs", _number(1, 10_000, int), 50,
                             "--gpu-mem auto reads this many of the newest successful runs."),
    "idle.after": ("idle_after_s", _optional_duration, "",
                   'A running job whose GPUs all stayed at 0% busy this long is flagged idle, '
                   'e.g. "30m"; "" off.'),
    "idle.action": ("idle_action", _choice(*IDLE_ACTIONS), "warn",
                    '"warn" (flag it, a line in its log), "requeue" or "cancel" an idle job '
                    '(preemptible ones only, unless all_jobs; never --interactive ones).'),
    "idle.all_jobs": ("idle_all_jobs", _bool, False,
                      "idle.action applies to every job, not only preemptible ones."),
    "preemption.enabled": ("preemption_enabled", _bool, True,
                           "Stop preemptible jobs of a lower priority when a job cannot start "
                           "otherwise (docs/job-semantics.md#preemption-and-requeue)."),
    "preemption.default_preemptible": ("default_preemptible", _bool, False,
                                       "Jobs are preemptible unless submitted with "
                                       "--no-preemptible."),
    "preemption.user_defaults": ("preemptible_users", _user_flags, {},
                                 "Per user, instead of default_preemptible, e.g. "
                                 "{ alice = true }."),
    "preemption.grace": ("preempt_grace_s", parse_duration, "60s",
                         "Between the checkpoint signal and SIGTERM (--preempt-grace)."),
    "preemption.signal": ("preempt_signal", _choice(*WARN_SIGNAL_NAMES), "USR1",
                          "The checkpoint signal, unless the job's --signal names one."),
    "preemption.max_preemptions": ("max_preemptions", _number(0, 10**6, int), 3,
                                   "A job is preempted at most this often (0: no limit)."),
    "preemption.min_run_before_preempt": ("min_run_before_preempt_s", parse_duration, "5m",
                                          "A job is never preempted in its first minutes."),
    "services.haproxy": ("haproxy", _text, "haproxy",
                         "The HAProxy program services' front doors run (docs/services.md): a "
                         "name found on PATH or in /usr/sbin, or a path."),
    "containers.runtime": ("container_runtime", _choice(*container.RUNTIMES), "podman",
                           "What runs `submit --container` jobs: podman or docker "
                           "(docs/real-gpus.md)."),
    "containers.devices": ("container_devices", _choice(*container.DEVICE_MODES), "auto",
                           'How a container gets its GPUs: "cdi" (by UUID from a CDI spec), '
                           '"runtime" (docker --gpus, podman\'s NVIDIA hook), "auto" (CDI '
                           'when a spec names them).'),
}


def _size_up_to(high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        size = parse_size(value)
        if not 1 <= size <= high:
            raise ValueError(f"{value!r} is outside 1B..{high // 1024}KiB")
        return size
    return parse


# The [limits] table: sizes are written as sizes ("128KiB"), counts as numbers; the
# lowest depth still lets every real request through (a submit nests six levels).
for _key, (_field, _default, _high, _doc) in limits.CONFIG.items():
    KEYS[f"limits.{_key}"] = (_field, _size_up_to(_high) if isinstance(_default, str) else
                              _number(8 if _key == "json_depth" else 1, _high, int), _default, _doc)


def _near_key(section: str, key: str) -> str | None:
    """The key a typo most likely meant: one near it in its own section (`host.cpu`), the
    same key in another section, or a near one in any section."""
    from difflib import get_close_matches

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
    from difflib import get_close_matches

    sections = list(dict.fromkeys(dotted.split(".")[0] for dotted in KEYS))
    if key is None:  # `cpus = 4` before any [section]
        near = _near_key("", section)
        if near:
            owner, name = near.split(".")
            return ConfigError(f"'{section}' in {source} is outside any section; did you mean "
                               f"{name} under [{owner}]?")
        what = f"'{section}' in {source} is not a known key"
    elif section not in sections and (near := get_close_matches(section, sections, n=1)):
        return ConfigError(f"unknown section [{section}] in {source}; did you mean [{near[0]}]?")
    elif near_key := _near_key(section, key):
        return ConfigError(f"unknown key '{section}.{key}' in {source}; did you mean "
                           f"'{near_key}'?")
    else:
        what = f"unknown key '{section}.{key}' in {source}"
    return ConfigError(f"{what}. Known keys: {', '.join(KEYS)}")


def settings_from_mapping(data: dict[str, Any], source: str) -> Settings:
    """Apply a parsed TOML document to the defaults; unknown keys and bad values name the key."""
    changes: dict[str, Any] = {}
    for section, table in data.items():
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
            if dotted not in KEYS:
                raise _unknown_key(section, key, source)
            field_name, parse, _, _ = KEYS[dotted]
            try:
                changes[field_name] = parse(value)
            except ValueError as exc:
                raise ConfigError(f"{source}: bad value for '{dotted}': {exc}") from None
    if "clusters" in changes:
        changes["clusters"] = parse_clusters(changes["clusters"], source)
    if "default_cluster" in changes:
        changes["default_cluster"] = check_default(changes["default_cluster"],
                                                   changes.get("clusters", ()), source)
    settings = replace(Settings(), **changes)
    if settings.top_warn_pct >= settings.top_crit_pct:
        raise ConfigError(f"{source}: 'top.warn_pct' must be below 'top.crit_pct'")
    if settings.master_port_min > settings.master_port_max:
        raise ConfigError(f"{source}: 'jobs.master_port_min' is above 'jobs.master_port_max'")
    return settings


def load_settings(config_path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    """Defaults, then the TOML file if it exists, then GPUSCHED_SIMULATE from the environment."""
    environ = os.environ if environ is None else environ
    config_path = Path(config_path)
    settings = Settings()
    if config_path.exists():
        try:
            data = _toml().loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config {config_path}: {exc}. Fix its permissions "
                              "or move it away.") from None
        except _toml().TOMLDecodeError as exc:
            raise ConfigError(f"config {config_path} is not valid TOML: {exc}") from None
        settings = settings_from_mapping(data, str(config_path))
    if environ.get("GPUSCHED_SIMULATE"):
        settings = replace(settings, simulate=environ["GPUSCHED_SIMULATE"])
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
        value = (f'"{default}"' if isinstance(default, str) else
                 str(default).lower() if isinstance(default, bool) else str(default))
        lines += [f"# {doc}", f"{key} = {value}"]
    lines += notify_example()
    lines += clusters_example()
    return "\n".join(lines) + "\n"


assert {f.name for f in fields(Settings)} == {v[0] for v in KEYS.values()} | {"notify", "clusters",
                                                                     "default_cluster"}
