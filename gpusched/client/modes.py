"""Which daemon a command means: the system one (all users, run by root) or the user's own."""

from __future__ import annotations

import os
import stat

from gpusched.client.paths import Paths, absolute, resolve_paths
from gpusched.core.errors import ConfigError

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Mapping

# Moves the whole system layout (/etc, /var, /run) under another directory, for tests.
SYSTEM_ROOT_ENV = "GPUSCHED_SYSTEM_ROOT"


def system_paths(environ: Mapping[str, str] | None = None) -> Paths:
    """/var/lib/gpusched, /run/gpusched, /etc/gpusched/gpusched.toml, /var/log/gpusched."""
    env = os.environ if environ is None else environ
    root = absolute(env.get(SYSTEM_ROOT_ENV) or "/")
    join = os.path.join
    return Paths(
        state_dir=join(root, "var/lib/gpusched"),
        run_dir=join(root, "run/gpusched"),
        config_file=join(root, "etc/gpusched/gpusched.toml"),
        mode="system",
        log_root=join(root, "var/log/gpusched"),
    )


def client_paths(environ: Mapping[str, str] | None = None) -> Paths:
    """GPUSCHED_SOCKET, else GPUSCHED_HOME's daemon, else the system daemon if its socket
    exists, else the user's own daemon (started on demand)."""
    env = os.environ if environ is None else environ
    if env.get("GPUSCHED_SOCKET"):
        named: Paths = resolve_paths(env)._replace(
            mode="socket", socket_file=absolute(env["GPUSCHED_SOCKET"])
        )
        return named
    if not env.get("GPUSCHED_HOME"):
        system = system_paths(env)
        if os.path.lexists(system.socket):
            return system
    return resolve_paths(env)


def daemon_paths(system: bool, user: bool, environ: Mapping[str, str] | None = None) -> Paths:
    """For `daemon run`: --system, --user, else system mode when root runs it and the
    system config says `mode = "system"` (and no GPUSCHED_HOME asks for a private one)."""
    env = os.environ if environ is None else environ
    if system:
        return system_paths(env)
    if not user and os.geteuid() == 0 and not env.get("GPUSCHED_HOME"):
        candidate = system_paths(env)
        # config: 70 ms (dataclasses, the config's modules) of every command; only to start one
        from gpusched.core.config import load_settings  # noqa: PLC0415

        if load_settings(candidate.config_file, {}).mode == "system":
            return candidate
    return resolve_paths(env)


def ensure_public_dir(path: str) -> None:
    """Create a 0755 directory owned by us (the system socket's and logs' parents), or
    check an existing one: only its owner may add or replace what is in it."""
    os.makedirs(path, mode=0o755, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ConfigError(
            f"{path} is not a directory owned by uid {os.geteuid()}; remove it "
            "and start the daemon again."
        )
    if stat.S_IMODE(info.st_mode) != 0o755:
        os.chmod(path, 0o755)
