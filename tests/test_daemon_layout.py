"""The daemon's parts, as the README's "How the code is laid out" draws them: one state
object handed to request handling and job control, which hold no reference to the loop or
to each other; one process seam; one place that builds the reply envelope."""

from __future__ import annotations

import ast

from test_boundaries import MODULES, importers_of, imports_of

LOOP = "gpusched.daemon.loop"
REQUEST_HANDLING = {
    "gpusched.daemon.requests.handlers",
    "gpusched.daemon.requests.queries",
    "gpusched.daemon.requests.changes",
    "gpusched.daemon.requests.submits",
    "gpusched.daemon.requests.request",
}


def test_only_the_loop_and_the_cli_know_the_loop():
    # A handler that imports the loop (even for a type) can reach back into it.
    # `gpusched daemon run` and `python -m gpusched.daemon` (what a client starts): startup
    # runs the loop; the cli only knows startup.
    assert importers_of(LOOP) <= {"gpusched.daemon.startup"}
    assert importers_of("gpusched.daemon.startup") <= {
        "gpusched.cli.commands.daemon_cmds",
        "gpusched.daemon.__main__",
    }


def test_request_handling_and_job_control_do_not_know_each_other():
    assert importers_of("gpusched.daemon.jobs.control") <= {LOOP}
    assert importers_of("gpusched.daemon.requests.handlers") <= {LOOP}
    for kind in ("queries", "changes", "submits"):  # one module per kind of request
        assert importers_of(f"gpusched.daemon.{kind}") <= {"gpusched.daemon.requests.handlers"}, (
            kind
        )
    # Request, Waiter and the id lookups: the loop hands requests over (its calls) and
    # answers waits.
    assert importers_of("gpusched.daemon.requests.request") <= REQUEST_HANDLING | {
        LOOP,
        "gpusched.daemon.requests.calls",
    }


def test_processes_are_reached_through_the_seam_only():
    # psutil in the daemon: its own host figures (status), never a job's processes.
    assert importers_of("gpusched.proc.seam") <= {
        "gpusched.daemon.loop",
        "gpusched.daemon.jobs.control",
        # job control's part for dead shims
        "gpusched.daemon.jobs.lostrunners",
        # stopping runs to requeue them, and
        # preempting (job control's parts)
        "gpusched.daemon.jobs.requeue",
        "gpusched.daemon.jobs.preempt",
        # idle GPUs warned, cancelled, requeued
        "gpusched.daemon.jobs.idlegpus",
        # jobs over their --gpu-mem stopped, requeued
        "gpusched.daemon.jobs.gpuover",
        "gpusched.daemon.requests.changes",
        "gpusched.daemon.requests.handlers",
    }
    for module in importers_of("psutil"):
        assert not module.startswith("gpusched.daemon.") or module in {
            "gpusched.daemon.host",
            "gpusched.daemon.requests.queries",
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
    assert built == {"gpusched.daemon.requests.server": {"reply"}}


# What each of the daemon's folders may import of the rest of the daemon (their __init__
# docstrings say why): a folder, or one module of it. The top level (the loop, startup,
# state) may import them all.
DAEMON_FOLDERS = {
    "requests": {"state", "jobs", "observe.usage", "services"},
    "jobs": {"state", "host", "requests.batches"},
    "observe": {
        "state",
        "jobs.idlegpus",
        "jobs.progress",
        "jobs.retention",
        "requests.batches",
        "services.metrics",
    },
    "services": {"state"},
    "slurm": {"state"},
}


def _daemon_part(module: str) -> str | None:
    """gpusched.daemon.jobs.control -> jobs.control; gpusched.daemon.state -> state."""
    parts = module.split(".")
    return ".".join(parts[2:]) if parts[:2] == ["gpusched", "daemon"] and parts[2:] else None


def test_each_daemon_folder_imports_only_what_its_docstring_names():
    assert {m.split(".")[2] for m in MODULES if m.count(".") == 3} >= set(DAEMON_FOLDERS)
    for module in MODULES:
        folder = (_daemon_part(module) or "").partition(".")[0]
        if folder not in DAEMON_FOLDERS:
            continue
        allowed = DAEMON_FOLDERS[folder] | {folder}
        for name in imports_of(module):
            part = _daemon_part(name)
            if part is None or name not in MODULES or MODULES[name].name == "__init__.py":
                continue
            assert any(part == a or part.startswith(a + ".") for a in allowed), (
                f"{module} imports {name}"
            )


def _through_the_state(node: ast.expr) -> bool:
    """Whether an object is reached through the state: `state.x`, `self.state.clusters`."""
    while isinstance(node, ast.Attribute):
        if node.attr in ("state", "_state"):
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("state", "_state")


def _read_out() -> set[str]:
    """The state's properties: what it gives out to read, and changes by its methods only."""
    tree = ast.parse(MODULES["gpusched.daemon.state"].read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d) == "property" for d in node.decorator_list)
    }


_READ_OUT = _read_out()
_CHANGES = {"append", "extend", "insert", "remove", "pop", "clear", "add", "discard", "update"}
_CHANGES |= {"setdefault", "__setitem__", "__delitem__"}


def _each_target(targets: list[ast.expr]) -> list[ast.expr]:
    """The targets, with those of `a, b = ...` and `*rest` each on its own."""
    out: list[ast.expr] = []
    for target in targets:
        if isinstance(target, ast.Tuple | ast.List):
            out += _each_target(target.elts)
        else:
            out.append(target.value if isinstance(target, ast.Starred) else target)
    return out


def _state_writes(path) -> list[str]:
    """Each `<the state, or an object it holds>.attr` the module assigns or deletes."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in _each_target(targets):
                if isinstance(target, ast.Attribute | ast.Subscript):
                    if _through_the_state(target.value):
                        found.append(f"{ast.unparse(target)} (line {target.lineno})")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "delattr"):
            if node.args and _through_the_state(node.args[0]):
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            held = node.func.value  # state.incoming.append(ids): a list the state reads out
            if (
                node.func.attr in _CHANGES
                and isinstance(held, ast.Attribute)
                and held.attr in _READ_OUT
                and _through_the_state(held.value)
            ):
                found.append(f"{ast.unparse(node.func)} (line {node.lineno})")
    return found


def test_only_the_state_sets_its_attributes():
    # Each subsystem owns its part of the state: the state's attributes change in
    # daemon/state.py only, through a method named for the change (state.note_gpus), and
    # the parts it holds (state.clusters) change through their own methods.
    writes = {
        module: found
        for module, path in MODULES.items()
        if module.startswith("gpusched.daemon.")
        and module != "gpusched.daemon.state"
        and (found := _state_writes(path))
    }
    assert writes == {}


def test_the_state_check_sees_each_way_of_setting_an_attribute(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "state.stopping = True\n"
        "self.state.inventory, x = inv, 1\n"
        "self._state.n += 1\n"
        "daemon.state.clusters.wake_loop = f\n"
        "setattr(self.state, 'draining', True)\n"
        "del state.x\n"
        "state.pid_jobs[1] = 2\n"
        "self.state.incoming.append(ids)\n"
        "self.state.store.update(job)\n"
        "self.stateful = 1\n"
        "job.state = 2\n"
    )
    assert len(_state_writes(source)) == 8
