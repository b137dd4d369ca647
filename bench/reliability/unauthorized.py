"""Other users' jobs in system mode: one root daemon, two users made with useradd; every
attempt on a job or a daemon that is not the user's own must fail."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psutil
from filelock import FileLock

from gpusched.core.models import HIDDEN
from reliability.harness import Figures, kill_all, poll, python_for_others, with_descendants

TOOLS = ("useradd", "userdel", "setpriv")
# The test suite's lock: useradd and userdel give up when another holds /etc/passwd long.
ACCOUNTS_LOCK = os.path.join(tempfile.gettempdir(), "gpusched-tests-accounts.lock")
PRIVATE = ("cwd", "stdout_path", "stderr_path", "submit_pid")


def accounts(*argv: str) -> None:
    with FileLock(ACCOUNTS_LOCK):
        subprocess.run(argv, capture_output=True, check=False)


@contextmanager
def two_users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    tag = uuid.uuid4().hex[:6]
    names = (f"gpra{tag}", f"gprb{tag}")
    try:
        for name in names:
            accounts("useradd", "-m", name)
        yield pwd.getpwnam(names[0]), pwd.getpwnam(names[1])
    finally:
        for name in names:
            accounts("userdel", "-r", name)


class System:
    """A system-mode daemon whose /etc, /var and /run live in a temporary directory."""

    def __init__(self, python: str, pythonpath: str):
        self.root = Path(tempfile.mkdtemp(prefix="gprel-", dir="/tmp"))
        os.chmod(self.root, 0o755)  # the users must reach its socket
        self.python = python
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "GPUSCHED_SYSTEM_ROOT": str(self.root),
            "PYTHONPATH": pythonpath,
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }

    def start(self) -> bool:
        subprocess.run(
            [
                "sh",
                "-c",
                '"$0" -m gpusched daemon run --system >>"$1" 2>&1 &',
                self.python,
                str(self.root / "daemon.out"),
            ],
            env={**self.env, "GPUSCHED_SIMULATE": "4x80GiB"},
            cwd="/",
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            check=True,
        )
        return bool(poll(lambda: self.as_user(None, "daemon", "status").returncode == 0, 60))

    def as_user(
        self, user: pwd.struct_passwd | None, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        command = [
            "env",
            *(f"{k}={v}" for k, v in (env or {}).items()),
            self.python,
            "-m",
            "gpusched",
            *args,
        ]
        run_env = dict(self.env)
        if user is not None:
            command = [
                "setpriv",
                f"--reuid={user.pw_uid}",
                f"--regid={user.pw_gid}",
                "--init-groups",
                *command,
            ]
            run_env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
        try:
            return subprocess.run(
                command,
                capture_output=True,
                text=True,
                env=run_env,
                cwd=user.pw_dir if user else "/",
                timeout=60,
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, "", "timed out")

    def close(self) -> None:
        mine = []
        for proc in psutil.process_iter(["cmdline", "environ"]):
            env = proc.info["environ"] or {}
            if env.get("GPUSCHED_SYSTEM_ROOT") == str(self.root) or any(
                str(self.root) in part for part in proc.info["cmdline"] or ()
            ):
                mine.append(proc)
        kill_all(with_descendants(mine))
        shutil.rmtree(self.root, ignore_errors=True)


def _alice_jobs(system: System, alice: pwd.struct_passwd) -> dict[str, str]:
    """Her jobs to aim at: running, held, an array and one of its elements."""
    secret_dir = Path(alice.pw_dir) / "secret-project"
    subprocess.run(
        [
            "setpriv",
            f"--reuid={alice.pw_uid}",
            f"--regid={alice.pw_gid}",
            "--init-groups",
            "mkdir",
            "-p",
            str(secret_dir),
        ],
        check=True,
    )

    def submit(*args: str) -> str:
        out = system.as_user(
            alice,
            "submit",
            "--name",
            "alice-secret-name",
            "--cwd",
            str(secret_dir),
            *args,
            env={"SECRET": "s3cr3t"},
        )
        return out.stdout.split()[0] if out.returncode == 0 else ""

    running = submit("--", "sh", "-c", "echo s3cr3t; sleep 300")
    held = submit("--hold", "--", "true")
    array = submit("--hold", "--array", "0-1", "--", "true")
    targets = {"running": running, "held": held, "array": array, "element": f"{array}_1"}
    return {k: v for k, v in targets.items() if v and not v.startswith("_")}


def _leaks(shown: str) -> bool:
    """Whether show/ls output tells another user what only the owner may see."""
    try:
        jobs = json.loads(shown)
    except ValueError:
        return False
    jobs = jobs if isinstance(jobs, list) else [jobs]
    # A hidden field reads HIDDEN (or null): it says nothing.
    return any(
        any(job.get(key) not in (None, "", HIDDEN) for key in PRIVATE)
        or job.get("name") == "alice-secret-name"
        or "s3cr3t" in json.dumps(job.get("command"))
        for job in jobs
    )


def _attempts(
    system: System, alice: pwd.struct_passwd, bob: pwd.struct_passwd, fig: Figures
) -> None:
    targets = _alice_jobs(system, alice)
    if "running" in targets:
        poll(
            lambda: (
                '"running"' in system.as_user(None, "show", "--json", targets["running"]).stdout
            ),
            30,
        )
    tries = [
        (f"{args[0]} {what}", args, False)
        for what, job in targets.items()
        for args in (
            ("cancel", job),
            ("hold", job),
            ("release", job),
            ("update", job, "--priority", "5"),
            ("logs", job),
            ("logs", "--stderr", job),
            ("env", job),
            ("resubmit", job),
        )
    ]
    tries += [(f"show {what}", ("show", "--json", job), True) for what, job in targets.items()]
    tries += [
        ("ls --all", ("ls", "--all", "--json"), True),
        ("drain", ("drain",), False),
        ("resume", ("resume",), False),
    ]

    def attempt(name: str, args: tuple[str, ...], reads: bool) -> None:
        done = system.as_user(bob, *args)
        _count(fig, name, done.returncode == 0 and (not reads or _leaks(done.stdout)))

    # Each is a fresh interpreter as another user: side by side, they take a few seconds.
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda t: attempt(*t), tries))
    system.as_user(bob, "daemon", "stop")
    _count(fig, "daemon stop", system.as_user(None, "daemon", "status").returncode != 0)


def _user_daemon_attempts(
    system: System, alice: pwd.struct_passwd, bob: pwd.struct_passwd, fig: Figures
) -> None:
    """Bob pointing his CLI at Alice's own user-mode daemon."""
    # A system root with no daemon in it: the CLI then uses the user's own daemon.
    user_env = {
        "GPUSCHED_HOME": f"{alice.pw_dir}/gs",
        "GPUSCHED_SIMULATE": "2x80GiB",
        "GPUSCHED_SYSTEM_ROOT": str(system.root / "absent"),
    }
    system.as_user(alice, "daemon", "start", env=user_env)
    job = system.as_user(alice, "submit", "--hold", "--", "true", env=user_env).stdout.strip()
    for args in (("ls", "--all"), ("submit", "--", "true"), ("cancel", job or "1")):
        _count(
            fig,
            f"{args[0]} on alice's daemon",
            system.as_user(bob, *args, env=user_env).returncode == 0,
        )
    system.as_user(bob, "daemon", "stop", env=user_env)
    _count(
        fig,
        "daemon stop on alice's daemon",
        system.as_user(alice, "daemon", "status", env=user_env).returncode != 0,
    )
    system.as_user(alice, "daemon", "stop", env=user_env)


def _count(fig: Figures, name: str, succeeded: bool) -> None:
    fig.info["attempts"] = fig.info.get("attempts", 0) + 1
    if succeeded:
        fig.fail("successes", name)


@contextmanager
def system_and_two_users(
    fig: Figures,
) -> Iterator[tuple[System, pwd.struct_passwd, pwd.struct_passwd] | None]:
    """A started system daemon and two new users; None, with fig.skipped saying why, where
    this machine cannot have them."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS):
        fig.skipped = f"needs root and {', '.join(TOOLS)}"
        yield None
        return
    found = python_for_others()
    if found is None:
        fig.skipped = "no Python interpreter that an ordinary user may run imports gpusched"
        yield None
        return
    system = System(*found)
    try:
        with two_users() as (alice, bob):
            started = system.start()
            if not started:
                fig.skipped = "the system daemon did not start"
            yield (system, alice, bob) if started else None
    finally:
        system.close()


def measure() -> Figures:
    fig = Figures("unauthorized attempts (system mode)")
    fig.counts["successes"] = 0
    with system_and_two_users(fig) as found:
        if found is not None:
            _attempts(found[0], found[1], found[2], fig)
            _user_daemon_attempts(found[0], found[1], found[2], fig)
    return fig
