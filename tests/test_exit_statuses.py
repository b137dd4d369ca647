"""Exit statuses through the real CLI: a refused change exits 1, and every command does
the same when its standard output is closed or its reader has left."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import typer

from conftest import Home, wait_until
from gpusched.cli.app import app
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths

pytestmark = pytest.mark.e2e


def _state(home: Home, job_id: int) -> dict:
    return Client(resolve_paths(home.env), autostart=False).call("show", ids=[job_id])["jobs"][0]


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    """A daemon with a finished job, a running job, and a held job that waits for it."""
    root = tmp_path_factory.mktemp("statuses")
    home = Home(root / "home")
    home.write_config()
    gate = root / "go"
    home.finished = home.submit("--", "echo", "hello")
    home.running = home.submit(
        "--", "sh", "-c", f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done"
    )
    home.terminal = home.submit("--pty", "--", "sh", "-c", "echo hello; sleep 300")
    # Held, and after the running job: releasing it (as the test does) never starts it.
    home.held = home.submit("--hold", "--after", str(home.running), "--", "true")
    wait_until(
        lambda: (
            _state(home, home.finished)["state"] == "succeeded"
            and _state(home, home.running)["state"] == "running"
            and _state(home, home.terminal)["state"] == "running"
        ),
        "the queue to settle",
    )
    home.tmp = root / "tmp"  # where `demo` makes its home, to check that it cleans up
    home.tmp.mkdir()
    home.env["TMPDIR"] = str(home.tmp)
    home.trace = root / "trace.csv"
    home.trace.write_text("job_id,user,submit_s,num_gpus,duration_s\n1,ann,0,1,60\n")
    yield home
    gate.touch()
    home.cleanup()


# -- refused changes ------------------------------------------------------------------------
def test_a_refused_hold_release_or_update_exits_1_with_the_reason_on_stderr(queue):
    home = queue
    for args in (
        ("hold", str(home.running)),
        ("release", str(home.running)),
        ("update", str(home.finished), "--priority", "3"),
    ):
        proc = home.run(*args, check=False)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        assert proc.stderr.startswith(f"Error: job {args[1]}: ") and proc.stderr.count("\n") == 1
    assert (
        "only pending jobs can be held or released"
        in home.run("hold", str(home.running), check=False).stderr
    )


def test_a_mixed_change_prints_every_outcome_changes_what_it_can_and_exits_1(queue):
    home = queue
    proc = home.run("update", str(home.held), str(home.finished), "--priority", "7", check=False)
    assert proc.returncode == 1
    assert proc.stdout == f"job {home.held}: priority 7\n"
    assert proc.stderr == (
        f"Error: job {home.finished}: already succeeded; only pending and "
        "running jobs can be updated\n"
    )
    assert _state(home, home.held)["priority"] == 7
    proc = home.run("hold", str(home.held), str(home.running), check=False)
    assert (proc.returncode, proc.stdout) == (1, f"job {home.held}: held\n")
    assert (
        proc.stderr
        == f"Error: job {home.running}: running; only pending jobs can be held or released\n"
    )


def test_cancelling_a_job_that_already_ended_is_not_an_error(queue):
    """As scancel: the job is not running, which is what was asked."""
    proc = queue.run("cancel", str(queue.finished))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"job {queue.finished}: already succeeded\n",
        "",
    )


# -- standard output closed, or its reader gone ----------------------------------------------
def commands(home: Home) -> list[list[str]]:
    """One call of every command that prints something, with arguments that work."""
    job, held = str(home.finished), str(home.held)
    return [
        ["submit", "--", "true"],  # the fast path
        ["submit", "-c1", "--", "true"],  # a form the fast path leaves to the full parser
        ["ls"],
        ["ls", "--json"],
        ["show", job],
        ["show", "--json", job],
        ["resubmit", "--hold", job],
        ["_job-ids", "all"],
        ["cancel", job],
        ["hold", held],
        ["release", held],
        ["update", held, "--priority", "1"],
        ["drain"],
        ["resume"],
        ["logs", job],
        ["logs", "--follow", job],
        ["attach", str(home.terminal)],  # its scrollback, then its output as it comes
        ["env", job],
        ["env", "--json", job],
        ["gpus"],
        ["gpus", "--json"],
        ["gpus", "--format", "csv"],
        ["gpus", "--query", "index,name"],
        ["top", "--once"],
        ["top"],
        ["simulate", str(home.trace)],
        ["demo"],
        ["completions", "bash"],
        ["man"],
        ["daemon", "status"],
        ["daemon", "status", "--json"],
        ["daemon", "start"],
        ["daemon", "install-service", "--user", "--dir", str(home.path)],
        ["doctor"],
        ["doctor", "--json"],
        ["gc", "--dry-run"],
        ["gc", "--dry-run", "--json"],
        ["usage"],
        ["usage", "--since", "7d", "--json"],
        ["history", "true"],
        ["history", "--json", "true"],
        ["--version"],
        ["--help"],
        ["submit", "--help"],
        ["daemon", "--help"],
        ["mcp", "--help"],  # serving speaks on stdout only to a client that wrote first
        # The running job goes back to the queue and starts again in the same pass: it is
        # never seen pending (which these two refuse).
        ["preempt", str(home.running)],
        ["requeue", str(home.running)],
        # Services: a listing for real (none here), the rest by their help (a create or a
        # delete would not be the same the second time round).
        ["service", "ls"],
        ["service", "ls", "--json"],
        ["service", "create", "--help"],
        ["service", "show", "--help"],
        ["service", "scale", "--help"],
        ["service", "update", "--help"],
        ["service", "delete", "--help"],
        # Reservations: the same.
        ["reserve", "ls"],
        ["reserve", "ls", "--json"],
        ["reserve", "create", "--help"],
        ["reserve", "show", "--help"],
        ["reserve", "delete", "--help"],
        # Last: they stop the daemon (the next command starts it again).
        ["daemon", "restart"],
        ["daemon", "stop"],
    ]


# Commands that print nothing on standard output, so neither way touches them.
SILENT = {("wait",), ("daemon", "run")}


def leaf_commands(group: object, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every command of the command line, hidden ones too: ("ls",), ("daemon", "start")."""
    out: set[tuple[str, ...]] = set()
    for name, command in getattr(group, "commands", {}).items():
        if getattr(command, "commands", None) is not None:
            out |= leaf_commands(command, prefix + (name,))
        else:
            out.add(prefix + (name,))
    return out


