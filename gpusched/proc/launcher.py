"""The shim launcher: a small process that forks one shim per job, the shim code already loaded.

A fresh Python interpreter per job costs more than the rest of a short job's start
together; forking this single-threaded process costs about a millisecond. The daemon
writes one job's spec per line (JSON) on our stdin and does not wait: each shim records
its pid in its job's run file, where the daemon (or its successor) reads it. Each shim
gets a session of its own, so it outlives this launcher and the daemon.

Run as `python -I -S launcher.py` (stdlib only, like the shim it forks).
"""

from __future__ import annotations

import _signal  # signal's C core; see shim.py for why
import gc
import json
import os
import select
import signal
import sys

# Run by path with -I -S: make the package importable for the shim module.
sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..")))

from gpusched.proc import runfile, shim  # noqa: E402

_REAP_EVERY_S = 1.0


def _become_shim(spec: dict, spec_line: bytes) -> None:
    """In the forked child: leave the launcher's session and pipes, then run the shim."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the daemon must see EOF on our pipes when we are gone
            os.dup2(null, fd)
        os.close(null)
        os.chdir("/")
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # plain ints: see shim.py
        code = shim.run(spec, spec_line)
    except BaseException as exc:  # noqa: BLE001 - the daemon would otherwise wait a minute
        # Ignored by the daemon once the run file shows the shim got going.
        shim.notify_daemon(spec, runfile.launch_failure(spec["job_id"], f"the shim failed: {exc}"))
    finally:
        os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(requests_fd: int) -> None:
    """One job spec per request line, until the daemon closes the pipe.

    Raw reads, not a buffered file: select must see every line that has arrived.
    """
    pending = b""
    while True:
        ready, _, _ = select.select([requests_fd], [], [], _REAP_EVERY_S)
        _reap()
        if not ready:
            continue
        chunk = os.read(requests_fd, 65536)
        if not chunk:
            return  # the daemon is gone; the shims we forked carry on without us
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            launch(line)


def launch(spec_line: bytes) -> None:
    # Parsed here, not in the shim: what a forked child allocates costs it copy-on-write
    # page faults, and the spec (the job's whole environment) is the largest thing it has.
    try:
        spec = json.loads(spec_line)
    except ValueError:
        return  # not from a daemon of ours: nothing to run
    # Forwarded signals stay blocked in the child until the shim can pass them on: a
    # cancel that comes as soon as the pid is known must not kill the shim itself.
    _signal.pthread_sigmask(signal.SIG_BLOCK, shim.FORWARDED)
    try:
        if os.fork() == 0:
            _become_shim(spec, spec_line)
    finally:
        _signal.pthread_sigmask(signal.SIG_UNBLOCK, shim.FORWARDED)


if __name__ == "__main__":
    # A forked shim copies each memory page it writes to, and a garbage collection pass
    # writes to every object: the shims allocate no cycles worth collecting.
    gc.disable()
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the daemon's terminal is for it
    serve(0)
