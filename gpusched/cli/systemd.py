"""systemd units for the daemon: the system one (root, all users) and a user's own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gpusched
from gpusched.core.errors import GpuschedError

# The unit's file name, and the name every printed systemctl command uses: one place.
UNIT = "gpusched"
UNIT_NAME = f"{UNIT}.service"
# Set when the unit is written, these choose which daemon it runs: the unit carries them.
CARRIED_ENV = ("GPUSCHED_HOME", "GPUSCHED_CONFIG", "GPUSCHED_SIMULATE")

_SYSTEM_UNIT = """\
[Unit]
Description=gpusched: GPU job scheduler for every user of this machine

[Service]
Type=simple
{environment}ExecStart={python} -m gpusched daemon run --system
# Jobs outlive the daemon (each runs under its own shim, in a session of its own): a stop
# or restart must end the daemon only. The next daemon re-adopts the running jobs.
KillMode=process
Restart=on-failure
RestartSec=2
UMask=0022
# Jobs inherit the service's limits and sandbox: no ProtectHome/ProtectSystem (jobs need
# their users' files), and limits fit for training jobs rather than for one daemon.
LimitNOFILE=1048576
LimitMEMLOCK=infinity
TasksMax=infinity

[Install]
WantedBy=multi-user.target
"""

_USER_UNIT = """\
[Unit]
Description=gpusched: your own GPU job scheduler

[Service]
Type=simple
{environment}ExecStart={python} -m gpusched daemon run --user
KillMode=process
Restart=on-failure
RestartSec=2

[Install]
WantedBy=default.target
"""


def unit_text(
    system: bool, python: str | None = None, environ: dict[str, str] | None = None
) -> str:
    python = python or sys.executable
    return (_SYSTEM_UNIT if system else _USER_UNIT).format(
        python=python, environment="".join(environment_lines(environ))
    )


def environment_lines(environ: dict[str, str] | None = None) -> list[str]:
    """`Environment=` lines for the CARRIED_ENV variables set now, quoted for systemd
    (a % is a specifier there, a backslash and a double quote are escapes)."""
    lines = []
    for key, value in carried(environ).items():
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        lines.append(f'Environment="{key}={value}"\n')
    return lines


def carried(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The CARRIED_ENV variables set now, paths made absolute (the unit runs from /)."""
    env = os.environ if environ is None else environ
    out = {key: env[key] for key in CARRIED_ENV if env.get(key)}
    for key in ("GPUSCHED_HOME", "GPUSCHED_CONFIG"):
        if key in out:
            out[key] = os.path.abspath(os.path.expanduser(out[key]))
    return out


def default_unit_dir(system: bool, environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if system:
        return Path("/etc/systemd/system")
    config = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(config) / "systemd/user"


def next_commands(system: bool) -> list[str]:
    if system:
        return ["systemctl daemon-reload", f"systemctl enable --now {UNIT}"]
    return [
        "systemctl --user daemon-reload",
        f"systemctl --user enable --now {UNIT}",
        "loginctl enable-linger $USER   # keep it (and your jobs' daemon) after logout",
    ]


def unsafe_code_paths() -> list[str]:
    """Code a root daemon would run that someone other than root could change."""
    candidates = [Path(os.path.realpath(sys.executable)), Path(gpusched.__file__).parent]
    unsafe = []
    for path in candidates:
        info = path.stat()
        if info.st_uid != 0 or info.st_mode & 0o022:
            unsafe.append(str(path))
    return unsafe


def install(system: bool, directory: Path | None = None) -> Path:
    """Write the unit file; returns its path. Refuses, for the system unit, code that a
    non-root user could change, since the daemon runs it as root."""
    if system:
        unsafe = unsafe_code_paths()
        if unsafe:
            raise GpuschedError(
                f"the system daemon would run as root code that others can "
                f"change: {', '.join(unsafe)}; install gpusched as root in a "
                "root-owned environment first."
            )
    target_dir = directory or default_unit_dir(system)
    path = target_dir / UNIT_NAME
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(unit_text(system))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise GpuschedError(
            f"cannot write {path}: {exc.strerror}{' (run it as root)' if system else ''}"
        ) from None
    return path
