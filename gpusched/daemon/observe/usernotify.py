"""A user's own `[[notify]]` entries, in system mode: ~/.config/gpusched/notify.toml of the
job's owner, read by a root daemon (on a notification thread, never in the loop) and run
as that user. Only commands: a post would leave from the daemon, with its reach."""

from __future__ import annotations

import os
import stat
from dataclasses import replace

from gpusched.core.config import _toml
from gpusched.core.errors import ConfigError
from gpusched.core.notifyconf import NotifyRule, parse_rules
from gpusched.proc.privileges import home_of

USER_FILE = ".config/gpusched/notify.toml"  # under the owner's home
USER_FILE_MAX_BYTES = 64 * 1024


def user_rules(uid: int, timeout_max_s: float) -> tuple[str, tuple[NotifyRule, ...]]:
    """(the file, its entries): none when it is missing. A timeout over the site's
    timeout_max_s is cut to it: the site's notification threads are shared. Raises
    ConfigError, naming the file, when it is not the user's own, is writable by others,
    or is not a valid list of entries with commands only."""
    home = home_of(uid)
    if not home:
        return "", ()
    path = os.path.join(home, USER_FILE)
    text = _read_own_file(path, uid)
    if text is None:
        return path, ()
    try:
        data = _toml().loads(text)
    except _toml().TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"notify"})
    if unknown:
        raise ConfigError(f"{path}: unknown key '{unknown[0]}'; it holds [[notify]] entries only")
    rules = parse_rules(data.get("notify", []), path)
    for n, rule in enumerate(rules, 1):
        if rule.url:
            raise ConfigError(
                f"{path}: [[notify]] entry {n} has a 'url'; a user's entries "
                "run commands only (post with curl from one)"
            )
        if rule.wants("pending_longer_than"):
            raise ConfigError(
                f"{path}: [[notify]] entry {n} asks for pending_longer_than, "
                "which only the site's config can; use the other events"
            )
    return path, tuple(
        replace(rule, timeout_s=min(rule.timeout_s, timeout_max_s)) for rule in rules
    )


def _read_own_file(path: str, uid: int) -> str | None:
    """The file's text, read without following a link at its end, if it is a regular
    file of uid that no one else may write; None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid or info.st_mode & 0o022:
            raise ConfigError(
                f"{path} must be a regular file of uid {uid} that only it can "
                "write; its entries are ignored"
            )
        data = f.read(USER_FILE_MAX_BYTES + 1)
    if len(data) > USER_FILE_MAX_BYTES:
        raise ConfigError(
            f"{path} is over {USER_FILE_MAX_BYTES // 1024} KiB; its entries are ignored"
        )
    return data.decode("utf-8", "replace")
