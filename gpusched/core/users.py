"""Who a uid is: the one lookup of a user's name in the password database, and of a
user's groups in the group database."""

from __future__ import annotations

import grp
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


def unix_groups(user: str) -> tuple[str, ...]:
    """The names of a user's Unix groups, their primary group's among them (none for a
    user the password database does not know)."""
    try:
        entry = pwd.getpwnam(user)
        gids = os.getgrouplist(user, entry.pw_gid)
    except (KeyError, OSError):
        return ()
    names = []
    for gid in gids:
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue  # a gid without a name: no quota can name it
    return tuple(names)
