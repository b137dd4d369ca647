"""Where gpusched keeps its queue, logs, socket and config.

Every CLI call, `submit` above all, resolves these before anything else, so this module
imports little beyond `os`: pathlib and typing alone would add about 15 ms
to each call (see bench/bench_submit.py). The paths are plain strings; code that wants
Path objects wraps them.
"""

from __future__ import annotations

import os
import stat

from gpusched.core.errors import ConfigError
from gpusched.core.record import Record

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, ClassVar

# Unix socket paths are limited to 108 bytes (sun_path); stay well under it.
_SOCKET_PATH_MAX = 100


class Paths(Record):
    """Where one gpusched instance keeps its state, socket and config (absolute strings).

    mode: "user" (one person's daemon), "system" (one root daemon for all users, see
    gpusched/client/modes.py) or "socket" (GPUSCHED_SOCKET named it: never auto-started).
    socket_file: the socket, when not the run directory's. log_root: in system mode, jobs'
    logs go to LOG_ROOT/USER/, owned by the user (None: the job's directory).
    """

    __slots__ = ("state_dir", "run_dir", "config_file", "mode", "socket_file", "log_root")
    _defaults: ClassVar[dict[str, Any]] = {"mode": "user", "socket_file": None, "log_root": None}
    # The fields, for type checkers (a bare annotation makes no class attribute).
    state_dir: str
    run_dir: str
    config_file: str
    mode: str
    socket_file: str | None
    log_root: str | None

    @property
    def is_system(self) -> bool:
        return self.mode == "system"

    @property
    def socket(self) -> str:
        return self.socket_file or os.path.join(self.run_dir, "gpusched.sock")

    @property
    def wake_socket(self) -> str:
        """A datagram socket on which a job's shim wakes the daemon when the job ends."""
        return os.path.join(self.run_dir, "wake.sock")

    @property
    def audit_log(self) -> str:
        """Every refused request: who asked (uid, pid), what, and for which job."""
        return os.path.join(self.state_dir, "audit.log")

    @property
    def db(self) -> str:
        return os.path.join(self.state_dir, "queue.db")

    @property
    def lock(self) -> str:
        return os.path.join(self.state_dir, "daemon.lock")

    @property
    def jobs_dir(self) -> str:
        return os.path.join(self.state_dir, "jobs")

    @property
    def sim_processes(self) -> str:
        """Outside processes on simulated GPUs, declared by hand or by tests."""
        return os.path.join(self.state_dir, "simulated_processes.toml")

    @property
    def notify_log(self) -> str:
        """One line per notification hook run or webhook post, and how it went."""
        return os.path.join(self.state_dir, "notify.log")

    @property
    def daemon_log(self) -> str:
        return os.path.join(self.state_dir, "daemon.log")

    @property
    def mps_pipe_dir(self) -> str:
        """gpusched's own NVIDIA MPS control daemon's sockets (memory.mps), beside its own."""
        return os.path.join(self.run_dir, "mps")

    @property
    def mps_log_dir(self) -> str:
        return os.path.join(self.state_dir, "mps-log")


def absolute(path: str) -> str:
    """PATH with ~ expanded, made absolute (not resolving links), as Path.absolute() would."""
    return os.path.abspath(os.path.expanduser(path))


def resolve_paths(environ: Mapping[str, str] | None = None) -> Paths:
    """Where state, socket and config live: GPUSCHED_HOME, else the XDG directories (the
    socket always in the state directory's run/, beside the daemon's lock)."""
    env = os.environ if environ is None else environ
    home = env.get("GPUSCHED_HOME")
    join = os.path.join
    if home:
        root = absolute(home)
        if os.path.exists(root) and not os.path.isdir(root):
            # Else every command fails deep inside, on a path below it.
            raise ConfigError(
                f"GPUSCHED_HOME={home} is not a directory; point it at a "
                "directory (it is created if missing)."
            )
        state, run, config = join(root, "state"), join(root, "run"), join(root, "gpusched.toml")
    else:
        user_home = env.get("HOME") or os.path.expanduser("~")
        state = join(env.get("XDG_STATE_HOME") or join(user_home, ".local/state"), "gpusched")
        config = join(
            env.get("XDG_CONFIG_HOME") or join(user_home, ".config"), "gpusched/gpusched.toml"
        )
        # The socket follows the state directory (and so its lock), never XDG_RUNTIME_DIR:
        # cron, sudo -u and a login shell differ in that variable, and one user's queue has
        # one daemon, whichever of them asks first.
        run = join(state, "run")
    if env.get("GPUSCHED_CONFIG"):
        config = absolute(env["GPUSCHED_CONFIG"])
    if len(join(run, "gpusched.sock")) > _SOCKET_PATH_MAX:
        # A deep home would overflow sun_path: use a short private directory that the
        # client derives the same way from the same state directory.
        import hashlib  # noqa: PLC0415 - 3 ms of every command, which imports this module

        digest = hashlib.sha256(state.encode()).hexdigest()[:16]
        run = f"/tmp/gpusched-{os.getuid()}-{digest}"
    return Paths(state_dir=state, run_dir=run, config_file=config)


def ensure_private_dir(path: str) -> None:
    """Create a 0700 directory, or check that an existing one is ours and private."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"{path} is not a directory owned by you; remove it and try again.")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
