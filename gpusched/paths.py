"""Where gpusched keeps its queue, logs, socket and config (stdlib only, cheap to import)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from gpusched.errors import ConfigError

# Unix socket paths are limited to 108 bytes (sun_path); stay well under it.
_SOCKET_PATH_MAX = 100


class Paths(NamedTuple):
    """Where one gpusched instance keeps its state, socket and config.

    A NamedTuple rather than a dataclass: every CLI call builds one, and the dataclass
    machinery alone costs it about 10 ms of start-up.
    """

    state_dir: Path
    run_dir: Path
    config_file: Path
    # "user" (one person's daemon), "system" (one root daemon for all users, see
    # gpusched/modes.py) or "socket" (GPUSCHED_SOCKET named it: never auto-started).
    mode: str = "user"
    socket_file: Path | None = None
    # System mode: jobs' logs go to LOG_ROOT/USER/, owned by the user (None: the job dir).
    log_root: Path | None = None

    @property
    def is_system(self) -> bool:
        return self.mode == "system"

    @property
    def socket(self) -> Path:
        return self.socket_file or self.run_dir / "gpusched.sock"

    @property
    def wake_socket(self) -> Path:
        """A datagram socket on which a job's shim wakes the daemon when the job ends."""
        return self.run_dir / "wake.sock"

    @property
    def audit_log(self) -> Path:
        """Every refused request: who asked (uid, pid), what, and for which job."""
        return self.state_dir / "audit.log"

    @property
    def db(self) -> Path:
        return self.state_dir / "queue.db"

    @property
    def lock(self) -> Path:
        return self.state_dir / "daemon.lock"

    @property
    def jobs_dir(self) -> Path:
        return self.state_dir / "jobs"

    @property
    def sim_processes(self) -> Path:
        """Outside processes on simulated GPUs, declared by hand or by tests."""
        return self.state_dir / "simulated_processes.toml"

    @property
    def daemon_log(self) -> Path:
        return self.state_dir / "daemon.log"


def resolve_paths(environ: dict[str, str] | None = None) -> Paths:
    """Where state, socket and config live: GPUSCHED_HOME, else the XDG directories."""
    env = os.environ if environ is None else environ
    home = env.get("GPUSCHED_HOME")
    if home:
        root = Path(home).expanduser().absolute()
        state, run, config = root / "state", root / "run", root / "gpusched.toml"
    else:
        user_home = Path(env.get("HOME") or Path.home())
        state = Path(env.get("XDG_STATE_HOME") or user_home / ".local/state") / "gpusched"
        config = Path(env.get("XDG_CONFIG_HOME") or user_home / ".config") / "gpusched/gpusched.toml"
        runtime = env.get("XDG_RUNTIME_DIR")
        run = Path(runtime) / "gpusched" if runtime else state / "run"
    if env.get("GPUSCHED_CONFIG"):
        config = Path(env["GPUSCHED_CONFIG"]).expanduser().absolute()
    if len(str(run / "gpusched.sock")) > _SOCKET_PATH_MAX:
        # A deep home would overflow sun_path: use a short private directory that the
        # client derives the same way from the same state directory.
        import hashlib  # rarely needed, and every CLI call imports this module

        digest = hashlib.sha256(str(state).encode()).hexdigest()[:16]
        run = Path("/tmp") / f"gpusched-{os.getuid()}-{digest}"
    return Paths(state_dir=state, run_dir=run, config_file=config)


def ensure_private_dir(path: Path) -> None:
    """Create a 0700 directory, or check that an existing one is ours and private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if path.is_symlink() or info.st_uid != os.getuid():
        raise ConfigError(f"{path} is not a directory owned by you; remove it and try again.")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
