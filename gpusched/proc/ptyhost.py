"""A --pty job's terminal: its shim holds the pty's master, copies what the job writes into
its output log and a scrollback ring, and serves `gpusched attach` on a socket of the job's.

The job leads a session of its own with the pty's slave as its controlling terminal: a
^C typed by an attacher is SIGINT to its foreground group, a resize is its SIGWINCH. The
socket is made by the job's child as the job's user (mode 0600, beside the job's own
logs), and a thread of the shim serves it; the shim outlives the daemon, so attach
connects here directly. Every attacher gets the scrollback, then the live output; every
attacher's keys reach the job, and the latest resize wins (as tmux's shared sessions).
When the job has ended, each attacher is sent its exit status (the frames: ptywire.py).
Standard library only: the shim imports this module for a --pty job alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import selectors
import socket
import struct
import termios
import threading

from gpusched.proc import jobexec, logcap, spawn
from gpusched.proc.ptywire import (
    EXITED,
    INPUT,
    OUTPUT,
    WINSIZE,
    FrameReader,
    frame,
    set_size,
    unix_address,
)

TYPE_CHECKING = False  # not typing: in the shim's import chain (tests/test_boundaries.py)
if TYPE_CHECKING:
    from typing import Any

    from gpusched.proc.privileges import Identity

SCROLLBACK_BYTES = 256 * 1024  # what a new attacher sees first: some screens of a redraw
_CHUNK_BYTES = 1 << 16
_SEND_TIMEOUT_S = 5.0  # an attacher that stops reading is dropped: it never stalls the job
_DRAIN_S = 2.0  # after the job's end, the last of its output (a leftover may hold the slave)
_FINISH_S = 10.0
_host: Host | None = None


# -- the start, in the shim ----------------------------------------------------------------------
def spawn_on_pty(spec: dict[str, Any]) -> int:
    """Start the job of `spec` on a new pty; its pid. Failures as spawn.spawn's."""
    global _host
    who = spawn.identity(spec)
    master, slave = os.openpty()
    set_size(master, 24, 80)  # until an attacher says its own
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    parent_sock, child_sock = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the shim is single-threaded until the host starts: fork is safe
        os.close(read_end)
        os.close(master)
        parent_sock.close()
        _exec_job(spec, who, slave, child_sock, write_end)
    os.close(write_end)
    os.close(slave)
    child_sock.close()
    try:
        fds = socket.recv_fds(parent_sock, 16, 2)[1]
    except OSError:
        fds = []
    parent_sock.close()
    failure = b""
    while chunk := os.read(read_end, 4096):
        failure += chunk
    os.close(read_end)
    if failure or len(fds) != 2:
        for fd in (*fds, master):
            os.close(fd)
        os.waitpid(pid, 0)
        try:
            os.unlink(spec["pty_socket"])  # made before the exec failed
        except OSError:
            pass
        raise jobexec.StartError(failure.decode(errors="replace") or "no terminal for the job")
    _host = Host(master, fds[0], fds[1], spec)
    return pid


def _exec_job(
    spec: dict[str, Any], who: Identity | None, slave: int, sock: socket.socket, write_end: int
) -> None:
    """The child: a session on the terminal, the user (system mode), the cwd, the output log
    and the attach socket (both handed to the shim), then the exec."""
    dropped = who is None
    try:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        spawn.prepare_child(spec)
        if who is not None:
            from gpusched.proc import privileges  # noqa: PLC0415 - system mode's

            os.fchown(slave, who.uid, who.gid)  # the user's own terminal, as a login's
            privileges.drop(who)
            dropped = True
        jobexec.enter_cwd(spec["cwd"])
        out_fd, err_fd = spawn.open_outputs(spec, who)
        os.close(err_fd)  # the terminal merges the job's stderr into its output
        listener = _listen(spec["pty_socket"])
        socket.send_fds(sock, [b"1"], [out_fd, listener.fileno()])
        os.close(out_fd)
        listener.close()
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        os.close(slave)
        spawn.exec_program(spec)
    except BaseException as exc:
        spawn.report_start_failure(exc, spec, who, dropped, write_end)
    os._exit(127)


def _listen(path: str) -> socket.socket:
    """The attach socket, the job's user's alone (made as that user, mode 0600)."""
    try:
        os.unlink(path)  # a socket of an earlier run of the job
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, directory = unix_address(path)
    mask = os.umask(0o177)
    try:
        listener.bind(address)
    finally:
        os.umask(mask)
        if directory is not None:
            os.close(directory)
    listener.listen(16)
    return listener


def start() -> None:
    """Serving starts, once the job is spawned (a thread: nothing forks after)."""
    if _host is not None:
        _host.thread.start()


