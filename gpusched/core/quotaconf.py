"""The [quotas] tables: `[quotas.default]`, `[quotas.users.NAME]`, `[quotas.groups.NAME]`,
each with time windows as sub-tables (`[quotas.groups.students.day]` with `hours`)."""

from __future__ import annotations

from typing import Any

from gpusched.core.errors import ConfigError
from gpusched.core.sched.quotas import KEYS, Quota, Quotas, Window
from gpusched.core.units import parse_size

UNLIMITED = "unlimited"
# The box-wide keys quotas replaced: still read, as [quotas.default]'s.
OLD_KEYS = {
    "scheduling.max_gpus_per_user": "max_running_gpus",
    "scheduling.max_running_per_user": "max_running_jobs",
}


def _limit(key: str, value: Any, where: str, source: str) -> int | None:
    if value == UNLIMITED:
        return None
    try:
        if key == "max_gpu_mem" and isinstance(value, str):
            return parse_size(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f'{value!r} is not a whole number >= 0 or "{UNLIMITED}"')
        return value
    except ValueError as exc:
        raise ConfigError(f"{source}: bad value for '{where}.{key}': {exc}") from None


def _hours(value: Any, where: str, source: str) -> tuple[int, int]:
    """ "09:00-18:00" as minutes of the day; an end before the start runs past midnight."""
    try:
        start, end = (_minute(part) for part in str(value).split("-"))
    except ValueError:
        start = end = -1
    if not isinstance(value, str) or start < 0 or start == end:
        raise ConfigError(
            f"{source}: bad value for '{where}.hours': {value!r} is not two different times of day, "
            'e.g. "09:00-18:00" (or "22:00-06:00" across midnight)'
        )
    return start, end


def _minute(text: str) -> int:
    hours, sep, minutes = text.strip().partition(":")
    if not sep or not hours.isdigit() or not minutes.isdigit() or len(minutes) != 2:
        raise ValueError(text)
    if (
        not (0 <= int(hours) <= 24 and 0 <= int(minutes) < 60)
        or int(hours) * 60 + int(minutes) > 24 * 60
    ):
        raise ValueError(text)
    return (int(hours) * 60 + int(minutes)) % (24 * 60)


def _quota(scope: str, table: Any, source: str) -> Quota:
    where = f"quotas.{scope}"
    if not isinstance(table, dict):
        raise ConfigError(
            f"{source}: [{where}] must be a table of limits, e.g. max_running_gpus = 2"
        )
    limits: dict[str, int | None] = {}
    windows: list[Window] = []
    for key, value in table.items():
        if isinstance(value, dict):
            windows.append(_window(f"{where}.{key}", key, value, source))
        elif key in KEYS:
            limits[key] = _limit(key, value, where, source)
        else:
            raise ConfigError(_unknown(f"{where}.{key}", source, "or a window's [table]"))
    _check_overlap(where, windows, source)
    return Quota(scope, limits, tuple(windows))


def _window(where: str, name: str, table: dict[str, Any], source: str) -> Window:
    if "hours" not in table:
        raise ConfigError(f'{source}: [{where}] needs hours, e.g. hours = "09:00-18:00"')
    start, end = _hours(table["hours"], where, source)
    limits: dict[str, int | None] = {}
    for key, value in table.items():
        if key == "hours":
            continue
        if key not in KEYS:
            raise ConfigError(_unknown(f"{where}.{key}", source, "or hours"))
        limits[key] = _limit(key, value, where, source)
    return Window(name, start, end, limits)


def _check_overlap(where: str, windows: list[Window], source: str) -> None:
    for n, one in enumerate(windows):
        for other in windows[n + 1 :]:
            if any(one.covers(m) and other.covers(m) for m in range(24 * 60)):
                raise ConfigError(
                    f"{source}: windows [{where}.{one.name}] and [{where}.{other.name}] "
                    "overlap; give each hour of the day to one window at most"
                )


def _unknown(dotted: str, source: str, besides: str) -> str:
    return f"unknown key '{dotted}' in {source}. Known keys: {', '.join(KEYS)}, {besides}"


def parse_quotas(value: Any, old: dict[str, Any], source: str) -> Quotas:
    """The [quotas] tables, with the old box-wide keys (OLD_KEYS) as the default's."""
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise ConfigError(
            f"{source}: 'quotas' must be tables: [quotas.default], [quotas.users.NAME]"
        )
    for section in value:
        if section not in ("default", "users", "groups"):
            raise ConfigError(
                f"unknown section [quotas.{section}] in {source}. Known: [quotas.default], "
                "[quotas.users.NAME], [quotas.groups.NAME]"
            )
    default = dict(value.get("default", {}))
    for dotted, raw in old.items():
        new = OLD_KEYS[dotted]
        if new in default:
            raise ConfigError(
                f"{source}: '{dotted}' and 'quotas.default.{new}' are both set; "
                f"keep quotas.default.{new} only"
            )
        if raw != 0:  # 0 meant no limit
            default[new] = raw
    users, groups = value.get("users", {}), value.get("groups", {})
    for kind, tables in (("users", users), ("groups", groups)):
        if not isinstance(tables, dict):
            raise ConfigError(f"{source}: 'quotas.{kind}' must hold one table per name")
    return Quotas(
        _quota("default", default, source) if default else None,
        {name: _quota(f"users.{name}", t, source) for name, t in users.items()},
        {name: _quota(f"groups.{name}", t, source) for name, t in groups.items()},
    )


def example() -> list[str]:
    """Commented quotas for the example config (none by default)."""
    return [
        "",
        "# Quotas (none by default; docs/job-semantics.md#quotas): limits per user, per Unix",
        '# group and for everyone else, each a number or "unlimited". A user\'s limit for',
        "# each key is their own quota's, else their groups' (the most generous), else the",
        "# default's. A sub-table with hours is a window whose limits apply in those hours.",
        "# [quotas.default]",
        "# max_running_gpus = 4    # GPUs held by one user's running jobs",
        '# max_gpu_mem = "320GiB"  # GPU memory held by their running jobs',
        "# max_running_jobs = 8    # their running jobs",
        "# max_queued_jobs = 1000  # their pending, held and running jobs (submit refuses more)",
        "# [quotas.groups.students]",
        "# max_running_gpus = 4",
        "# [quotas.groups.students.day]",
        '# hours = "09:00-18:00"   # local time; "22:00-06:00" runs past midnight',
        "# max_running_gpus = 2",
        "# [quotas.users.alice]",
        '# max_running_gpus = "unlimited"',
    ]
