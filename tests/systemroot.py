"""System mode's fixtures: real users made with useradd, and root daemons in fresh roots
they can traverse (the *_system.py tests share them through conftest.py)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import DEADLINE_S, REPO, accounts, is_gone, kill_all, wait_until, with_descendants

TOOLS = ("useradd", "userdel", "groupadd", "groupdel", "setpriv")
pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(os.geteuid() != 0, reason="system mode tests create users: run as root"),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in TOOLS),
        reason=f"needs {', '.join(TOOLS)} (util-linux, shadow-utils)",
    ),
]


class User:
    def __init__(self, name: str):
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.home = name, entry.pw_uid, entry.pw_gid, entry.pw_dir

    @property
    def groups(self) -> list[int]:
        return sorted(set(os.getgrouplist(self.name, self.gid)))


@pytest.fixture(scope="module")
def users():
    """Two fresh users: A is also in an extra group, so supplementary groups show."""
    tag = uuid.uuid4().hex[:6]
    group, names = f"gpsg{tag}", (f"gpsa{tag}", f"gpsb{tag}")
    accounts("groupadd", group)
    try:
        accounts("useradd", "-m", "-G", group, names[0])
        accounts("useradd", "-m", names[1])
        alice = User(names[0])
        alice.extra_group = group
        yield alice, User(names[1])
    finally:
        for name in names:
            accounts("userdel", "-r", name, check=False)
        accounts("groupdel", group, check=False)


def _python_for_users() -> tuple[str, str]:
    """An interpreter that other users may run (this one may sit under /root), and its
    PYTHONPATH: the repository, then this environment's packages."""
    path = f"{REPO}:{sysconfig.get_paths()['purelib']}"
    system_python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or ""
    for python in (sys.executable, system_python):
        if python and _runs_as_nobody(python, path):
            return python, path
    pytest.skip("no Python interpreter that an ordinary user may run imports gpusched here")


def _runs_as_nobody(python: str, path: str) -> bool:
    # Through `env`: setpriv's own exec may still resolve the path with root's rights.
    probe = subprocess.run(
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
    )
    return probe.returncode == 0


class SystemRoot:
    """A system-mode daemon whose /etc, /var and /run live under a temporary directory."""

    def __init__(self, path: Path, simulate: str = "4x80GiB"):
        self.path = path
        self.python, self.pythonpath = _python_for_users()
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "GPUSCHED_SYSTEM_ROOT": str(path),
            "PYTHONPATH": self.pythonpath,
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }
        self.daemon_env = {**self.env, "GPUSCHED_SIMULATE": simulate}
        self.daemon_pid = 0

    @property
    def socket(self) -> Path:
        return self.path / "run/gpusched/gpusched.sock"

    @property
    def audit_log(self) -> Path:
        return self.path / "var/lib/gpusched/audit.log"

    def start(self) -> int:
        """Start it detached, as systemd would: not our child, so `daemon stop` sees it go."""
        log = self.path / "daemon.out"
        subprocess.run(
            [
                "sh",
                "-c",
                '"$0" -m gpusched daemon run --system >>"$1" 2>&1 &',
                sys.executable,
                str(log),
            ],
            env=self.daemon_env,
            check=True,
            cwd="/",
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        self.daemon_pid = wait_until(self._status_pid, "the system daemon to answer")
        return self.daemon_pid

    def _status_pid(self) -> int | None:
        """The system daemon's pid once it answers. Until its socket exists, root's
        commands go to root's own user daemon, if one runs on this machine: that one's
        answer must not count, or the test's users would go to daemons of their own."""
        proc = self.run_as(None, "daemon", "status", "--json", check=False)
        if proc.returncode != 0:
            return None
        status = json.loads(proc.stdout)
        return status["pid"] if status["daemon"] == "system" else None

    def wait_gone(self) -> None:
        pid = self.daemon_pid
        wait_until(lambda: is_gone(pid), "the daemon to exit")

    def kill(self) -> None:
        os.kill(self.daemon_pid, signal.SIGKILL)
        self.wait_gone()

    def run_as(
        self,
        user: User | None,
        *args: str,
        check: bool = True,
        extra_env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess:
        """`gpusched ARGS` as USER (None: root). extra_env is applied by `env` after the
        switch, so that nothing of it (LD_PRELOAD...) reaches a root process."""
        command = [
            *(f"{k}={v}" for k, v in (extra_env or {}).items()),
            self.python,
            "-m",
            "gpusched",
            *args,
        ]
        command = ["env", *command]
        env = dict(self.env)
        if user is not None:
            command = [
                "setpriv",
                f"--reuid={user.uid}",
                f"--regid={user.gid}",
                "--init-groups",
                *command,
            ]
            env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd or (user.home if user else "/"),
            timeout=DEADLINE_S,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"gpusched {' '.join(args)} as {user and user.name} exited "
                f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json_as(self, user: User | None, command: str, *args: str, **kw) -> object:
        return json.loads(self.run_as(user, command, "--json", *args, **kw).stdout)

    def submit(self, user: User, *args: str, **kw) -> int:
        return self.json_as(user, "submit", *args, **kw)["id"]

    def show(self, job_id: int) -> dict:
        return self.json_as(None, "show", str(job_id))

    def wait_state(self, job_id: int, *states: str) -> dict:
        return wait_until(
            lambda: (j := self.show(job_id))["state"] in states and j,
            f"job {job_id} to reach {states}",
        )

    def audit(self) -> list[dict]:
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines()]

    def cleanup(self) -> None:
        """Every daemon of this root (started with its GPUSCHED_SYSTEM_ROOT), its launcher,
        shims and jobs, and any process still running from a path inside it."""
        mine = []
        for proc in psutil.process_iter(["cmdline", "environ"]):
            env = proc.info["environ"] or {}
            if env.get("GPUSCHED_SYSTEM_ROOT") == str(self.path) or any(
                str(self.path) in part for part in proc.info["cmdline"] or ()
            ):
                mine.append(proc)
        kill_all(with_descendants(mine))
        shutil.rmtree(self.path, ignore_errors=True)


@pytest.fixture
def make_system(users):
    """Start system daemons, each in a fresh root that the test users can traverse, with
    an optional /etc/gpusched/gpusched.toml."""
    _python_for_users()  # skips before anything is made
    roots: list[SystemRoot] = []

    def make(config: str = "") -> SystemRoot:
        # Not under pytest's tmp_path: its parents are 0700 root, which users cannot pass.
        root = SystemRoot(Path(tempfile.mkdtemp(prefix="gpss-", dir="/tmp")))
        roots.append(root)
        os.chmod(root.path, 0o755)
        if config:
            (root.path / "etc/gpusched").mkdir(parents=True)
            (root.path / "etc/gpusched/gpusched.toml").write_text(config)
        root.start()
        return root

    yield make
    for root in roots:
        root.cleanup()


@pytest.fixture
def system(make_system):
    return make_system()
