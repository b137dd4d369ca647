"""The end of a container job, in its shim: the container removed, the exit status read.

The runtime's client (`podman run --rm`) removes the container itself when the job ends
by itself or by a signal it passed on. When the client was killed instead (SIGKILL after
the grace of a cancel or a time limit), the container may still run: the shim removes
it by its name, as the job's user (whose runtime storage holds it). The shim survives a
daemon that dies, so this happens even then. Imported by the shim for container jobs only.
"""

from __future__ import annotations

import os
import subprocess
import time

from gpusched.core.spec import container
from gpusched.proc import privileges

TYPE_CHECKING = False  # not typing: in the shim's import chain (tests/test_boundaries.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

REMOVE_TIMEOUT_S = 60.0  # one removal; stopping a container at once takes well under that
_RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 4.0)


def remove(spec: dict[str, Any]) -> str:
    """Remove the run's container, retrying while the runtime still winds it down (podman
    refuses a container whose monitor was killed a moment ago); "" when it is gone, else
    why not."""
    removal = spec["container_remove"]
    tries = int(removal.get("tries", 1))
    outcome = ""
    for attempt in range(tries):
        outcome = _run_once(removal["argv"], spec["env"], spec.get("run_as"))
        if not outcome:
            return ""
        if attempt + 1 < tries:
            time.sleep(_RETRY_DELAYS_S[min(attempt, len(_RETRY_DELAYS_S) - 1)])
    return f"gpusched: cannot remove container {removal['name']} ({outcome})\n"


def _run_once(argv: list[str], env: dict[str, str], run_as: int | None) -> str:
    """Run the removal as the job's user (system mode: run_as), in a session of its own;
    "" when it succeeded, else what went wrong. Not hookrun's runner: the shim imports
    neither dataclasses nor typing."""
    # None: subprocess's own defaults (as ourselves)
    user: int | None = None
    group: int | None = None
    extra_groups: list[int] | None = None
    if run_as is not None and os.geteuid() == 0 and run_as != 0:
        who = privileges.identity_of(int(run_as))
        user, group, extra_groups = who.uid, who.gid, list(who.groups)
    try:
        done = subprocess.run(
            argv,
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=REMOVE_TIMEOUT_S,
            start_new_session=True,
            user=user,
            group=group,
            extra_groups=extra_groups,
        )
    except subprocess.TimeoutExpired:
        return f"no answer in {REMOVE_TIMEOUT_S:g} s"
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode == 0:
        return ""
    return f"exit {done.returncode}: {done.stderr.decode(errors='replace').strip()[-300:]}"


def finish(
    spec: dict[str, Any],
    exit_code: int | None,
    signum: int | None,
    note: Callable[[str], None],  # note(line): into the job's log
) -> tuple[int | None, int | None]:
    """After the runtime's client has exited: remove the container (note(why) if that
    fails), and the job's (exit code, signal) as for a plain job: the runtime reports a
    job ended by signal N as exit status 128+N."""
    failure = remove(spec)
    if failure:
        note(failure)
    from_signal = container.signal_of_exit(exit_code)
    if from_signal is not None:
        return None, from_signal
    return exit_code, signum
