"""The client's checks that a socket is the real daemon's before anything is sent to it."""

from __future__ import annotations

import os
import stat

from gpusched.client import wire
from gpusched.client.modes import system_paths
from gpusched.client.paths import Paths
from gpusched.core.errors import PermissionDenied


def _service_uid(paths: Paths) -> int | None:
    """The uid of `system.service_user` in the system config, if one is set."""
    # Only for a socket that is not the caller's; config: 70 ms of every command, and pwd
    # a module more for each (tests/test_lean_imports.py)
    import pwd  # noqa: PLC0415

    from gpusched.core.config import load_settings  # noqa: PLC0415

    config = paths.config_file if paths.is_system else system_paths().config_file
    try:
        name = load_settings(config, {}).service_user
        return pwd.getpwnam(name).pw_uid if name else None
    except (KeyError, OSError, ValueError):
        return None


def _owner_name(uid: int) -> str:
    # users: 0.1 ms of every submit (tests/test_lean_imports.py); only for the refusal
    from gpusched.core.users import user_name  # noqa: PLC0415

    name = user_name(uid, unknown="")
    return f"{name} (uid {uid})" if name else f"uid {uid}"


def require_trusted(uid: int, what: str, paths: Paths) -> None:
    """Root, or the configured service user; and the caller itself except for the system daemon
    (whose directory nobody else can write, so a socket of the caller's there is planted)."""
    if uid == 0 or (uid == os.getuid() and not paths.is_system):
        return
    if uid == _service_uid(paths):
        return
    trusted = "root or system.service_user" if paths.is_system else "you or root"
    raise PermissionDenied(
        f"refusing to talk to the gpusched daemon: {what} belongs to "
        f"{_owner_name(uid)}, not to {trusted}; another user may be "
        "impersonating the daemon. Remove it, or set GPUSCHED_SOCKET to the "
        "real daemon's socket."
    )


def check_socket_path(paths: Paths) -> None:
    """Before connecting: a real socket, in a directory only trusted users can change.

    A missing socket raises FileNotFoundError, as connecting would.
    """
    path = paths.socket
    info = os.lstat(path)
    if not stat.S_ISSOCK(info.st_mode):
        raise PermissionDenied(
            f"refusing to talk to the gpusched daemon: {path} is not a socket "
            "(a link or a file); remove it."
        )
    require_trusted(info.st_uid, f"its socket {path}", paths)
    directory = os.path.dirname(path)
    parent = os.lstat(directory)
    require_trusted(parent.st_uid, f"the socket's directory {directory}", paths)
    if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX:
        raise PermissionDenied(
            f"refusing to talk to the gpusched daemon: {directory} can be "
            "written by others, so its socket could be replaced; make it 0755 "
            "or 0700."
        )


def check_peer(sock: object, paths: Paths) -> None:
    """After connecting, before sending: the process listening is a trusted uid's (the kernel
    says so, which no race between the path check and connect can fake)."""
    require_trusted(wire.peer_credentials(sock)[1], "the process listening on its socket", paths)
