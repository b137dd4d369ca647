"""Shared fixtures: a real gpusched home in a temporary directory, driven through the real CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from filelock import FileLock

from gpusched.proc import runfile
from gpusched.proc.seam import ProcessSeam
from processes import home_processes, is_gone, kill_all, with_descendants

# Byte-code caching on, whatever the shell says: the suite starts thousands of Python
# processes (CLIs, daemons, shims), and under PYTHONDONTWRITEBYTECODE each one compiled
# gpusched from source, and every pytest worker rewrote every test module's asserts anew.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Fixtures shared by many test modules, found by pytest without an import in each.
pytest_plugins = ["tiers", "inproc", "systemroot", "queue_damage", "slurmnode"]

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 60.0
# The console script `pip install` made beside this interpreter: what users type.
CONSOLE_SCRIPT = Path(sys.executable).parent / "gpusched"
# Generous: a loaded 2-core CI machine is slow, and the tests poll, never sleep.
DEFAULT_HOST_CONFIG = "[host]\ncpus = 64\n"


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    """Poll until predicate() is truthy and return its value, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def accounts(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """useradd, userdel, groupadd or groupdel, one at a time on this machine: the suite runs
    in several processes (pytest -n), and these tools give up when another holds
    /etc/passwd's lock for long."""
    with FileLock(os.path.join(tempfile.gettempdir(), "gpusched-tests-accounts.lock")):
        return subprocess.run(argv, check=check, capture_output=True, text=True)


def executable(path: Path, text: str, mode: int = 0o755) -> Path:
    """A file with `text` (a script, say) and `mode`, its directories made as needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def find_shim(jobs_root: Path, job_id: int) -> tuple[int, float] | None:
    """A job's shim as the daemon sees it: (pid, start time) from its run file's "shim"
    record, the start time 0.0 once that process is gone; None before the record exists."""
    recorded = runfile.read_run(jobs_root, job_id).shim
    return ProcessSeam().identify_shim(*recorded) if recorded else None


class Home:
    """One isolated gpusched instance: its own GPUSCHED_HOME, config and daemon."""

    def __init__(self, path: Path, simulate: str = "4x80GiB"):
        self.path = path
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCHED_", "XDG_"))}
        self.env.update(
            {
                "GPUSCHED_HOME": str(path),
                "GPUSCHED_SIMULATE": simulate,
                "PYTHONPATH": str(REPO),
                "NO_COLOR": "1",
                "COLUMNS": "200",
            }
        )

    @property
    def state(self) -> Path:
        return self.path / "state"

    def run(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = DEADLINE_S,
        cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "gpusched", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
            cwd=cwd or self.path,
            env={**self.env, **(env or {})},
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"gpusched {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def user_env(self, path: str = "/usr/bin:/bin", **extra: str) -> dict[str, str]:
        """All that a user's shell (or cron) hands gpusched: PATH, HOME and this home, and
        PYTHONPATH for the code under test; nothing of the test run's own environment."""
        return {
            "PATH": path,
            "HOME": str(self.path),
            "GPUSCHED_HOME": str(self.path),
            "GPUSCHED_SIMULATE": self.env["GPUSCHED_SIMULATE"],
            "PYTHONPATH": str(REPO),
            **extra,
        }

    def script(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        check: bool = True,
        timeout: float = DEADLINE_S,
    ) -> subprocess.CompletedProcess:
        """`gpusched ARGS` as a user runs it: the installed console script, with exactly
        `env` (default: user_env()), from `cwd` (default: the home)."""
        assert CONSOLE_SCRIPT.exists(), f"no {CONSOLE_SCRIPT}: pip install this checkout first"
        proc = subprocess.run(
            [str(CONSOLE_SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.path,
            env=self.user_env() if env is None else env,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"gpusched {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json(self, command: str, *args: str, input: str | None = None) -> Any:
        """A command's --json output (the flag goes first: submit's command ends the options)."""
        return json.loads(self.run(command, "--json", *args, input=input).stdout)

    def submit(self, *args: str) -> int:
        return self.json("submit", *args)["id"]

    def show(self, job_id: int) -> dict:
        return self.json("show", str(job_id))

    def jobs(self) -> list[dict]:
        return self.json("ls", "--all")

    def wait_state(self, job_id: int, *states: str, timeout: float = DEADLINE_S) -> dict:
        return wait_until(
            lambda: (j := self.show(job_id))["state"] in states and j,
            f"job {job_id} to reach {states}",
            timeout,
        )

    def write_config(self, text: str = "") -> None:
        """The home's config file. Unless the test sets [host] itself, jobs are not limited
        by the test machine's few cores (a 2-core CI box would otherwise run two at once)."""
        self.path.mkdir(parents=True, exist_ok=True)
        if "[host]" not in text:
            text = f"{text}\n{DEFAULT_HOST_CONFIG}"
        (self.path / "gpusched.toml").write_text(text)

    def daemon_pid(self) -> int | None:
        proc = self.run("daemon", "status", "--json", check=False)
        return json.loads(proc.stdout).get("pid") if proc.returncode == 0 else None

    def start(self) -> int:
        """`gpusched daemon start`, and the pid it prints."""
        said = self.run("daemon", "start").stdout
        pid = re.search(r"\(pid (\d+)\)", said)
        assert pid, said
        return int(pid.group(1))

    def kill_daemon(self) -> None:
        """SIGKILL, as a crash would: jobs keep running."""
        pid = self.daemon_pid()
        assert pid
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: is_gone(pid), "the daemon to die")

    def processes(self) -> list[psutil.Process]:
        """Every process of this home: the daemon, shims, and the jobs under them."""
        return home_processes(str(self.path))

    def cleanup(self) -> None:
        # SIGKILL, not `daemon stop`: the test is over, and a graceful stop costs a CLI and
        # the daemon's shut-down. The tree is gathered first: once the daemon is gone, the
        # shims and jobs it started are no longer below anything of this home's. A second
        # sweep takes what was started in between.
        kill_all(with_descendants(self.processes()))
        kill_all(with_descendants(self.processes()))


@pytest.fixture
def home(tmp_path: Path):
    """A gpusched home on 4 simulated 80 GiB GPUs; everything it started is killed after."""
    h = Home(tmp_path / "home")
    h.write_config()
    yield h
    h.cleanup()


@pytest.fixture
def make_home(tmp_path: Path):
    """Build homes with other simulated GPUs: make_home("1x80GiB")."""
    homes: list[Home] = []

    def make(simulate: str = "4x80GiB", name: str = "") -> Home:
        h = Home(tmp_path / (name or f"home{len(homes)}"), simulate)
        h.write_config()
        homes.append(h)
        return h

    yield make
    for h in homes:
        h.cleanup()