def test_every_command_is_in_the_closed_output_test(queue):
    covered = {tuple(a for a in args[:2] if not a.startswith("-")) for args in commands(queue)}
    groups = (("daemon",), ("service",), ("reserve",))
    covered = {c if c[:1] in groups else c[:1] for c in covered}
    missing = leaf_commands(typer.main.get_command(app)) - covered - SILENT
    assert not missing, f"add these commands to commands() above: {sorted(missing)}"


def run_with_stdout(home: Home, args: list[str], how: str) -> subprocess.CompletedProcess:
    if how == "closed":  # `gpusched ... >&-`
        return subprocess.run(
            ["sh", "-c", 'exec "$0" -m gpusched "$@" >&-', sys.executable, *args],
            env=home.env,
            cwd=home.path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    read_end, write_end = os.pipe()  # `| head -1`, once head has read its line and left
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "gpusched", *args],
            env=home.env,
            cwd=home.path,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("how", ["closed", "reader gone"])
def test_every_command_stops_with_status_1_and_nothing_on_stderr_when_its_output_fails(queue, how):
    """README, Exit codes: status 1 and no message; only submit (and resubmit) names what
    it queued."""
    failures = []
    for args in commands(queue):
        proc = run_with_stdout(queue, args, how)
        expected = ""
        if args[0] in ("submit", "resubmit") and "--help" not in args:
            queued = max(j["id"] for j in queue.jobs())
            expected = (
                f"Error: queued job {queued}, but could not print its id: standard "
                "output is closed\n"
            )
        if (proc.returncode, proc.stderr) != (1, expected):
            failures.append(
                f"gpusched {' '.join(args)}: status {proc.returncode}, stderr {proc.stderr!r}"
            )
    assert not failures, "\n".join(failures)
    assert list(queue.tmp.iterdir()) == []  # the demo removed its home all the same
