"""The config file's keys: each TOML key's Settings field, its parser, its default as
written in TOML and what it does (core/config.py loads them; the example file and the
typo test are made from the same table)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.models import DISCIPLINES
from gpusched.core.sched import gpupromise
from gpusched.core.sched.placement import BUILTIN_POLICIES
from gpusched.core.spec import container, limits, values
from gpusched.core.spec.syntax import MAX_PRIORITY, WARN_SIGNAL_NAMES
from gpusched.core.units import parse_duration, parse_size


def _choice(*valid: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or value not in valid:
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


def detach_key_bytes(value: Any) -> bytes:
    """The bytes a terminal sends for detach keys written as "ctrl-]" or "ctrl-p,ctrl-q"
    (ctrl- and one of @, a-z, [, \\, ], ^, _; or one printable character)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a key such as ctrl-] or ctrl-p,ctrl-q")
    keys = bytearray()
    for key in value.split(","):
        name = key.strip().lower()
        if name.startswith("ctrl-") and len(name) == 6 and "@" <= name[5].upper() <= "_":
            keys.append(ord(name[5].upper()) - 0x40)
        elif len(key) == 1 and key.isprintable() and key.isascii():
            keys.append(ord(key))
        else:
            raise ValueError(f"{key!r} is not a key such as ctrl-] or a single character")
    return bytes(keys)


def _optional_duration(value: Any) -> float | None:
    return None if value in ("", None) else parse_duration(value)


def _optional_size(value: Any) -> int:
    return 0 if value in ("", None) else _size_up_to(2**62)(value)


