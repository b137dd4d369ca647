"""Who a uid is: the one lookup of a user's name in the password database."""

from __future__ import annotations

import os
import pwd


def user_name(uid: int, unknown: str | None = None) -> str:
    """The name of the user with this uid; `unknown` when the password database has no
    entry (a deleted user, a uid from a container), the uid as text by default."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid) if unknown is None else unknown


def current_user_name() -> str:
    """The name of the user this process runs as (the uid as text without an entry)."""
    return user_name(os.getuid())
