"""A gpusched home in a temporary directory, driven through the real console script, and
what each part of the reliability run needs around it: figures, polling, raw frames."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import _private_tmpdir, base_env, gpusched_script, remove_at_exit

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from processes import home_processes, is_gone, kill_all, with_descendants

DEADLINE_S = 60.0
HOST_CONFIG = "[host]\ncpus = 64\n"  # jobs never wait for this machine's few cores
# How the CLI says that the daemon went away during a request: the request may or may
# not have been applied (as after any crash), unlike an answer that refused it.
CONNECTION_LOST = (
    "lost the connection",
    "closed the connection without an answer",
    "no gpusched daemon",
    "not running",
    "did not answer",
    "could not start",
)


@dataclass
class Figures:
    """One part's figures: `counts` are failures (0 when all is well), `info` is context."""

    title: str
    counts: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: str = ""

    def fail(self, key: str, note: str = "", by: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + by
        # The first few of each kind say what failed; the count says how often.
        if note and sum(n.startswith(f"{key}: ") for n in self.notes) < 3:
            self.notes.append(f"{key}: {note}")

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "failures": self.counts,
            "info": self.info,
            "notes": self.notes,
            "skipped": self.skipped or None,
        }


def poll(predicate: Callable[[], Any], timeout_s: float = DEADLINE_S) -> Any:
    """predicate()'s first truthy value, or None after timeout_s (the caller counts it)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


class Home:
    """One isolated user-mode gpusched: GPUSCHED_HOME in a temporary directory."""

    def __init__(self, tag: str, simulate: str = "4x80GiB", config: str = ""):
        self.path = _private_tmpdir(f"gs-rel-{tag}-")
        (self.path / "gpusched.toml").write_text(config + "\n" + HOST_CONFIG)
        self.env = base_env()
        self.env.update(
            GPUSCHED_HOME=str(self.path), GPUSCHED_SIMULATE=simulate, NO_COLOR="1", COLUMNS="200"
        )

    @property
    def state(self) -> Path:
        return self.path / "state"

    @property
    def db(self) -> Path:
        return self.state / "queue.db"

    @property
    def log(self) -> Path:
        return self.state / "daemon.log"

    def cli(
        self,
        *args: str,
        timeout_s: float = DEADLINE_S,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """`gpusched ARGS` as a user types it; a hung command counts as exit status 124."""
        try:
            return subprocess.run(
                [gpusched_script(), *args],
                capture_output=True,
                text=True,
                env={**self.env, **(env or {})},
                cwd=cwd or str(self.path),
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, "", "timed out")

    def json(self, *args: str, timeout_s: float = DEADLINE_S) -> Any:
        proc = self.cli(*args, timeout_s=timeout_s)
        if proc.returncode != 0:
            return None
        try:
            return json.loads(proc.stdout)
        except ValueError:
            return None

    def jobs(self) -> list[dict] | None:
        """Every job, finished ones too (None when the listing fails)."""
        return self.json("ls", "--all", "--json")

    def daemon_pid(self) -> int | None:
        status = self.json("daemon", "status", "--json", timeout_s=20)
        return status.get("pid") if status else None

    def start(self) -> int | None:
        self.cli("daemon", "start")
        return self.daemon_pid()

    def kill_daemon(self) -> bool:
        """SIGKILL, as a crash would; whether there was a daemon to kill."""
        pid = self.daemon_pid()
        if not pid:
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        poll(lambda: is_gone(pid), 20)
        return True

    def tracebacks(self) -> int:
        """Exceptions the daemon logged (a request it failed on, a crash)."""
        try:
            return self.log.read_text(errors="replace").count("Traceback")
        except OSError:
            return 0

    def processes(self) -> list[psutil.Process]:
        """Every process of this home: the daemon, its launcher, shims and jobs."""
        return home_processes(str(self.path))

    def close(self) -> None:
        """Stop the daemon and every process of this home; its files go at exit."""
        procs = with_descendants(self.processes())
        if procs:  # gathered first: once the daemon is gone, its shims are below nothing of ours
            self.cli("daemon", "stop", timeout_s=40)
            kill_all(procs + with_descendants(self.processes()))
        remove_at_exit(self.path)


def lost_connection(proc: subprocess.CompletedProcess) -> bool:
    """Whether a failed command failed because the daemon went away, not by its answer."""
    return proc.returncode == 124 or any(s in proc.stderr for s in CONNECTION_LOST)


def raw_request(path: str, frame: bytes, timeout_s: float = 5.0) -> dict | str | None:
    """Send FRAME (header and all) as is; the reply, None for no reply, "closed" when
    the daemon closed without one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        try:
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)
            header = _read(sock, 4)
            if len(header) < 4:
                return "closed"
            (size,) = struct.unpack(">I", header)
            return json.loads(_read(sock, size))
        except TimeoutError:
            return None
        except (OSError, ValueError):
            return "closed"


def _read(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def request(cmd: str, **args: Any) -> bytes:
    return frame(json.dumps({"cmd": cmd, "args": args}).encode())


def python_for_others() -> tuple[str, str] | None:
    """(an interpreter any user may run, the PYTHONPATH that finds this gpusched and its
    packages with it), or None: this one may sit under /root, which others cannot enter."""
    import shutil
    import sysconfig

    import gpusched  # the checkout the console script imports: PYTHONPATH or the venv's

    repo = str(Path(gpusched.__file__).resolve().parent.parent)
    path = f"{repo}:{sysconfig.get_paths()['purelib']}"
    for python in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        if (
            python
            and subprocess.run(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "env",
                    python,
                    "-c",
                    "import gpusched.cli.app, psutil",
                ],
                env={"PYTHONPATH": path, "PATH": os.defpath},
                capture_output=True,
                cwd="/",
            ).returncode
            == 0
        ):
            return python, path
    return None
