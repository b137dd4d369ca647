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
        raise PrivilegeError(
            f"the switch to uid {who.uid} / gid {who.gid} did not take: "
            f"uids {os.getresuid()}, gids {os.getresgid()}"
        )
    if set(os.getgroups()) != set(who.groups):
        raise PrivilegeError(
            f"supplementary groups are {sorted(os.getgroups())}, not {list(who.groups)}"
        )
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
    if not stat.S_ISDIR(parent.st_mode) or parent.st_uid != os.geteuid() or parent.st_mode & 0o022:
        raise PrivilegeError(
            f"{os.path.dirname(path)} must be a directory of uid "
            f"{os.geteuid()} that only it can write"
        )
    try:
        os.mkdir(path, 0o700)
        os.chown(path, who.uid, who.gid, follow_symlinks=False)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != who.uid:
        raise PrivilegeError(
            f"log directory {path} is not a directory owned by {who.name}; "
            "an admin should remove it"
        )


def open_owned(path: str, flags: int, uid: int) -> int | None:
    """open_as_owner's file, or None where it raises."""
    try:
        return open_as_owner(path, flags, uid)
    except OSError:
        return None


def open_as_owner(path: str, flags: int, uid: int) -> int:
    """A regular file of uid's, opened with flags by uid: a job's log, named by its user,
    for a daemon or a CLI that may be root. As root, a child that has become uid (its
    groups too) opens it and hands the descriptor back: root reaches nothing the user
    could not, whatever the user's links in the directories above lead to. Never through
    a link in its last part, and nothing else is opened first (a device, a FIFO): O_PATH
    opens nothing; its file is checked, then reopened. Raises OSError (PrivilegeError:
    it is there but not a regular file of uid's)."""
    if os.geteuid() != 0 or uid == 0:
        return _open_regular(path, flags, uid)
    # socket: 10 ms of every `gpusched logs` (cli/logview.py opens logs here), only as root
    import socket  # noqa: PLC0415

    who = identity_of(uid)
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # only system calls here: the daemon's other threads are not in the child
        code = b"5"  # EIO
        try:
            ours.close()
            drop(who)
            socket.send_fds(theirs, [b"ok"], [_open_regular(path, flags, uid)])
            os._exit(0)
        except PrivilegeError:
            code = b"not"
        except OSError as exc:
            code = str(exc.errno or 5).encode()
        finally:
            try:
                theirs.sendall(code)
            finally:
                os._exit(1)
    theirs.close()
    try:
        message, fds, _, _ = socket.recv_fds(ours, 16, 1)
    finally:
        ours.close()
        os.waitpid(pid, 0)
    if fds:
        os.set_inheritable(fds[0], False)  # as O_CLOEXEC would have it
        return fds[0]
    if message == b"not":
        raise PrivilegeError(f"{path} is not a regular file of uid {uid}")
    number = int(message) if message.isdigit() else 5
    raise OSError(number, os.strerror(number), path)


def _open_regular(path: str, flags: int, uid: int) -> int:
    handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            raise PrivilegeError(f"{path} is not a regular file of uid {uid}")
        return os.open(f"/proc/self/fd/{handle}", flags | os.O_CLOEXEC)
    finally:
        os.close(handle)


def open_log(path: str) -> int:
    """User side: append to a regular file of our own, never through a symlink, and never
    blocking on a FIFO planted in its place."""
    fd = os.open(
        path,
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
        0o600,
    )
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise PrivilegeError(f"log {path} is not a regular file owned by uid {os.geteuid()}")
    os.set_blocking(fd, True)
    return fd
