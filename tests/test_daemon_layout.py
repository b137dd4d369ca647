"""The daemon's parts, as the README's "How the code is laid out" draws them: one state
object handed to request handling and job control, which hold no reference to the loop or
to each other; one process seam; one place that builds the reply envelope."""

from __future__ import annotations

import ast

from test_boundaries import MODULES, importers_of

LOOP = "gpusched.daemon.loop"
REQUEST_HANDLING = {
    "gpusched.daemon.handlers",
    "gpusched.daemon.queries",
    "gpusched.daemon.changes",
    "gpusched.daemon.submits",
    "gpusched.daemon.request",
}


def test_only_the_loop_and_the_cli_know_the_loop():
    # A handler that imports the loop (even for a type) can reach back into it.
    # `gpusched daemon run` and `python -m gpusched.daemon` (what a client starts): startup
    # runs the loop; the cli only knows startup.
    assert importers_of(LOOP) <= {"gpusched.daemon.startup"}
    assert importers_of("gpusched.daemon.startup") <= {
        "gpusched.cli.daemon_cmds",
        "gpusched.daemon.__main__",
    }


def test_request_handling_and_job_control_do_not_know_each_other():
    assert importers_of("gpusched.daemon.jobcontrol") <= {LOOP}
    assert importers_of("gpusched.daemon.handlers") <= {LOOP}
    for kind in ("queries", "changes", "submits"):  # one module per kind of request
        assert importers_of(f"gpusched.daemon.{kind}") <= {"gpusched.daemon.handlers"}, kind
    # Request, Waiter and the id lookups: the loop hands requests over (its calls) and
    # answers waits.
    assert importers_of("gpusched.daemon.request") <= REQUEST_HANDLING | {
        LOOP,
        "gpusched.daemon.calls",
    }


def test_processes_are_reached_through_the_seam_only():
    # psutil in the daemon: its own host figures (status), never a job's processes.
    assert importers_of("gpusched.proc.seam") <= {
        "gpusched.daemon.loop",
        "gpusched.daemon.jobcontrol",
        # job control's part for dead shims
        "gpusched.daemon.shimloss",
        # stopping runs to requeue them, and
        # preempting (job control's parts)
        "gpusched.daemon.requeue",
        "gpusched.daemon.preempt",
        # idle GPUs warned, cancelled, requeued
        "gpusched.daemon.idlegpus",
        "gpusched.daemon.changes",
        "gpusched.daemon.handlers",
    }
    for module in importers_of("psutil"):
        assert not module.startswith("gpusched.daemon.") or module in {
            "gpusched.daemon.host",
            "gpusched.daemon.queries",
        }, module


def _envelopes(module: str) -> set[str]:
    """The functions of a module that write a dict literal with an "ok" key."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Dict) and any(
                    isinstance(k, ast.Constant) and k.value == "ok" for k in node.keys
                ):
                    found.add(fn.name)
    return found


def test_the_reply_envelope_is_built_in_one_place():
    daemon = [m for m in MODULES if m.startswith("gpusched.daemon.")]
    built = {m: names for m in daemon if (names := _envelopes(m))}
    assert built == {"gpusched.daemon.server": {"reply"}}
