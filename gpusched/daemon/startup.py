"""A daemon process from start to stop (`gpusched daemon run`): its config and GPUs, the
state directory's lock, the store, the sockets and threads around the loop (daemon/loop.py),
its signals, and the order they are closed in."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Any

from filelock import FileLock, Timeout

from gpusched import __version__
from gpusched.client import drift
from gpusched.client.modes import daemon_paths, ensure_public_dir
from gpusched.client.paths import Paths, ensure_private_dir
from gpusched.core.config import Settings, load_settings
from gpusched.core.errors import ConfigError, GpuschedError
from gpusched.core.slurm.clusterconf import refuse_in_system_mode
from gpusched.core.spec import limits
from gpusched.daemon.loop import Daemon
from gpusched.daemon.observe.metrics import serve_metrics
from gpusched.daemon.requests.server import SocketServer, WakeListener, file_identity
from gpusched.gpus import open_backend
from gpusched.proc import runfile
from gpusched.store.checkpoints import Checkpointer
from gpusched.store.database import Store

log = logging.getLogger("gpusched.daemon.loop")


def serve_command(system: bool, user: bool) -> None:
    """`gpusched daemon run [--system|--user]` and `python -m gpusched.daemon` (--user)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    serve(daemon_paths(system, user))


def serve(paths: Paths) -> None:
    """`gpusched daemon run`: load the config, open the GPU backend, run until stopped."""
    config = drift.config_stamp(paths.config_file)  # before reading it: a later change shows
    settings = load_settings(paths.config_file)
    check_mode(paths, settings)
    backend = open_backend(settings.simulate, paths.sim_processes)
    configured = load_settings(paths.config_file, environ={}).simulate
    run(
        Daemon(
            paths,
            settings,
            backend,
            drift.fingerprint(config, settings.simulate, configured, dict(os.environ)),
        )
    )


def check_mode(paths: Paths, settings: Settings) -> None:
    """A system config read by a user daemon, a system daemon that cannot switch users, or
    one asked to hand jobs to a cluster."""
    if settings.mode == "system" and not paths.is_system:
        raise ConfigError(
            f'{paths.config_file}: daemon.mode is "system", but this is a user '
            "daemon's config; put it in /etc/gpusched/gpusched.toml or run "
            "`gpusched daemon run --system` as root."
        )
    if paths.is_system and os.geteuid() != 0 and not settings.service_user:
        raise ConfigError(
            "system mode starts every job as its submitter, which needs root; "
            "run `gpusched daemon run --system` as root (the systemd unit does), "
            "or set system.service_user for a user with CAP_SETUID and CAP_SETGID."
        )
    if paths.is_system:
        refuse_in_system_mode(settings.clusters, paths.config_file)


def run(daemon: Daemon) -> None:
    """Run in the foreground until stopped; raises GpuschedError if it cannot start."""
    paths, settings = daemon.paths, daemon.settings
    prepare_dirs(paths)
    lock = FileLock(str(paths.lock), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise GpuschedError(
            f"a gpusched daemon already runs for {paths.state_dir}; use `gpusched daemon status`."
        ) from None
    try:
        store = Store(paths.db, paths.jobs_dir)
        # System mode: anyone may connect; who they are comes from SO_PEERCRED.
        server = SocketServer(
            paths.socket,
            daemon.calls.dispatch,
            mode=0o666 if paths.is_system else 0o600,
            max_per_uid=settings.max_connections_per_uid,
            exempt_uids={0, os.getuid()},
            stamp=daemon.fingerprint,
            max_json_depth=settings.limit_json_depth,
            limits=limits.from_settings(settings),
        )
        checkpoints = Checkpointer(str(paths.db))  # off the loop's thread
        checkpoints.attach(store)
        try:
            daemon.attach(store)
            install_signal_handlers(daemon)
            # Submit refuses requests no GPU here could ever take: know the GPUs before
            # the first request, which may come the moment the socket listens.
            daemon.take_over()
            server.start()
            daemon.home_watch = HomeWatch((paths.socket, paths.lock), daemon.clock)
            metrics = serve_metrics(daemon.state, daemon.setup)
            wake = WakeListener(paths.wake_socket, daemon.wake)
            daemon.answer_shim = wake.answer
            log.info(
                "gpusched %s daemon started (pid %d, backend %s)",
                __version__,
                os.getpid(),
                daemon.backend.name,
            )
            try:
                daemon.loop()
                daemon.save_usage()
            finally:
                wake.close()
                metrics.close()
                daemon.handlers.services.close()
                daemon.state.notifier.close()
                daemon.state.mps.stop(len(daemon.state.running()))
        finally:
            server.close()
            daemon.answer_everyone()
            server.drain()  # those answers, and the one to `stop`, reach their clients
            daemon.seam.close()  # running shims are in sessions of their own: unaffected
            checkpoints.close()
            store.close()
            daemon.backend.close()
    finally:
        lock.release()


# How often the loop looks at its socket and lock file (a stat each).
HOME_CHECK_S = 5.0


class HomeWatch:
    """The socket and lock file this daemon made, by inode. Once one is gone (its home
    was deleted) or replaced (a daemon started there since), no client can reach this
    daemon, and another may run on the same queue path: it stops, as at any stop leaving
    running jobs to their shims."""

    def __init__(self, paths: tuple[str, ...], clock: Any):
        self.clock, self.next_check = clock, clock.monotonic() + HOME_CHECK_S
        self.identities = {path: file_identity(path) for path in paths}

    def lost(self) -> str | None:
        """Why this daemon can no longer be reached, once one of the files changed."""
        now = self.clock.monotonic()
        if now < self.next_check:
            return None
        self.next_check = now + HOME_CHECK_S
        for path, identity in self.identities.items():
            found = file_identity(path)
            if found != identity:
                return (
                    f"{path} is gone"
                    if found is None
                    else f"{path} is another file now (a daemon started there since?)"
                )
        return None


def prepare_dirs(paths: Paths) -> None:
    """State always private; in system mode the socket's and the logs' parents are
    readable by all and writable by the daemon only."""
    ensure_private_dir(paths.state_dir)
    if paths.is_system:
        ensure_public_dir(paths.run_dir)
        if paths.log_root is not None:
            ensure_public_dir(paths.log_root)
    else:
        ensure_private_dir(paths.run_dir)


def install_signal_handlers(daemon: Daemon) -> None:
    def stop(_signum: int, _frame: object) -> None:
        daemon.state.note_stopping()
        poke(daemon.paths.wake_socket)  # end the loop's wait now, not at its next deadline

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)


def poke(wake_socket: str) -> None:
    """A wake-up datagram to the daemon's own wake socket: safe in a signal handler, where
    putting on the call queue could wait for a lock the interrupted code holds."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(runfile.WAKE, socket.MSG_DONTWAIT, wake_socket)
    except OSError:
        pass  # not listening yet: the loop sees `stopping` at its next turn