def _list_of(kind: type, low: float) -> Callable[[Any], tuple[Any, ...]]:
    def parse(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise ValueError(f"{value!r} is not a list")
        return tuple(_number(low, 1e9, kind)(v) for v in value)

    return parse


def _env_table(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f'{value!r} is not a table of NAME = "value" strings')
    try:  # the names a submit's environment may have, checked by the same reader
        values.environment(value, "jobs.env")
    except UsageError as exc:
        raise ValueError(exc.message.removeprefix("jobs.env: ")) from None
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
    """ "HOST:PORT" (an IPv6 host in brackets: "[::1]:19400") as (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"{value!r} is not HOST:PORT with a port in 0..65535 (0: any free one), "
            'e.g. "127.0.0.1:19400"'
        )
    return host.strip("[]"), int(port)


def _listen(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):  # a bare port
        raise ValueError(f'{value!r} is not a string; write "127.0.0.1:{value}"')
    listen = _text(value)
    if listen:
        parse_listen(listen)
    return listen


IDLE_ACTIONS = ("warn", "requeue", "cancel")  # [idle] action (daemon/jobs/idlegpus.py)


def _las_thresholds(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f'{value!r} is not a list of durations, e.g. ["1h", "8h"]')
    bounds = tuple(_positive_duration(v) for v in value)
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"{value!r} is not in ascending order")
    return bounds


def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


# TOML key -> (Settings field, parser, default as written in TOML, what it does). One
# table drives loading, the example file and the test that keeps the two in step.
KEYS: dict[str, tuple[str, Callable[[Any], Any], Any, str]] = {
    "daemon.gpu_poll_interval": (
        "gpu_poll_interval_s",
        _positive_duration,
        "2s",
        "How often the daemon reads the GPUs (jobs still start at once).",
    ),
    "daemon.cancel_grace": (
        "cancel_grace_s",
        parse_duration,
        "10s",
        "Between SIGTERM and SIGKILL when a running job is cancelled.",
    ),
    "daemon.mode": (
        "mode",
        _choice("user", "system"),
        "user",
        '"system": one root daemon for all users (read from /etc/gpusched/gpusched.toml).',
    ),
    "daemon.max_connections_per_uid": (
        "max_connections_per_uid",
        _number(0, 10**6, int),
        32,
        "Open connections one user may hold (0: no limit; root and "
        "the daemon's own user are exempt).",
    ),
    "gpus.simulate": (
        "simulate",
        _text,
        "",
        'Simulated GPUs instead of NVML, e.g. "4x80GiB" or '
        '"2xH100-80GiB,2xA100-40GiB" (env GPUSCHED_SIMULATE wins).',
    ),
    "gpus.visible_devices": (
        "visible_devices",
        _choice("uuid", "index"),
        "uuid",
        'CUDA_VISIBLE_DEVICES as GPU UUIDs ("uuid") or indices ("index").',
    ),
    "gpus.max_util_pct": (
        "max_util_pct",
        _number(0, 100),
        90,
        "A GPU this busy (percent) takes no new jobs.",
    ),
    "gpus.mem_headroom": (
        "mem_headroom_bytes",
        parse_size,
        "512MiB",
        "Free memory kept on a GPU beyond what a sharing job asks for.",
    ),
    "gpus.exclusive_idle_mem": (
        "exclusive_idle_mem_bytes",
        parse_size,
        "1GiB",
        "A whole-GPU job needs a GPU whose other users hold at most this.",
    ),
    "gpus.outside": (
        "outside",
        _choice("count", "block"),
        "count",
        'Processes gpusched did not start: "count" their memory, or "block" the GPU.',
    ),
    "gpus.outside_ignore_below": (
        "outside_ignore_below_bytes",
        parse_size,
        "0MiB",
        "Ignore outside processes holding less than this.",
    ),
    "gpus.outside_idle_after": (
        "outside_idle_after_s",
        _optional_duration,
        "",
        'Ignore an outside process idle (0% busy) this long, e.g. "2h"; "" never.',
    ),
    "scheduling.policy": (
        "policy",
        _text,
        "pack",
        f"{', '.join(BUILTIN_POLICIES)}, or a policy from the gpusched.policies entry points.",
    ),
    "scheduling.discipline": (
        "discipline",
        _choice(*DISCIPLINES),
        "fifo",
        f"Queue order: {', '.join(DISCIPLINES)} (fifo skips ahead).",
    ),
    "scheduling.gpu_weights": (
        "gpu_weights",
        _list_of(float, 0.001),
        [],
        "weighted-round-robin: a weight per GPU index, e.g. [2, 1, 1, 1].",
    ),
    "scheduling.gpu_order": (
        "gpu_order",
        _list_of(int, 0),
        [],
        "order: GPU indices in the order to fill them, e.g. [3, 2, 1, 0].",
    ),
    "scheduling.fairshare_half_life": (
        "fairshare_half_life_s",
        _positive_duration,
        "7d",
        "fairshare: past usage counts half after this long.",
    ),
    "scheduling.las_thresholds": (
        "las_thresholds_gpu_s",
        _las_thresholds,
        ["2h", "8h"],
        "las: attained GPU time (GPUs x run time) that ends each queue but the last, ascending.",
    ),
    "scheduling.las_starvation_factor": (
        "las_starvation_factor",
        _number(0, 1e6),
        4.0,
        "las: a job that waited this many times its attained GPU time moves to the first queue.",
    ),
    "scheduling.las_starvation_floor": (
        "las_starvation_floor_s",
        parse_duration,
        "1h",
        "las: but never before it waited this long.",
    ),
    "scheduling.las_preempt_smaller_after": (
        "las_preempt_smaller_after_s",
        parse_duration,
        "4h",
        "las: a job that waited this long also preempts jobs of its queue on fewer GPUs (0: never).",
    ),
    "scheduling.las_max_preemptions": (
        "las_max_preemptions",
        _number(0, 10**6, int),
        0,
        "las: a job is preempted at most this often for jobs of its priority (0: no limit).",
    ),
    "scheduling.user_weights": (
        "user_weights",
        _user_weights,
        {},
        "fairshare: shares per user, e.g. { alice = 2 } (default 1).",
    ),
    "scheduling.max_user_priority": (
        "max_user_priority",
        _number(-MAX_PRIORITY, MAX_PRIORITY, int),
        0,
        "The highest --priority a user who is not an admin may "
        "give (submit, update): raising a job above others' is "
        "the admins' (in user mode, the daemon's user is).",
    ),
    "host.cpus": (
        "host_cpus",
        _number(0, 100_000, int),
        0,
        "Cores jobs may use; 0 = those in the daemon's CPU affinity.",
    ),
    "host.reserve_cpus": (
        "reserve_cpus",
        _number(0, 100_000, int),
        0,
        "Cores kept for the system (the lowest-numbered ones).",
    ),
    "host.reserve_mem": (
        "reserve_mem_bytes",
        parse_size,
        "0MiB",
        "Host memory kept for the system.",
    ),
    "host.cpu_binding": (
        "cpu_binding",
        _bool,
        False,
        "Pin each job to its own cores with CPU affinity (those nearest its GPUs first).",
    ),
    "host.enforce_mem": (
        "enforce_mem",
        _bool,
        False,
        "Stop a job (state oom) that uses more host memory than --mem + margin.",
    ),
    "host.mem_margin_pct": (
        "mem_margin_pct",
        _number(0, 1000),
        10,
        "How far past its --mem a job may go before it is reported (percent).",
    ),
    "top.warn_pct": (
        "top_warn_pct",
        _number(0, 100),
        50,
        "`gpusched top` colours a load from this percent yellow...",
    ),
    "top.crit_pct": ("top_crit_pct", _number(0, 100), 80, "...and from this percent red."),
    "attach.detach_keys": (
        "attach_detach_keys",
        lambda value: detach_key_bytes(value) and value,
        "ctrl-]",
        "The keys that leave `gpusched attach` with the job running: ctrl-X or a character, "
        'comma-separated for a sequence (e.g. "ctrl-p,ctrl-q").',
    ),
    "jobs.max_running": (
        "max_running",
        _number(0, 10**6, int),
        0,
        "At most this many jobs run at once, like `tsp -S` (0: no limit).",
    ),
    "jobs.env": (
        "job_env",
        _env_table,
        {},
        "Variables every job gets unless its own environment sets them, e.g. "
        '{ TF_FORCE_GPU_ALLOW_GROWTH = "true" }.',
    ),
    "jobs.keep_finished": (
        "keep_finished_s",
        _optional_duration,
        "30d",
        "Finished jobs that ended longer ago than this are removed, with "
        'their files; their usage stays in a summary ("": keep them).',
    ),
    "jobs.keep_finished_count": (
        "keep_finished_count",
        _number(0, 10**9, int),
        100000,
        "At most this many finished jobs are kept, the newest (0: no limit).",
    ),
    "jobs.max_log_size": (
        "max_log_size_bytes",
        _optional_size,
        "",
        "A job's log beyond this size loses its oldest part, and says so "
        '("": no cap), e.g. "100M".',
    ),
    "jobs.master_port_min": (
        "master_port_min",
        _number(1024, 65535, int),
        29500,
        "Lowest MASTER_PORT given to a job (torchrun's default is 29500).",
    ),
    "jobs.master_port_max": (
        "master_port_max",
        _number(1024, 65535, int),
        29999,
        "Highest MASTER_PORT given to a job.",
    ),
    "system.service_user": (
        "service_user",
        _text,
        "",
        "System mode: a non-root user the daemon runs as, trusted by clients besides root.",
    ),
    "system.user_notify_timeout": (
        "user_notify_timeout_s",
        _positive_duration,
        "30s",
        "System mode: the longest a user's own [[notify]] command "
        "may run (a longer timeout of theirs is cut to this).",
    ),
    "system.admin_group": (
        "admin_group",
        _text,
        "",
        "System mode: members of this group may cancel, hold, update and inspect anyone's jobs.",
    ),
    "system.show_commands": (
        "show_commands",
        _choice("own", "all"),
        "own",
        'Whose command lines `ls`, `show` and `top` show: "own" (the '
        'owner\'s and to admins) or "all".',
    ),
    "metrics.listen": (
        "metrics_listen",
        _listen,
        "",
        "Serve Prometheus metrics at http://HOST:PORT/metrics, e.g. "
        '"127.0.0.1:19400" (docs/monitoring.md); "" off.',
    ),
    "metrics.max_job_series": (
        "metrics_max_job_series",
        _number(0, 100_000, int),
        64,
        "Running jobs given per-job series; the rest are counted in "
        "gpusched_metrics_job_series_dropped.",
    ),
    "memory.estimate_margin_pct": (
        "estimate_margin_pct",
        _number(0, 1000),
        10,
        "--gpu-mem auto adds this much (percent) to the p95 of earlier runs' GPU memory peaks.",
    ),
    "memory.estimate_runs": (
        "estimate_runs",
        _number(1, 10_000, int),
        50,
        "--gpu-mem auto reads this many of the newest successful runs.",
    ),
    "memory.mps": (
        "mps",
        _bool,
        False,
        "Jobs that share a GPU (--gpu-mem) run under NVIDIA MPS, capped at their "
        "--gpu-mem (docs/real-gpus.md#nvidia-mps).",
    ),
    "memory.mps_control": (
        "mps_control",
        _text,
        "nvidia-cuda-mps-control",
        "The MPS control program gpusched starts and stops: a name found on PATH, or a path.",
    ),
    "memory.mps_thread_pct": (
        "mps_thread_pct",
        _number(1, 100, int),
        100,
        "Under MPS, the share of each GPU's compute a sharing job may use "
        "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); 100: no limit.",
    ),
    "memory.gpu_over": (
        "gpu_over",
        _choice(*gpupromise.ACTIONS),
        "report",
        "A job sharing a GPU that uses more than its --gpu-mem + margin: "
        '"report" it, "stop" it (state gpu_oom) or "requeue" it with more (docs/real-gpus.md).',
    ),
    "memory.gpu_over_margin_pct": (
        "gpu_over_margin_pct",
        _number(0, 1000),
        10,
        "How far past its --gpu-mem (percent) a job may go before gpu_over acts.",
    ),
    "memory.gpu_free_floor": (
        "gpu_free_floor_bytes",
        parse_size,
        "1GiB",
        "Below this much free memory on a GPU, a job over its --gpu-mem at all is acted on.",
    ),
    "memory.others_peak_window": (
        "others_peak_window_s",
        parse_duration,
        "5m",
        "Processes gpusched did not start count at their peak over this window, not their "
        "current use.",
    ),
    "idle.after": (
        "idle_after_s",
        _optional_duration,
        "",
        "A running job whose GPUs all stayed at 0% busy this long is flagged idle, "
        'e.g. "30m"; "" off.',
    ),
    "idle.action": (
        "idle_action",
        _choice(*IDLE_ACTIONS),
        "warn",
        '"warn" (flag it, a line in its log), "requeue" or "cancel" an idle job '
        "(preemptible ones only, unless all_jobs; never --interactive ones).",
    ),
    "idle.all_jobs": (
        "idle_all_jobs",
        _bool,
        False,
        "idle.action applies to every job, not only preemptible ones.",
    ),
    "preemption.enabled": (
        "preemption_enabled",
        _bool,
        True,
        "Stop preemptible jobs of a lower priority when a job cannot start "
        "otherwise (docs/job-semantics.md#preemption-and-requeue).",
    ),
    "preemption.default_preemptible": (
        "default_preemptible",
        _bool,
        False,
        "Jobs are preemptible unless submitted with --no-preemptible.",
    ),
    "preemption.user_defaults": (
        "preemptible_users",
        _user_flags,
        {},
        "Per user, instead of default_preemptible, e.g. { alice = true }.",
    ),
    "preemption.grace": (
        "preempt_grace_s",
        parse_duration,
        "60s",
        "Between the checkpoint signal and SIGTERM (--preempt-grace).",
    ),
    "preemption.signal": (
        "preempt_signal",
        _choice(*WARN_SIGNAL_NAMES),
        "USR1",
        "The checkpoint signal, unless the job's --signal names one.",
    ),
    "preemption.max_preemptions": (
        "max_preemptions",
        _number(0, 10**6, int),
        3,
        "A job is preempted at most this often (0: no limit).",
    ),
    "preemption.min_run_before_preempt": (
        "min_run_before_preempt_s",
        parse_duration,
        "5m",
        "A job is never preempted in its first minutes.",
    ),
    "reservations.user_max_gpu_hours": (
        "reservation_user_max_gpu_hours",
        _number(0, 10**7),
        0,
        "GPU-hours of reservations a user who is not an admin may hold for themself, "
        "all not yet ended together (0: only admins reserve; docs/calendar.md).",
    ),
    "services.haproxy": (
        "haproxy",
        _text,
        "haproxy",
        "The HAProxy program services' front doors run (docs/services.md): a "
        "name found on PATH or in /usr/sbin, or a path.",
    ),
    "containers.runtime": (
        "container_runtime",
        _choice(*container.RUNTIMES),
        "podman",
        "What runs `submit --container` jobs: podman or docker (docs/real-gpus.md).",
    ),
    "containers.devices": (
        "container_devices",
        _choice(*container.DEVICE_MODES),
        "auto",
        'How a container gets its GPUs: "cdi" (by UUID from a CDI spec), '
        '"runtime" (docker --gpus, podman\'s NVIDIA hook), "auto" (CDI '
        "when a spec names them).",
    ),
    "mcp.allow_mutations": (
        "mcp_allow_mutations",
        _bool,
        True,
        "`gpusched mcp` offers the tools that change the queue (submit, cancel, hold, ...); "
        "false: only those that look (docs/mcp.md).",
    ),
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
    KEYS[f"limits.{_key}"] = (
        _field,
        _size_up_to(_high)
        if isinstance(_default, str)
        else _number(8 if _key == "json_depth" else 1, _high, int),
        _default,
        _doc,
    )
