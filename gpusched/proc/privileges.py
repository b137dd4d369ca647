"""System mode's privilege drop: a job becomes its submitter before it touches any path.

Imported by the shim (standard library only, like the shim itself). The root side
prepares only what must be root's (the user's log directory in a root-owned parent);
everything that opens, enters or runs a user-named path happens after drop().
"""

from __future__ import annotations

import os
import pwd
import stat


class PrivilegeError(OSError):
    """Becoming the user failed, or a path is not what system mode requires."""


class Identity:
    """Who a job runs as. A plain class: dataclasses would cost every job's start-up time."""

    def __init__(self, uid: int, gid: int, groups: tuple[int, ...], name: str):
        self.uid, self.gid, self.groups, self.name = uid, gid, groups, name


def identity_of(uid: int) -> Identity:
    """The user's primary group and full group list, from the password and group databases."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        raise PrivilegeError(f"uid {uid} has no user account on this machine") from None
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    return Identity(uid, entry.pw_gid, groups, entry.pw_name)


def home_of(uid: int) -> str | None:
    """The user's home directory, None for a uid with no account."""
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None


def drop(who: Identity) -> None:
    """Become the user for good, in the only safe order: groups, then gid, then uid.

    setgroups and setresgid need root, so they go first; after setresuid nothing can be
    taken back, which verify() proves rather than assumes.
    """
    os.setgroups(list(who.groups))
    os.setresgid(who.gid, who.gid, who.gid)
    os.setresuid(who.uid, who.uid, who.uid)
    verify(who)


def verify(who: Identity) -> None:
    if os.getresuid() != (who.uid,) * 3 or os.getresgid() != (who.gid,) * 3:
        raise PrivilegeError(f"the switch to uid {who.uid} / gid {who.gid} did not take: "
                             f"uids {os.getresuid()}, gids {os.getresgid()}")
    if set(os.getgroups()) != set(who.groups):
        raise PrivilegeError(f"supplementary groups are {sorted(os.getgroups())}, "
                             f"not {list(who.groups)}")
    if who.uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise PrivilegeError("root could be regained after dropping privileges")


def prepare_log_dir(path: str, who: Identity) -> None:
    """Root side: LOG_ROOT/USER, created 0700 and owned by the user, in a root-owned
    parent that nobody else can write (so the user cannot swap the directory itself)."""
    parent = os.lstat(os.path.dirname(path))
    if (not stat.S_ISDIR(parent.st_mode) or parent.st_uid != os.geteuid()
            or parent.st_mode & 0o022):
        raise PrivilegeError(f"{os.path.dirname(path)} must be a directory of uid "
                             f"{os.geteuid()} that only it can write")
    try:
        os.mkdir(path, 0o700)
        os.chown(path, who.uid, who.gid, follow_symlinks=False)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != who.uid:
        raise PrivilegeError(f"log directory {path} is not a directory owned by {who.name}; "
                             "an admin should remove it")


def open_owned(path: str, flags: int, uid: int) -> int | None:
    """Root side: a regular file of uid's opened with flags, or None. Never through a
    symlink in its last part, and without opening anything else first (a device, a FIFO
    a user put there): O_PATH opens nothing, its file is checked, then reopened. A link
    in the directories above leads only to a file of uid's, which uid may write anyway:
    a job's --output can be anywhere, and the daemon's notes go there too."""
    try:
        handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            return None
        return os.open(f"/proc/self/fd/{handle}", flags | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(handle)


def open_log(path: str) -> int:
    """User side: append to a regular file of our own, never through a symlink, and never
    blocking on a FIFO planted in its place."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_CLOEXEC, 0o600)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise PrivilegeError(f"log {path} is not a regular file owned by uid {os.geteuid()}")
    os.set_blocking(fd, True)
    return fd
