"""A service's front door: one HAProxy process, its config, its runtime API (admin socket)
and the request log it sends to gpusched; started in a session of its own, so that, like
the jobs, it outlives a daemon restart and is found again by its pid file."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.core.errors import GpuschedError
from gpusched.proc import privileges

INSTALL_HINT = (
    "install HAProxy from your distribution's packages (Debian/Ubuntu: "
    "`sudo apt-get install haproxy`; Fedora: `sudo dnf install haproxy`)"
)
BACKEND = "replicas"
# HAProxy refuses longer admin socket paths (sun_path, less room for its own suffixes).
_ADMIN_PATH_MAX = 90
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
# Each request as HAProxy logs it: the service's secret, total time (ms), status, server.
# The secret is in the config only (a folder of the daemon's own): a datagram without it
# comes from someone else, and is dropped.
_LOG_FORMAT = "%Tt %ST %s"
_LOG_LINE = re.compile(rb" ([0-9a-f]{32}) (-?[0-9]{1,9}) (-1|[0-9]{3}) ([!-~]{1,64})\n?\Z")
# Health checks of each server (added ones take no default-server settings): a replica
# that stops answering is out after two failed checks, back after one good one.
_CHECK = "check inter 300ms fall 2 rise 1"

_CONFIG = """\
# Written by gpusched for service {name}; servers come and go through the admin socket.
global
    stats socket {admin} mode 600 level admin
    log {log} local0
    maxconn 4096
    # Its port is its own: no other process (another service's door, say) may share it.
    noreuseport
{identity}defaults
    mode http
    log global
    log-format "{token} {log_format}"
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    timeout queue 30s
    timeout http-keep-alive 10s
    # A health check answered within 2 s passes: a replica slowed by a busy machine stays
    # in rotation (with the 300 ms default, a loaded box could take every replica out and
    # answer 503), while one that is gone refuses at once and is out after two checks.
    timeout check 2s
    # A replica that dies or refuses takes no request with it: the request goes to
    # another replica (the body is buffered for that).
    option http-buffer-request
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response junk-response response-timeout 502 503 504
frontend door
    bind {listen}
    default_backend {backend}
backend {backend}
    balance {balance}
{check}"""


def find_binary(configured: str = "haproxy") -> str | None:
    """The haproxy program: on PATH, or in the sbin folders a user's PATH often lacks."""
    found = shutil.which(configured)
    if found or os.sep in configured:
        return found
    return shutil.which(configured, path=os.pathsep.join(_SBIN))


def owner_identity(uid: int, name: str) -> tuple[int, int] | None:
    """The (uid, gid) a root daemon's HAProxy runs as, for a service of `uid`: it reads
    its config and binds its sockets as root, then becomes the owner (None: stays as is,
    a user daemon's own, or root's service)."""
    if os.geteuid() != 0 or uid == 0:
        return None
    try:
        return uid, privileges.identity_of(uid).gid
    except privileges.PrivilegeError:
        raise GpuschedError(
            f"the owner of service {name}, uid {uid}, has no account here; "
            f"`gpusched service delete {name}` removes it"
        ) from None


def require_binary(configured: str = "haproxy") -> str:
    found = find_binary(configured)
    if not found:
        raise GpuschedError(
            f"services need HAProxy, and {configured!r} was not found; {INSTALL_HINT}."
        )
    return found


@dataclass(frozen=True)
class ServerStat:
    name: str
    status: str  # UP, DOWN, MAINT, DRAIN, NOLB ...
    in_flight: int  # scur: requests being served now
    total: int  # stot: requests (sessions) served
    weight: int
    checked_ok: bool  # its last health check passed


