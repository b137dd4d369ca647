"""System mode's parts that need no extra users: which daemon, trust checks, logs, limits, units."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import REPO, wait_until
from gpusched.client import protocol, trust
from gpusched.client.modes import client_paths, daemon_paths, system_paths
from gpusched.client.paths import resolve_paths
from gpusched.core.config import Settings
from gpusched.core.errors import ConfigError, PermissionDenied
from gpusched.daemon.requests.server import SocketServer
from gpusched.daemon.startup import check_mode
from gpusched.proc import privileges


# -- which daemon ----------------------------------------------------------------------------
def test_client_uses_the_system_daemon_only_when_its_socket_exists(tmp_path):
    env = {"GPUSCHED_SYSTEM_ROOT": str(tmp_path), "HOME": str(tmp_path / "home")}
    assert client_paths(env).mode == "user"
    socket_path = Path(system_paths(env).socket)
    assert socket_path == tmp_path / "run/gpusched/gpusched.sock"
    socket_path.parent.mkdir(parents=True)
    socket_path.touch()
    assert client_paths(env) == system_paths(env)
    assert client_paths(env).log_root == str(tmp_path / "var/log/gpusched")
    # An explicit home, or an explicit socket, wins over the system daemon.
    assert client_paths({**env, "GPUSCHED_HOME": str(tmp_path / "h")}).mode == "user"
    chosen = client_paths({**env, "GPUSCHED_SOCKET": str(tmp_path / "x.sock")})
    assert (chosen.mode, chosen.socket) == ("socket", str(tmp_path / "x.sock"))


def test_daemon_run_is_a_system_daemon_by_flag_or_by_the_system_config(tmp_path):
    env = {"GPUSCHED_SYSTEM_ROOT": str(tmp_path), "HOME": str(tmp_path / "home")}
    assert daemon_paths(True, False, env).is_system
    assert not daemon_paths(False, False, env).is_system
    config = Path(system_paths(env).config_file)
    config.parent.mkdir(parents=True)
    config.write_text('[daemon]\nmode = "system"\n')
    assert daemon_paths(False, False, env).is_system == (os.geteuid() == 0)
    assert not daemon_paths(False, True, env).is_system  # what auto-start asks for
    assert not daemon_paths(False, False, {**env, "GPUSCHED_HOME": str(tmp_path / "h")}).is_system


def test_a_user_config_asking_for_system_mode_is_an_error_naming_the_key(tmp_path):
    paths = resolve_paths({"GPUSCHED_HOME": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"daemon\.mode"):
        check_mode(paths, Settings(mode="system"))
    check_mode(paths, Settings())


# -- the client's trust checks ---------------------------------------------------------------
def _listen(path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    return server


def test_client_refuses_what_is_not_a_socket_and_a_directory_others_can_write(tmp_path):
    paths = resolve_paths({"GPUSCHED_HOME": str(tmp_path)})
    os.makedirs(paths.run_dir)
    os.symlink("/etc/passwd", paths.socket)
    with pytest.raises(PermissionDenied, match="is not a socket"):
        trust.check_socket_path(paths)
    os.unlink(paths.socket)
    with pytest.raises(FileNotFoundError):  # no daemon: the caller may start one
        trust.check_socket_path(paths)
    server = _listen(paths.socket)
    try:
        trust.check_socket_path(paths)
        os.chmod(paths.run_dir, 0o777)
        with pytest.raises(PermissionDenied, match="can be written by others"):
            trust.check_socket_path(paths)
        os.chmod(paths.run_dir, 0o1777)  # sticky, like /tmp: nobody can replace our socket
        trust.check_socket_path(paths)
    finally:
        server.close()


def test_the_system_daemon_socket_must_be_root_or_the_service_users(tmp_path):
    paths = system_paths({"GPUSCHED_SYSTEM_ROOT": str(tmp_path)})
    with pytest.raises(PermissionDenied, match=r"not to root or system\.service_user"):
        trust.require_trusted(12345, "its socket", paths)
    trust.require_trusted(0, "its socket", paths)


# -- logs opened as the user ------------------------------------------------------------------
def test_logs_are_never_opened_through_a_link_or_a_fifo(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    os.symlink(target, tmp_path / "link.log")
    with pytest.raises(OSError):
        privileges.open_log(str(tmp_path / "link.log"))
    os.mkfifo(tmp_path / "fifo.log")
    with pytest.raises(OSError):  # returns at once instead of waiting for a reader
        privileges.open_log(str(tmp_path / "fifo.log"))
    fd = privileges.open_log(str(tmp_path / "job.log"))
    os.close(fd)
    assert stat.S_IMODE(os.stat(tmp_path / "job.log").st_mode) == 0o600
    assert target.read_text() == "keep"


def test_the_log_root_must_be_writable_by_its_owner_only(tmp_path):
    root = tmp_path / "logs"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o775)
    me = privileges.identity_of(os.getuid())
    with pytest.raises(privileges.PrivilegeError, match="only it can write"):
        privileges.prepare_log_dir(str(root / me.name), me)
    os.chmod(root, 0o755)
    privileges.prepare_log_dir(str(root / me.name), me)
    assert stat.S_IMODE((root / me.name).stat().st_mode) == 0o700


# -- abuse limits ---------------------------------------------------------------------------
def _ping(path) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        try:
            protocol.send(sock, {"cmd": "ping"})
        except BrokenPipeError:  # refused and closed before the request went out
            pass
        return protocol.receive(sock) or {"ok": False}


def test_connections_per_uid_are_capped_and_freed_when_they_close(tmp_path):
    entered, release = threading.Event(), threading.Event()

    def dispatch(name, args, creds):
        entered.set()
        release.wait(10)
        return name

    path = tmp_path / "s.sock"
    server = SocketServer(path, dispatch, max_per_uid=1)
    server.start()
    try:
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        first.settimeout(10)
        first.connect(str(path))
        protocol.send(first, {"cmd": "status"})  # held open by the blocked dispatch
        # Two threads wait in accept(): until the first is admitted, the second might be
        # admitted before it, and the first refused.
        assert entered.wait(10)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second:
            second.settimeout(10)
            second.connect(str(path))
            reply = protocol.receive(second)
        assert reply["ok"] is False and "max_connections_per_uid" in reply["error"]["message"]
        release.set()
        assert protocol.receive(first)["result"] == "status"
        first.close()
        # Once the first connection's thread has ended, the uid may connect again.
        wait_until(lambda: _ping(path)["ok"], "a connection slot to free up")
    finally:
        release.set()
        server.close()


def test_exempt_uids_are_never_capped(tmp_path):
    path = tmp_path / "s.sock"
    server = SocketServer(path, lambda *a: None, max_per_uid=1, exempt_uids={os.getuid()})
    server.start()
    try:
        socks = []
        for _ in range(3):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(str(path))
            socks.append(sock)
        for sock in socks:
            protocol.send(sock, {"cmd": "ping"})
            assert protocol.receive(sock)["ok"] is True
            sock.close()
    finally:
        server.close()


# -- systemd units -----------------------------------------------------------------------------
def _gpusched(*args):
    return subprocess.run(
        [sys.executable, "-m", "gpusched", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["--system", "--user"])
def test_install_service_writes_the_unit_and_prints_the_next_commands(tmp_path, kind):
    proc = _gpusched("daemon", "install-service", kind, "--dir", str(tmp_path))
    if kind == "--system" and proc.returncode == 1 and "others can change" in proc.stderr:
        pytest.skip(f"this Python or checkout is not root's alone: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    # The unit the printed commands enable is the file written (once, they disagreed).
    enable = next(line for line in proc.stdout.splitlines() if "enable --now" in line)
    unit_file = tmp_path / f"{enable.split()[-1]}.service"
    assert [p.name for p in tmp_path.iterdir()] == [unit_file.name] == ["gpusched.service"]
    unit = unit_file.read_text()
    assert f"ExecStart={sys.executable} -m gpusched daemon run {kind}" in unit
    assert "KillMode=process" in unit and "Restart=on-failure" in unit
    assert "Environment=" not in unit
    prefix = "systemctl" if kind == "--system" else "systemctl --user"
    assert enable.strip() == f"{prefix} enable --now gpusched"
    assert ("loginctl enable-linger" in proc.stdout) == (kind == "--user")


@pytest.mark.e2e
def test_install_service_carries_the_home_and_simulated_gpus_it_was_given(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
        "GPUSCHED_HOME": "my home",
        "GPUSCHED_SIMULATE": "2x80GiB",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpusched",
            "daemon",
            "install-service",
            "--user",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    unit = (tmp_path / "gpusched.service").read_text()
    assert f'Environment="GPUSCHED_HOME={tmp_path}/my home"' in unit
    assert 'Environment="GPUSCHED_SIMULATE=2x80GiB"' in unit
    assert f"GPUSCHED_HOME={tmp_path}/my home GPUSCHED_SIMULATE=2x80GiB" in proc.stdout


@pytest.mark.e2e
def test_install_service_wants_exactly_one_kind(tmp_path):
    proc = _gpusched("daemon", "install-service", "--dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: choose one of --system and --user")
