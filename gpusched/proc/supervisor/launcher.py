"""Forking a job's shim: the supervisor's way to start a job that needs one.

A fresh Python interpreter per job costs more than the rest of a short job's start
together; forking the supervisor (gpusched/proc/supervisor/main.py), single-threaded, with the
shim code already loaded, costs about a millisecond. The shim records its pid in its
job's run file, where the daemon (or its successor) reads it. Each shim gets a session of
its own, so it outlives the supervisor and the daemon.

Most jobs need no shim: the supervisor starts and watches them itself. A shim remains for
what it does that the supervisor cannot do cheaply for many jobs at once (see
starts.py, needs_shim): system mode, cgroups, containers, capped logs, terminals (--pty).
"""

from __future__ import annotations

import _signal  # signal's C core; see shim.py for why
import os
import signal

from gpusched.proc import runreport, shim, spawn

TYPE_CHECKING = False  # not typing: the supervisor's import chain, which forks the shim
if TYPE_CHECKING:
    from typing import Any


def _become_shim(spec: dict[str, Any], spec_line: bytes) -> None:
    """In the forked child: leave the supervisor's session and sockets, then run the shim."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        # The supervisor's listening socket, its links and pidfds are not the shim's: held
        # open here, a listener nobody accepts on would take a new daemon's connection.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir("/")
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # plain ints: see shim.py
        code = shim.run(spec, spec_line)
    except BaseException as exc:
        # Ignored by the daemon once the run file shows the shim got going.
        runreport.start_failed(spec, f"the shim failed: {exc}")
    finally:
        os._exit(code)


def fork_shim(spec: dict[str, Any], spec_line: bytes) -> int:
    """Fork a shim for the job of `spec` (spec_line: the spec as received); its pid."""
    # Forwarded signals stay blocked in the child until the shim can pass them on: a
    # cancel that comes as soon as the pid is known must not kill the shim itself.
    _signal.pthread_sigmask(signal.SIG_BLOCK, spawn.FORWARDED)
    try:
        pid = os.fork()
        if pid == 0:
            _become_shim(spec, spec_line)
        return pid
    finally:
        _signal.pthread_sigmask(signal.SIG_UNBLOCK, spawn.FORWARDED)
