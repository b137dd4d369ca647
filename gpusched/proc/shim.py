"""The per-job parent: owns the job's session and logs, forwards signals, writes the exit record.

Forked by the job supervisor (gpusched/proc/supervisor/main.py, through launcher.py) in a new
session, so that it outlives the daemon, for a job that needs one (supervisor/starts.py,
needs_shim: system mode, a cgroup, a container, a capped log, a --pty terminal); the
supervisor starts other jobs itself. Both start the job through spawn.py (a --pty job,
through ptyhost.py). `python -I -S shim.py RUN_FILE` runs a job again by hand, from its
run file. It imports only the standard library and stdlib-only modules of ours (spawn, the
start; runfile, the formats it writes; jobtree, the job's processes; logcap for a capped
log; ptyhost for a terminal; and in system mode privileges).
"""

from __future__ import annotations

# The signal module's Python wrappers turn every signal number into an enum member; in a
# freshly forked shim that machinery costs about 0.35 ms of copy-on-write page faults, for
# every job. Its C core takes and returns plain numbers.
import _signal
import os
import signal
import sys
import time

if __name__ == "__main__":  # run by path with -I -S: make the package importable
    sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..")))

from gpusched.proc import jobexec, jobtree, runfile, runreport, spawn

TYPE_CHECKING = False  # not typing: in the shim's import chain (tests/test_boundaries.py)
if TYPE_CHECKING:
    from typing import Any


def _end_container(
    spec: dict[str, Any], exit_code: int | None, signum: int | None
) -> tuple[int | None, int | None]:
    from gpusched.proc import containerrun  # noqa: PLC0415 - 4.6 ms (subprocess) of every shim

    return containerrun.finish(spec, exit_code, signum, lambda line: spawn.note_in_log(spec, line))


def _pty_host(spec: dict[str, Any]) -> Any:
    """The ptyhost module for a --pty job (its terminal is ours to serve), or None."""
    if "pty_socket" not in spec:
        return None
    from gpusched.proc import ptyhost  # noqa: PLC0415 - a --pty job's only (threads, selectors)

    return ptyhost


def run(spec: dict[str, Any], spec_line: bytes | None = None) -> int:
    """Run the job of `spec` (spec_line: the same as the launcher received it)."""
    # Hold signals until the forwarder exists, so an early cancel is never lost (the
    # launcher forks us with them blocked already).
    _signal.pthread_sigmask(signal.SIG_BLOCK, spawn.FORWARDED)
    run_path = runreport.begin_run(spec, spec_line)
    if run_path is None:
        return 1
    jobtree.become_subreaper()
    pty = _pty_host(spec)
    try:
        pid = pty.spawn_on_pty(spec) if pty is not None else spawn.spawn(spec)
    except (OSError, ValueError) as exc:  # noted in the job's log, as the job's user
        runreport.start_failed(spec, f"cannot start: {jobexec.in_words(exc)}", run_path)
        return 0
    cap = spawn.log_cap(spec)
    if cap is not None:
        cap.start()  # copying the job's output, now that nothing forks any more
    if pty is not None:
        pty.start()
    forward = jobtree.Forwarder(
        pid,
        float(spec.get("grace_s", 10.0)),  # the job leads its group
        "container_remove" in spec,
    )
    for sig in spawn.FORWARDED:
        _signal.signal(sig, forward)
    _signal.signal(signal.SIGALRM, forward.kill)
    _signal.pthread_sigmask(signal.SIG_UNBLOCK, spawn.FORWARDED)
    exit_code, signum = jobtree.wait_for(pid, forward.group_only)
    if spec.get("container_remove"):  # before leftovers: the runtime stops its own processes
        exit_code, signum = _end_container(spec, exit_code, signum)
    jobtree.end_leftovers(forward)
    if pty is not None:  # the last of the output, and the attachers told how it ended
        pty.finish(exit_code, signum)
    if cap is not None:
        cap.finish()  # the last of the output in the logs before the end is recorded
    runreport.record_exit(run_path, spec, runfile.ExitRecord(exit_code, signum, time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(run(runfile.read_spec(sys.argv[1])))
