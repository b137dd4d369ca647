"""The `[[notify]]` entries of the config: on which job events to run which command or
post to which webhook (stdlib only; the daemon's daemon/observe/notify.py delivers them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusched.core.errors import ConfigError
from gpusched.core.units import parse_duration

# The events a hook may ask for, and what each means (the README's table says the same).
EVENTS = {
    "start": "the job started (each attempt)",
    "end": "the job ended, however (succeeded, failed, cancelled, timeout, oom, lost)",
    "fail": "the job failed (a non-zero exit or a signal)",
    "timeout": "the job ran past its --time",
    "oom": "the job went past its memory and was stopped",
    "lost": "the job's shim vanished without an exit record",
    "pending_longer_than": "the job has been pending longer than pending_longer_than",
    "gpu_mem_over": "the job used more GPU memory than its --gpu-mem on a shared GPU",
}
# The final states each end event stands for ("end": any).
END_EVENTS = {"fail": "failed", "timeout": "timeout", "oom": "oom", "lost": "lost"}


@dataclass(frozen=True)
class NotifyRule:
    """One `[[notify]]` entry: a command (argv, never a shell string) and/or a webhook."""

    events: tuple[str, ...]
    command: tuple[str, ...] = ()
    url: str = ""
    timeout_s: float = 30.0
    retries: int = 3  # webhook only: a command is never retried (it may have side effects)
    pending_longer_than_s: float | None = None
    log_lines: int = 20  # the last lines of the job's log in the event on stdin

    def wants(self, event: str) -> bool:
        return event in self.events


# key -> what it is, for errors and the example file
KEYS = {
    "events": "list of events: " + ", ".join(EVENTS),
    "command": 'argv list, e.g. ["/usr/local/bin/on-job-end", "--quiet"] (no shell)',
    "url": "webhook URL (http or https), posted a JSON body with a Slack-style `text`",
    "timeout": 'per run or POST, e.g. "30s"',
    "retries": "webhook retries after a timeout, a connection error, 429 or 5xx",
    "pending_longer_than": 'for the pending_longer_than event, e.g. "2h"',
    "log_lines": "last lines of the job's log sent on stdin and to the webhook",
}


def parse_rules(value: Any, source: str) -> tuple[NotifyRule, ...]:
    """The `notify` array of tables; each problem names the entry and the key."""
    if not isinstance(value, list):
        raise ConfigError(
            f"{source}: 'notify' must be an array of tables: write each entry "
            "under its own [[notify]] header"
        )
    return tuple(
        _rule(entry, f"{source}: [[notify]] entry {n}") for n, entry in enumerate(value, 1)
    )


def _rule(entry: Any, where: str) -> NotifyRule:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} is not a table. Write it under a [[notify]] header")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'. Known keys: {', '.join(KEYS)}")
    try:
        rule = NotifyRule(
            events=_events(entry.get("events")),
            command=_argv(entry.get("command", [])),
            url=_url(entry.get("url", "")),
            timeout_s=_positive(entry.get("timeout", "30s"), "timeout"),
            retries=_count(entry.get("retries", 3), "retries", 10),
            pending_longer_than_s=(
                None
                if "pending_longer_than" not in entry
                else _positive(entry["pending_longer_than"], "pending_longer_than")
            ),
            log_lines=_count(entry.get("log_lines", 20), "log_lines", 1000),
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not rule.command and not rule.url:
        raise ConfigError(f"{where} has neither 'command' nor 'url'. Give it one of them")
    if rule.wants("pending_longer_than") != (rule.pending_longer_than_s is not None):
        raise ConfigError(
            f"{where}: the pending_longer_than event and the "
            "'pending_longer_than' key go together. Give both or neither"
        )
    return rule


def _events(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"'events' must be a non-empty list of: {', '.join(EVENTS)}")
    for event in value:
        if event not in EVENTS:
            raise ValueError(f"'events': {event!r} is not one of: {', '.join(EVENTS)}")
    return tuple(dict.fromkeys(value))


def _argv(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        # A string would need a shell or a split: both are how job names end up executed.
        raise ValueError(
            f"'command' is the string {value!r}; write it as an argv list, "
            f"e.g. [{', '.join(repr(w) for w in value.split()[:2])}]"
        )
    if not isinstance(value, list) or not all(isinstance(w, str) and w for w in value):
        raise ValueError(f"'command' must be a list of non-empty strings, not {value!r}")
    return tuple(value)


def _url(value: Any) -> str:
    if not isinstance(value, str) or (value and not value.startswith(("http://", "https://"))):
        raise ValueError(f"'url' must be an http:// or https:// URL, not {value!r}")
    return value


def _positive(value: Any, key: str) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"'{key}' must be longer than zero, not {value!r}")
    return seconds


def _count(value: Any, key: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ValueError(f"'{key}' must be a whole number in 0..{high}, not {value!r}")
    return value


def example() -> list[str]:
    """A commented [[notify]] entry for the example config (entries are optional)."""
    lines = [
        "",
        "# [[notify]] entries (any number; none by default): run a command or post a",
        "# webhook on job events. docs/monitoring.md has the environment and the JSON.",
        "# [[notify]]",
    ]
    values = {
        "events": '["fail", "timeout", "oom", "lost"]',
        "command": '["/usr/local/bin/on-job-end"]',
        "url": '""',
        "timeout": '"30s"',
        "retries": "3",
        "pending_longer_than": '"2h"',
        "log_lines": "20",
    }
    for key, doc in KEYS.items():
        lines += [f"# {key} = {values[key]}  # {doc}"]
    return lines