class Proxy:
    """The HAProxy of one service, from files in `folder` named after it."""

    def __init__(self, folder: str, name: str, socket_folder: str):
        """socket_folder: the daemon's run directory; the admin socket goes in a folder
        of its own there that only the daemon may enter (a short path: sun_path holds 108
        bytes). A running proxy's own config says where its socket is."""
        base = os.path.join(folder, name)
        self.name = name
        self.config_path, self.pid_path = f"{base}.haproxy.cfg", f"{base}.haproxy.pid"
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        self.admin_path = os.path.join(socket_folder, "services", f"svc-{digest}.sock")
        if len(self.admin_path) > _ADMIN_PATH_MAX:  # a deep home: a short private folder
            folder_digest = hashlib.sha256(socket_folder.encode()).hexdigest()[:16]
            self.admin_path = os.path.join(
                f"/tmp/gpusched-{os.getuid()}-{folder_digest}", f"svc-{digest}.sock"
            )
        self.fresh_admin_path = self.admin_path
        self.admin_path = self.configured().get("admin", self.admin_path)

    # -- the process ------------------------------------------------------------------
    def configured(self) -> dict[str, Any]:
        """What its config file says: the log port and secret, the admin socket."""
        try:
            text = Path(self.config_path).read_text()
        except OSError:
            return {}
        found: dict[str, Any] = {}
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["log"] and words[1].startswith("127.0.0.1:"):
                found["log_port"] = int(words[1].rpartition(":")[2])
            elif words[:2] == ["stats", "socket"]:
                found["admin"] = words[2]
            elif words[:1] == ["log-format"] and len(words) == 5:
                found["token"] = words[1].strip('"')
        return found

    def write_config(
        self,
        listen: str,
        balance: str,
        health: str,
        log_port: int,
        token: str,
        identity: tuple[int, int] | None,
    ) -> None:
        self.admin_path = self.fresh_admin_path
        check = (
            f"    option httpchk GET {health}\n    http-check expect status 200\n" if health else ""
        )
        text = _CONFIG.format(
            name=self.name,
            admin=self.admin_path,
            log=f"127.0.0.1:{log_port}",
            token=token,
            log_format=_LOG_FORMAT,
            listen=listen,
            identity="" if identity is None else f"    uid {identity[0]}\n    gid {identity[1]}\n",
            backend=BACKEND,
            check=check,
            balance="roundrobin" if balance == "weighted" else balance,
        )
        tmp = f"{self.config_path}.tmp"
        Path(tmp).write_text(text)
        os.replace(tmp, self.config_path)

    def start(self, binary: str) -> None:
        """Start it (it forks into the background once it listens); GpuschedError with
        HAProxy's own words when it cannot (the port is taken, say)."""
        _private_dir(os.path.dirname(self.admin_path))
        try:
            os.unlink(self.admin_path)
        except FileNotFoundError:
            pass
        done = subprocess.run(
            [binary, "-D", "-f", self.config_path, "-p", self.pid_path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
            start_new_session=True,
        )
        if done.returncode != 0:
            words = " ".join(done.stderr.split())[-300:] or f"exit status {done.returncode}"
            raise GpuschedError(f"HAProxy for service {self.name} did not start: {words}")

    def pid(self) -> int | None:
        """Its pid while it runs (checked against its command line: pids are reused)."""
        try:
            pid = int(Path(self.pid_path).read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            return None
        return pid if self.config_path.encode() in cmdline else None

    def is_running(self) -> bool:
        return self.pid() is not None

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for path in (self.pid_path, self.admin_path, self.config_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # -- the runtime API --------------------------------------------------------------
    def command(self, line: str) -> str:
        """One runtime API command and HAProxy's answer; OSError when it cannot be asked."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            sock.connect(self.admin_path)
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def add_server(self, server: str, port: int, weight: int) -> None:
        answer = self.command(
            f"add server {BACKEND}/{server} 127.0.0.1:{port} weight {weight} {_CHECK}"
        )
        if "New server registered" not in answer and "Already exists" not in answer:
            raise OSError(answer.strip())
        # Added in maintenance; checked while draining (no requests), let in only once a
        # check has passed (ready_server): HAProxy takes a new server for up at once.
        self.command(f"enable health {BACKEND}/{server}")
        self.command(f"set server {BACKEND}/{server} state drain")

    def ready_server(self, server: str) -> None:
        self.command(f"set server {BACKEND}/{server} state ready")

    def drain_server(self, server: str) -> None:
        """No new requests; those it serves finish."""
        self.command(f"set server {BACKEND}/{server} state drain")

    def remove_server(self, server: str) -> bool:
        """Out of the backend for good; False while HAProxy still holds connections to it."""
        self.command(f"set server {BACKEND}/{server} state maint")
        answer = self.command(f"del server {BACKEND}/{server}")
        return "Server deleted" in answer or "No such server" in answer

    def stats(self) -> dict[str, ServerStat]:
        """Every server of the backend, and the backend itself (under 'BACKEND')."""
        lines = self.command("show stat").splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        header = lines[0][2:].split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") != BACKEND:
                continue
            out[row["svname"]] = ServerStat(
                name=row["svname"],
                status=row.get("status", ""),
                in_flight=_int(row.get("scur")) + _int(row.get("qcur")),
                total=_int(row.get("stot")),
                weight=_int(row.get("weight")),
                checked_ok=row.get("check_status", "").endswith("OK"),
            )
        return out


def _private_dir(path: str) -> None:
    """A folder for the admin socket that only we can enter (it may be under /tmp)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if (
        not os.path.isdir(path)
        or os.path.islink(path)
        or info.st_uid != os.getuid()
        or info.st_mode & 0o077
    ):
        raise GpuschedError(
            f"{path} is not a private folder of this user; remove it, then try again"
        )


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def parse_line(message: bytes, token: str) -> tuple[float, int, str] | None:
    """(latency ms, status, server) from one datagram, or None: not one of its door's
    (no secret, or another) or not well formed. ASCII digits only ('²'.isdigit() holds)."""
    found = _LOG_LINE.search(message[-256:])
    if found is None or not hmac.compare_digest(found[1], token.encode()):
        return None
    return float(found[2]), int(found[3]), found[4].decode("ascii")


def new_token() -> str:
    return secrets.token_hex(16)


class RequestLog:
    """The datagrams HAProxy logs each request to: (latency ms, status, server) each.

    Over UDP on 127.0.0.1, not a Unix socket: a Unix datagram queue holds 10 messages
    (net.unix.max_dgram_qlen), and HAProxy drops what does not fit. Any local process may
    send to the port, so each line must carry the service's secret (`token`)."""

    def __init__(self, port: int, token: str):
        self.token = token
        self.refused = 0  # datagrams dropped: without the secret, or not well formed
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        try:
            self.sock.bind(("127.0.0.1", port))
        except OSError:  # the port an adopted proxy logs to is taken: latencies are lost
            self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def read(self, most: int = 20000) -> list[tuple[float, int, str]]:
        out = []
        for _ in range(most):
            try:
                message = self.sock.recv(4096)
            except OSError:
                break
            line = parse_line(message, self.token)
            if line is None:
                self.refused += 1
            else:
                out.append(line)
        return out

    def close(self) -> None:
        self.sock.close()
