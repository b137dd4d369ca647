"""A running daemon started with other GPUs or another config than the caller's: say so.

The daemon reads GPUSCHED_SIMULATE and its config file once, when it starts. It puts a
fingerprint of both in every reply; the client compares it with its own environment and
the config file as it is now, and warns once per command. Every CLI call imports this
module (submit too): it imports only os, and hashes the config only when its size or
modification time changed.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpusched.client.paths import Paths

SIMULATE_ENV = "GPUSCHED_SIMULATE"


def config_stamp(path: str) -> dict[str, Any]:
    """The config file as it is now: its path, size and time, and a hash of its bytes."""
    try:
        with open(path, "rb") as fh:
            info = os.fstat(fh.fileno())
            data = fh.read()
    except OSError:
        return {"path": path, "stat": None, "sha256": ""}
    return {"path": path, "stat": [info.st_mtime_ns, info.st_size], "sha256": _sha256(data)}


def _sha256(data: bytes) -> str:
    import hashlib  # noqa: PLC0415 - 3 ms of every command; only when a config file is hashed

    return hashlib.sha256(data).hexdigest()


def fingerprint(
    config: dict[str, Any], simulate: str, simulate_configured: str, environ: Mapping[str, str]
) -> dict[str, Any]:
    """What a daemon tells its clients about how it was started: the config file's stamp
    from before it read the file, the simulated GPUs in use ("" for real ones), those the
    config file asks for, and GPUSCHED_SIMULATE as it found it."""
    return {
        "config": config,
        "simulate": simulate,
        "simulate_configured": simulate_configured,
        "simulate_env": environ.get(SIMULATE_ENV, ""),
    }


def _config_changed(stamp: dict[str, Any]) -> bool:
    try:
        info = os.stat(stamp["path"])
    except OSError:
        return stamp["stat"] is not None  # removed since (or never there: unchanged)
    if stamp["stat"] == [info.st_mtime_ns, info.st_size]:
        return False
    now: str = config_stamp(stamp["path"])["sha256"]
    then: str = stamp["sha256"]
    return now != then  # touched, or changed


def _gpus_text(simulate: str) -> str:
    return f"simulated GPUs {simulate}" if simulate else "the real GPUs"


def differences(daemon: dict[str, Any], paths: Paths, environ: Mapping[str, str]) -> list[str]:
    """How the running daemon differs from what a daemon started now would use."""
    found = []
    config = daemon["config"]
    if paths.mode == "user":  # only a user's own daemon is started with their environment
        here = environ.get(SIMULATE_ENV, "")
        if (here or daemon["simulate_configured"]) != daemon["simulate"]:
            asked = f"{SIMULATE_ENV}={here}" if here else f"{SIMULATE_ENV} is not set"
            found.append(
                f"the running daemon uses {_gpus_text(daemon['simulate'])} but {asked} here"
            )
        if paths.config_file != config["path"]:
            found.append(
                f"the running daemon read the config file {config['path']} but here "
                f"it is {paths.config_file}"
            )
            return found
    if _config_changed(config):
        found.append(f"the config file {config['path']} changed since the daemon started")
    return found


def warning(daemon: Any, paths: Paths, environ: Mapping[str, str]) -> str | None:
    """The one line to print, with the fix; None when the daemon is as the caller would
    start it (or did not say how it was started)."""
    if not isinstance(daemon, dict) or paths.mode == "socket":
        return None
    try:
        found = differences(daemon, paths, environ)
    except (KeyError, TypeError):  # a daemon of another version: nothing to compare
        return None
    if not found:
        return None
    it = "it" if len(found) == 1 else "them"
    fix = (
        f"run `gpusched daemon restart` to apply {it}"
        if paths.mode == "user"
        else f"`systemctl restart gpusched` (as root) applies {it}"
    )
    return f"gpusched: warning: {', and '.join(found)}; {fix} (running jobs keep running)"
