"""Talk to the daemon: connect (starting the user daemon if none runs) and turn replies into errors.

Kept free of heavy imports: every CLI call pays for what this module imports.
"""

from __future__ import annotations

import os
import sys
import time

from gpusched.client import drift, trust, wire
from gpusched.client.modes import client_paths
from gpusched.client.paths import Paths, ensure_private_dir
from gpusched.core.errors import ERROR_KINDS, DaemonUnavailable, GpuschedError, PermissionDenied

# typing is imported only by type checkers: it costs every CLI call several ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

START_TIMEOUT_S = 15.0

# Whether this process has compared the daemon with its own environment: one warning
# per command is enough (`wait` and `logs -f` ask many times).
_compared_daemon = False


# What a request that reached the daemon may have done when its answer never came (one
# that changes nothing: no more than the plain error).
_MAY_BE_DONE = {
    "submit": "the job may have been queued",
    "resubmit": "the job may have been queued",
    **{
        cmd: f"the {cmd} may have been done"
        for cmd in ("cancel", "hold", "release", "update", "requeue", "preempt", "gc")
    },
}


class Client:
    def __init__(
        self, paths: Paths | None = None, autostart: bool = True, check_daemon: bool | None = None
    ):
        """check_daemon: warn when the daemon runs with other GPUs or config than this
        process's environment asks for; by default when the paths come from it too."""
        self.check_daemon = paths is None if check_daemon is None else check_daemon
        self.paths = paths or client_paths()
        # Only a user daemon is started on demand: the system one is systemd's to start.
        self.autostart = autostart and self.paths.mode == "user"

    def _connect(self) -> Any:
        """A connected socket (wire.connect_unix's: close it when done)."""
        # A socket planted by another user must never receive a request: check the path
        # before connecting and the listening process's uid before sending.
        trust.check_socket_path(self.paths)
        sock = wire.connect_unix(self.paths.socket)
        try:
            trust.check_peer(sock, self.paths)
        except BaseException:
            sock.close()
            raise
        return sock

    def not_running_message(self) -> str:
        if self.paths.is_system:
            return (
                f"the system gpusched daemon ({self.paths.socket}) is not running; ask an "
                "admin to start it (`systemctl start gpusched`)."
            )
        if self.paths.mode == "socket":
            return f"no gpusched daemon listens on GPUSCHED_SOCKET={self.paths.socket}."
        return (
            f"no gpusched daemon is running for {self.paths.state_dir}; start one with "
            "`gpusched daemon start`."
        )

    def connect(self) -> Any:
        try:
            return self._connect()
        except (FileNotFoundError, ConnectionRefusedError):
            if not self.autostart:
                raise DaemonUnavailable(self.not_running_message()) from None
        except PermissionError:
            raise PermissionDenied(
                f"cannot connect to the gpusched daemon at {self.paths.socket}: "
                "permission denied (it belongs to another user). Use your own: "
                "unset GPUSCHED_HOME or point it at a directory of yours."
            ) from None
        return self.wait_until_up(daemon=start_daemon(self.paths))

    def wait_until_up(
        self, timeout_s: float = START_TIMEOUT_S, daemon: StartedDaemon | None = None
    ) -> Any:
        """Connect once the daemon listens; fail at once if the one we started gave up."""
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                return self._connect()
            except (FileNotFoundError, ConnectionRefusedError):
                # A daemon that lost the lock to a concurrent start exits too; then the
                # winner holds the lock and comes up, so only an unheld lock means failure.
                if (
                    daemon is not None
                    and daemon.process.poll() is not None
                    and not lock_is_held(self.paths.lock)
                ):
                    raise DaemonUnavailable(daemon.failure(self.paths)) from None
                if time.monotonic() > deadline:
                    raise DaemonUnavailable(
                        f"the gpusched daemon did not start within {timeout_s:.0f} s; see "
                        f"{self.paths.daemon_log}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    def call(self, cmd: str, timeout_s: float | None = 60.0, **args: Any) -> Any:
        """Send one request and return its result, raising the daemon's error as ours."""
        sock = self.connect()
        sent = None  # the command, once the daemon has it all
        try:
            sock.settimeout(timeout_s)
            wire.send(sock, {"cmd": cmd, "args": args}, allow_nan=False)
            sent = cmd
            reply = wire.receive(sock)
        except OSError as exc:  # TimeoutError too
            self.lost(exc, sent)
        finally:
            sock.close()
        if reply is None:
            self.lost("it closed the connection without an answer", sent)
        return self.result_of(reply)

    def lost(self, why: object, sent: str | None = None) -> NoReturn:
        """Raise the error for a connection that broke in the middle of a request; sent:
        the command, when the daemon had all of it (and may have done it)."""
        done = None if sent is None else _MAY_BE_DONE.get(sent)
        if done is None:
            raise DaemonUnavailable(
                f"lost the connection to the gpusched daemon ({why}); see {self.paths.daemon_log}"
            ) from None
        raise DaemonUnavailable(
            f"lost the connection to the gpusched daemon after sending "
            f"the {sent} ({why}); {done}: check with `gpusched ls`, and "
            f"see {self.paths.daemon_log}"
        ) from None

    def result_of(self, reply: dict[str, Any] | None) -> Any:
        """A reply's result, raising the daemon's error as ours (client/pagedreplies.py too)."""
        if reply is None:
            raise DaemonUnavailable("the gpusched daemon closed the connection without an answer")
        if self.check_daemon:
            self._compare_daemon(reply.get("daemon"))
        if not reply.get("ok"):
            error: dict[str, Any] = reply.get("error") or {}
            cls = ERROR_KINDS.get(error.get("kind", ""), GpuschedError)
            raise cls(error.get("message", "the daemon refused the request"))
        return reply.get("result")

    def call_paged(self, cmd: str, timeout_s: float | None = 60.0, **args: Any) -> dict[str, Any]:
        """A request whose reply comes in pages (list, show, wait): asked again from
        each reply's "next" until the last; the last reply, with every page's jobs."""
        jobs: list[dict[str, Any]] = []
        for result in self.each_page(cmd, timeout_s, args):
            jobs += result["jobs"]
        return {**result, "jobs": jobs}

    def each_page(self, cmd: str, timeout_s: float | None, args: dict[str, Any]) -> Any:
        """Each page's result of a paged request, asked for one request at a time."""
        while True:
            result = self.call(cmd, timeout_s=timeout_s, **args)
            yield result
            if result.get("next") is None:
                return
            args = {**args, "after": result["next"]}

    def stream(self, cmd: str, timeout_s: float | None = 60.0, **args: Any) -> Any:
        """Each page's result of a request streamed on one connection (client/pagedreplies.py)."""
        from gpusched.client import pagedreplies  # noqa: PLC0415 - 0.2 ms of every command

        return pagedreplies.pages(self, cmd, timeout_s, **args)

    def _compare_daemon(self, fingerprint: Any) -> None:
        global _compared_daemon
        if _compared_daemon:
            return
        _compared_daemon = True
        line = drift.warning(fingerprint, self.paths, os.environ)
        if line:
            sys.stderr.write(line + "\n")

    def is_running(self) -> bool:
        try:
            self._connect().close()
            return True
        except OSError:
            return False


class StartedDaemon:
    """A daemon this process started (a subprocess.Popen), and where its part of the
    shared log begins."""

    def __init__(self, process: Any, log_offset: int):
        self.process, self.log_offset = process, log_offset

    def failure(self, paths: Paths) -> str:
        """Why it exited: the `Error:` line it wrote, else its exit status."""
        try:
            with open(paths.daemon_log, "rb") as fh:
                fh.seek(self.log_offset)
                lines = fh.read(1 << 20).decode(errors="replace").splitlines()
        except OSError:
            lines = []
        message = next(
            (line[len("Error: ") :] for line in reversed(lines) if line.startswith("Error: ")), ""
        )
        if message:
            return f"the gpusched daemon could not start: {message}"
        return (
            f"the gpusched daemon exited with status {self.process.returncode} before it "
            f"was ready; see {paths.daemon_log}"
        )


def lock_is_held(path: str) -> bool:
    """Whether a daemon holds the state directory's lock (filelock flocks that file)."""
    # fcntl: an extension module, 0.25 ms of every submit (tests/test_lean_imports.py)
    import fcntl  # noqa: PLC0415

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return False


def start_daemon(paths: Paths, environ: dict[str, str] | None = None) -> StartedDaemon:
    """Start `gpusched daemon run` in the background, detached, logging to its state dir."""
    # subprocess: 19 ms (selectors, signal) of every command; only to start a daemon
    import subprocess  # noqa: PLC0415

    ensure_private_dir(paths.state_dir)
    env = dict(os.environ if environ is None else environ)
    log_fd = os.open(paths.daemon_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        offset = os.fstat(log_fd).st_size
        process = subprocess.Popen(
            [sys.executable, "-m", "gpusched.daemon"],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
            env=env,
            cwd="/",
        )
    finally:
        os.close(log_fd)
    return StartedDaemon(process, offset)


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            # A daemon this process started is its child: reap it, or it lingers as a zombie.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        if not is_running(pid):
            return True
        time.sleep(0.02)
    return False


def is_running(pid: int) -> bool:
    """Whether pid is a live process. A zombie has ended: its parent may take long to reap
    it (slow under some inits, never in a container whose PID 1 is not an init), and
    os.kill(pid, 0) succeeds on it, so its state is read from /proc."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
