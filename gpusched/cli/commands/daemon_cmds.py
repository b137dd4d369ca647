"""`gpusched daemon ...`: run, start, stop, restart, status and install-service."""

from __future__ import annotations

from pathlib import Path

import typer

from gpusched.cli.common import JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.cli.systemd import carried, install, next_commands
from gpusched.cli.views import statusview
from gpusched.client.connection import Client, start_daemon, wait_for_exit
from gpusched.client.submit.submitting import print_json
from gpusched.core.errors import DaemonUnavailable, GpuschedError, UsageError

app = App(
    no_args_is_help=True,
    help="Start, stop and inspect the daemon.\n\nExample: gpusched daemon status",
)


@app.command("run")
def daemon_run(
    system: bool = typer.Option(
        False, "--system", help="One daemon for all users (as root): docs/shared-server.md."
    ),
    user: bool = typer.Option(
        False,
        "--user",
        hidden=True,
        help="This user's daemon even if the system config says system.",
    ),
) -> None:
    """Run the daemon in the foreground (for systemd).

    Example: gpusched daemon run --system
    """
    # the daemon: 170 ms of every other command through typer
    from gpusched.daemon.startup import serve_command  # noqa: PLC0415

    if system and user:
        raise UsageError("choose one of --system and --user")
    serve_command(system, user)


@app.command("start")
def daemon_start() -> None:
    """Start the daemon in the background.

    Any command starts it when none runs; this does only that.

    Example: GPUSCHED_SIMULATE=4x80GiB gpusched daemon start
    """
    client = Client()
    if client.is_running():
        status = client.call("status")
        out.print(f"gpusched daemon already running (pid {status['pid']})")
        return
    if client.paths.mode != "user":
        raise DaemonUnavailable(client.not_running_message())
    out.print(f"gpusched daemon started (pid {_start_daemon(client)})")


@app.command("stop")
def daemon_stop() -> None:
    """Stop the daemon; running jobs keep running.

    The next daemon re-adopts them.

    Example: gpusched daemon stop
    """
    left = _stop_daemon(Client(autostart=False, check_daemon=False))
    if left is None:
        out.print("gpusched daemon is not running")
    else:
        out.print(f"gpusched daemon stopped; {left} running job(s) left running")


@app.command("restart")
def daemon_restart() -> None:
    """Restart the daemon with this environment and config file.

    The new daemon reads GPUSCHED_SIMULATE and the config as they are now; running jobs
    keep running and the new daemon re-adopts them.

    Example: gpusched daemon restart
    """
    client = Client(autostart=False, check_daemon=False)
    if client.paths.is_system:
        raise GpuschedError(
            "the system daemon is systemd's to restart: run `sudo systemctl "
            "restart gpusched` (running jobs keep running)"
        )
    if client.paths.mode != "user":
        raise GpuschedError(
            f"gpusched does not start the daemon at GPUSCHED_SOCKET="
            f"{client.paths.socket}; restart it where it was started"
        )
    left = _stop_daemon(client)
    pid = _start_daemon(client)
    if left is None:
        out.print(f"gpusched daemon started (pid {pid}); none was running")
    else:
        out.print(f"gpusched daemon restarted (pid {pid}); {left} running job(s) kept running")


def _start_daemon(client: Client) -> int:
    """Start the user daemon and wait until it answers; its pid."""
    client.wait_until_up(daemon=start_daemon(client.paths)).close()
    pid: int = client.call("status")["pid"]
    return pid


def _stop_daemon(client: Client) -> int | None:
    """Stop the running daemon and wait for it to exit: how many running jobs it left
    running, or None when none was running."""
    if not client.is_running():
        return None
    pid = client.call("status")["pid"]
    result = client.call("stop")
    if not wait_for_exit(pid, 30.0):
        raise GpuschedError(f"the daemon (pid {pid}) did not stop within 30 s")
    left: int = result["running_jobs_left"]
    return left


@app.command("status")
def daemon_status(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Whether the daemon runs, and what it sees.

    A "writes: FAILING" line says why the daemon cannot write its queue (a full disk,
    a lock held by another process): submits and changes are refused until it can.
    The "metrics:" line says where Prometheus metrics are served ([metrics] listen in
    the config), "off", or why they cannot be. Exit status 3 when it does not run.

    Example: gpusched daemon status --json
    """
    client = Client(autostart=False)
    which = client.paths.mode  # user, system, or socket (GPUSCHED_SOCKET)
    if not client.is_running():
        if as_json:
            print_json({"running": False, "daemon": which, "socket": str(client.paths.socket)})
        else:
            out.print(
                f"gpusched daemon is not running ({which} daemon, socket {client.paths.socket})"
            )
        raise typer.Exit(3)
    status = client.call("status")
    if as_json:
        # The daemon's "running" is its count of running jobs; here "running" says whether
        # the daemon runs, as in the not-running case, and the counts get their own names.
        print_json(
            {
                **status,
                "running": True,
                "running_jobs": status["running"],
                "pending_jobs": status["pending"],
                "daemon": which,
            }
        )
    else:
        out.print(f"using the {which} daemon at {client.paths.socket}", markup=False)
        out.print("\n".join(statusview.status_lines(status)), markup=False)


@app.command("install-service")
def daemon_install_service(
    system: bool = typer.Option(False, "--system", help="The root daemon for all users."),
    user: bool = typer.Option(False, "--user", help="Your own daemon, under systemd --user."),
    directory: Path | None = typer.Option(
        None, "--dir", help="Write the unit here instead of systemd's directory."
    ),
) -> None:
    """Write the systemd unit and print how to enable it.

    Example: sudo gpusched daemon install-service --system
    """
    if system == user:
        raise UsageError("choose one of --system and --user")
    path = install(system, directory)
    kept = carried()
    if kept:
        out.print(
            "the unit runs the daemon with " + " ".join(f"{k}={v}" for k, v in kept.items()),
            markup=False,
        )
    out.print(f"wrote {path}; now run:", markup=False)
    for command in next_commands(system):
        out.print(f"  {command}", markup=False)
