"""Run one notification hook: an argv list (never a shell), its facts in the environment,
the event as JSON on stdin, in a session of its own that a timeout kills whole. Its output
is read as it comes and only its last few KiB kept: a hook that prints a gigabyte costs
the daemon no memory, and never blocks on a full pipe."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from gpusched.proc.privileges import identity_of

OUTPUT_KEPT_BYTES = 4096  # of the hook's output, for the notification log
READ_CHUNK_BYTES = 64 * 1024
KILLED_WAIT_S = 5.0  # for a killed hook's status (it is gone: this is only its reaping)
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


def run_hook(
    argv: tuple[str, ...],
    env: dict[str, str],
    stdin_bytes: bytes,
    timeout_s: float,
    as_uid: int | None = None,
    cwd: str = "/",
    running: Callable[[int, bool], None] = lambda pid, started: None,
) -> HookResult:
    """Run it and wait at most timeout_s; as_uid (a root daemon only): as that user, with
    that user's groups and nothing else of root's. running(pid, True/False) is told when
    it starts and ends, so that a stopping daemon can kill it."""
    # None: subprocess's own defaults (as ourselves)
    user: int | None = None
    group: int | None = None
    extra_groups: list[int] | None = None
    try:
        if as_uid is not None and os.geteuid() == 0 and as_uid != 0:
            who = identity_of(as_uid)
            user, group, extra_groups = who.uid, who.gid, list(who.groups)
        proc = subprocess.Popen(
            list(argv),
            shell=False,
            env=clean_env(env),
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            user=user,
            group=group,
            extra_groups=extra_groups,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:  # PrivilegeError too
        return HookResult(f"cannot run: {exc}", "")
    running(proc.pid, True)
    try:
        return _wait(proc, stdin_bytes, timeout_s)
    finally:
        running(proc.pid, False)


def _wait(proc: subprocess.Popen[bytes], stdin_bytes: bytes, timeout_s: float) -> HookResult:
    deadline = time.monotonic() + timeout_s
    tail, drained = _pump(proc, stdin_bytes, deadline)
    try:
        if not drained:  # the hook, or something it started, still holds its output
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        try:
            proc.wait(timeout=KILLED_WAIT_S)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel: subprocess reaps it later; the thread goes on
        return HookResult(f"timeout after {timeout_s:g} s (killed)", _text(tail))
    return HookResult(
        f"exit {proc.returncode}"
        if proc.returncode >= 0
        else f"killed by signal {-proc.returncode}",
        _text(tail),
    )


def _pump(
    proc: subprocess.Popen[bytes], stdin_bytes: bytes, deadline: float
) -> tuple[bytearray, bool]:
    """Feed stdin and drain stdout until the hook closes it or the deadline: (the last
    OUTPUT_KEPT_BYTES of what it printed, the rest read and dropped; whether its output
    ended). Closes both pipes either way: nothing is waited for past the deadline."""
    assert proc.stdin is not None and proc.stdout is not None
    tail, left, drained = bytearray(), memoryview(stdin_bytes), False
    os.set_blocking(proc.stdin.fileno(), False)
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if left:
            selector.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                if key.fileobj is proc.stdin:
                    left = _feed(proc.stdin, left)
                    if not left:
                        selector.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(proc.stdout.fileno(), READ_CHUNK_BYTES)
                if not chunk:
                    selector.unregister(proc.stdout)
                    drained = True
                del tail[: max(0, len(tail) + len(chunk) - OUTPUT_KEPT_BYTES)]
                tail += chunk[-OUTPUT_KEPT_BYTES:]
    proc.stdin.close()
    proc.stdout.close()
    return tail, drained


def _feed(pipe: IO[bytes], left: memoryview) -> memoryview:
    # What is left of stdin after one write; nothing when the hook closed its end.
    try:
        return left[os.write(pipe.fileno(), left[:READ_CHUNK_BYTES]) :]
    except BlockingIOError:
        return left
    except OSError:  # BrokenPipeError: the hook does not read its stdin
        return left[:0]


def kill_session(pid: int) -> None:
    # The hook's whole process group: a script's `sleep` or `curl` must not outlive it.
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _text(tail: bytearray) -> str:
    return bytes(tail).decode("utf-8", "replace")
