"""Run one notification hook: an argv list (never a shell), its facts in the environment,
the event as JSON on stdin, in a session of its own that a timeout kills whole."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Callable

from gpusched.proc.privileges import identity_of

OUTPUT_KEPT_BYTES = 4096  # of the hook's output, for the notification log
ENV_VALUE_MAX_BYTES = 4096  # a job name or path beyond this is cut (env is not for content)


@dataclass(frozen=True)
class HookResult:
    outcome: str  # "exit 0", "exit 3", "timeout after 30 s", "cannot run: ..."
    output: str  # the last of what it printed

    @property
    def ok(self) -> bool:
        return self.outcome == "exit 0"


def clean_env(values: dict[str, str]) -> dict[str, str]:
    """Values as the kernel takes them: no NUL bytes (execve would refuse the whole
    environment), each cut to a bounded size."""
    return {key: value.replace("\0", "")[:ENV_VALUE_MAX_BYTES] for key, value in values.items()}


def run_hook(argv: tuple[str, ...], env: dict[str, str], stdin_bytes: bytes,
             timeout_s: float, as_uid: int | None = None, cwd: str = "/",
             running: Callable[[int, bool], None] = lambda pid, started: None) -> HookResult:
    """Run it and wait at most timeout_s; as_uid (a root daemon only): as that user, with
    that user's groups and nothing else of root's. running(pid, True/False) is told when
    it starts and ends, so that a stopping daemon can kill it."""
    drop = {}
    try:
        if as_uid is not None and os.geteuid() == 0 and as_uid != 0:
            who = identity_of(as_uid)
            drop = {"user": who.uid, "group": who.gid, "extra_groups": list(who.groups)}
        proc = subprocess.Popen(list(argv), shell=False, env=clean_env(env), cwd=cwd,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True, **drop)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:  # PrivilegeError too
        return HookResult(f"cannot run: {exc}", "")
    running(proc.pid, True)
    try:
        return _wait(proc, stdin_bytes, timeout_s)
    finally:
        running(proc.pid, False)


def _wait(proc: subprocess.Popen, stdin_bytes: bytes, timeout_s: float) -> HookResult:
    try:
        out, _ = proc.communicate(stdin_bytes, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        try:  # a process that left the session may still hold the pipe: do not wait on it
            out, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out = b""
            proc.wait()  # the hook itself is gone: only its status is left to collect
        return HookResult(f"timeout after {timeout_s:g} s (killed)", _tail(out))
    return HookResult(f"exit {proc.returncode}" if proc.returncode >= 0
                      else f"killed by signal {-proc.returncode}", _tail(out))


def kill_session(pid: int) -> None:
    # The hook's whole process group: a script's `sleep` or `curl` must not outlive it.
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(out: bytes | None) -> str:
    return (out or b"")[-OUTPUT_KEPT_BYTES:].decode("utf-8", "replace")