def finish(exit_code: int | None, signum: int | None) -> None:
    """Once the job and its leftovers are gone: the last output, then each attacher is told
    how the job ended and the socket goes."""
    if _host is not None:
        _host.finish(exit_code, signum)


# -- serving -------------------------------------------------------------------------------------
class Host:
    """The pty's master, the job's output log and the attachers, served by one thread."""

    def __init__(self, master: int, log_fd: int, listener_fd: int, spec: dict[str, Any]):
        self.master = master
        os.set_blocking(master, False)
        cap = int(spec.get("max_log_bytes") or 0)
        self.log = logcap.CappedLog(log_fd, cap) if cap else None
        self.log_fd = log_fd
        self.listener = socket.socket(fileno=listener_fd)
        self.path: str = spec["pty_socket"]
        owner = os.getuid() if spec.get("run_as") is None else int(spec["run_as"])
        self.allowed = {0, owner}  # the socket's mode says the same: belt and braces
        self.reading = True  # until no process holds the terminal open
        self.ring = bytearray()
        self.clients: dict[socket.socket, FrameReader] = {}
        self.wake_read, self.wake_write = os.pipe2(os.O_CLOEXEC)
        self.ended = b""
        self.selector = selectors.DefaultSelector()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def finish(self, exit_code: int | None, signum: int | None) -> None:
        self.ended = json.dumps({"exit_code": exit_code, "signal": signum}).encode()
        os.write(self.wake_write, b"x")
        if self.thread.is_alive():
            self.thread.join(_FINISH_S)

    def _serve(self) -> None:
        sel = self.selector
        sel.register(self.master, selectors.EVENT_READ, "job")
        sel.register(self.listener, selectors.EVENT_READ, "listener")
        sel.register(self.wake_read, selectors.EVENT_READ, "end")
        try:
            while True:
                for key, _ in sel.select():
                    if key.data == "job":
                        self._read_job()
                    elif key.data == "listener":
                        self._accept()
                    elif key.data == "end":
                        self._end()
                        return
                    else:
                        self._from_attacher(key.fileobj)  # type: ignore[arg-type]
        except Exception:  # a defect here must not keep the job's end unrecorded
            return

    def _read_job(self) -> None:
        """Copy what the job wrote, until no process holds its terminal open."""
        try:
            data = os.read(self.master, _CHUNK_BYTES)
        except BlockingIOError:
            return
        except OSError:  # EIO: every slave descriptor closed
            data = b""
        if not data:
            self.reading = False
            self.selector.unregister(self.master)
            return
        try:
            if self.log is not None:
                self.log.write(data)
            else:
                os.write(self.log_fd, data)
        except OSError:
            pass  # a full disk: the log misses it, the attachers still see it
        self.ring += data
        if len(self.ring) > SCROLLBACK_BYTES:
            del self.ring[: len(self.ring) - SCROLLBACK_BYTES]
        for attacher in list(self.clients):
            self._send(attacher, frame(OUTPUT, data))

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] not in self.allowed:
            conn.close()
            return
        conn.settimeout(_SEND_TIMEOUT_S)
        self.clients[conn] = FrameReader()
        self.selector.register(conn, selectors.EVENT_READ, "attacher")
        self._send(conn, frame(OUTPUT, bytes(self.ring)))

    def _send(self, conn: socket.socket, data: bytes) -> None:
        try:
            conn.sendall(data)
        except OSError:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        if self.clients.pop(conn, None) is not None:
            self.selector.unregister(conn)
        conn.close()

    def _from_attacher(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(_CHUNK_BYTES)
            frames = self.clients[conn].feed(data) if data else None
        except (OSError, ValueError, KeyError):
            frames = None
        if frames is None:
            self._drop(conn)
            return
        for kind, payload in frames:
            if kind == INPUT:
                self._type(payload)
            elif kind == WINSIZE and len(payload) == 4:
                rows, columns = struct.unpack(">HH", payload)
                try:
                    set_size(self.master, rows, columns)
                except OSError:
                    pass

    def _type(self, keys: bytes) -> None:
        """Keys to the job; those it leaves unread past a full terminal buffer are lost."""
        view = memoryview(keys)
        while view:
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:
                if not select.select([], [self.master], [], 1.0)[1]:
                    return
            except OSError:
                return

    def _end(self) -> None:
        """The last output, the exit status to every attacher, then nothing is left."""
        while self.reading and select.select([self.master], [], [], _DRAIN_S)[0]:
            self._read_job()
        for conn in list(self.clients):
            self._send(conn, frame(EXITED, self.ended))
            self._drop(conn)
        self.selector.close()
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        for fd in (self.master, self.wake_read, self.wake_write):
            os.close(fd)
        if self.log is not None:
            os.close(self.log.fd)
        else:
            os.close(self.log_fd)
