"""The module boundaries of the README's "How the code is laid out", checked by walking every
import statement with ast."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpusched"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache  # each test asks about most modules: parse each once
def imports_of(module: str, at_run_time: bool = False) -> frozenset[str]:
    """Every module an import statement names, anywhere in the file (lazy imports too);
    at_run_time: not those under `if TYPE_CHECKING:`, which only a type checker reads."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if at_run_time
        and isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # `from gpusched import placement` imports the submodule gpusched.placement
            found.update(name for a in node.names if (name := f"{target}.{a.name}") in MODULES)
    return frozenset(found)


def ours(names: set[str]) -> set[str]:
    return {n for n in names if n == "gpusched" or n.startswith("gpusched.")}


def roots(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def importers_of(target: str) -> set[str]:
    return {
        m for m in MODULES if any(n == target or n.startswith(target + ".") for n in imports_of(m))
    }


def test_the_walk_sees_the_package():
    # Guards the guard: an empty walk would make every test below pass vacuously.
    assert {
        "gpusched.core.models",
        "gpusched.core.sched.placement",
        "gpusched.cli.app",
        "gpusched.proc.shim",
        "gpusched.gpus.nvml",
        "gpusched.daemon.loop",
    } <= set(MODULES)
    assert "typer" in roots(imports_of("gpusched.cli.app"))
    assert "gpusched.core.models" in imports_of("gpusched.core.sched.placement")
    assert "pynvml" in roots(imports_of("gpusched.gpus.nvml"))


def package_of(module: str) -> str:
    """gpusched.core.models -> core; gpusched.job -> job; gpusched -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


# What each layer may import of gpusched (README, "How the code is laid out"): its own
# package, the bare package (the version) and these. Everything may import core.
ALLOWED = {
    "core": set(),
    "gpus": {"core"},
    "proc": {"core"},
    "client": {"core"},
    "sim": {"core"},
    "tui": {"core", "client", "proc"},  # proc: its formats only (see below)
    "store": {"core", "proc", "client"},
    "daemon": {"core", "gpus", "proc", "client", "store", "job"},
    "cli": {"core", "gpus", "proc", "client", "daemon", "store", "tui", "sim", "mcp"},
    "mcp": {"core", "client", "proc"},  # a client of the daemon, as cli is
    "job": {"core", "proc"},
    "__main__": {"cli"},
}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(package):
    modules = [m for m in MODULES if package_of(m) == package]
    assert modules, package
    allowed = ALLOWED[package] | {package, ""}
    for module in modules:
        reached = {package_of(n) for n in ours(imports_of(module))}
        assert reached <= allowed, f"{module} imports {sorted(reached - allowed)}"


def test_the_tui_reads_only_the_formats_of_proc():
    # top parses /proc/PID/stat with the shim's parser; it never starts or signals a job.
    for module in (m for m in MODULES if package_of(m) == "tui"):
        reached = {n for n in ours(imports_of(module)) if package_of(n) == "proc"}
        assert reached <= {"gpusched.proc", "gpusched.proc.runfile"}, module


def test_every_module_is_in_a_layer():
    assert {package_of(m) for m in MODULES} - {""} <= set(ALLOWED)


def test_core_imports_only_the_standard_library():
    for module in (m for m in MODULES if package_of(m) == "core"):
        # tomli is tomllib before Python 3.11 (the design card names it as that fallback).
        outside = roots(imports_of(module)) - {"gpusched", "__future__", "tomli"}
        assert outside <= set(sys.stdlib_module_names), f"{module} imports {sorted(outside)}"


def test_the_pure_core_does_no_io():
    # Placement, scheduling, lifecycle and the model are pure functions over plain data:
    # no processes, files, sockets or clocks of the operating system.
    io = {"os", "socket", "subprocess", "psutil", "sqlite3", "pwd", "time", "threading"}
    for name in ("models", "sched.placement", "sched.scheduling", "lifecycle"):
        module = f"gpusched.core.{name}"
        assert not roots(imports_of(module)) & io, module


def test_only_the_nvml_backend_imports_pynvml():
    assert importers_of("pynvml") == {"gpusched.gpus.nvml"}


def cli_modules() -> set[str]:
    return {m for m in MODULES if package_of(m) == "cli"}


def test_only_cli_imports_typer():
    # helpformat is the command line's help (how typer's commands print it): part of the
    # CLI, as the cli/ package, and imported by cli alone.
    assert importers_of("typer") <= cli_modules()
    assert importers_of("typer") >= {"gpusched.cli.app", "gpusched.cli.helpformat"}
    assert importers_of("gpusched.cli.helpformat") <= cli_modules()
    assert importers_of("click") == set()


def test_nothing_imports_cli():
    # entry.py is the console script itself: it hands every command but a fast `submit`
    # to the cli's app, and `python -m gpusched` runs entry.py. Within cli, app.py gathers
    # the command modules, which never import it back.
    assert importers_of("gpusched.cli") <= cli_modules() | {"gpusched.__main__"}
    assert importers_of("gpusched.cli.app") <= {"gpusched.cli.entry"}


def module_level_imports(module: str) -> set[str]:
    """Imports that run when the module is imported (not those inside functions)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module or "")
        todo.extend(ast.iter_child_nodes(node))
    return found


def functions_importing(module: str, target: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return {
        fn.name
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(
            isinstance(n, ast.Import) and any(a.name.split(".")[0] == target for a in n.names)
            for n in ast.walk(fn)
        )
    }


def test_the_scheduler_never_imports_torch():
    # No module imports torch when it is imported ...
    for module in MODULES:
        assert "torch" not in roots(module_level_imports(module)), module
    # ... and the only lazy imports of it are in the helpers for job authors
    # (gpusched.job, which runs inside jobs), which no scheduler module calls.
    lazy = {m: functions_importing(m, "torch") for m in MODULES}
    lazy = {m: fns for m, fns in lazy.items() if fns}
    assert set(lazy) <= {"gpusched.job"}
    for module in MODULES:
        if module in lazy:
            continue
        nodes = list(ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))))
        names = {
            n.attr if isinstance(n, ast.Attribute) else n.id
            for n in nodes
            if isinstance(n, (ast.Name, ast.Attribute))
        }
        names |= {a.name for n in nodes if isinstance(n, ast.ImportFrom) for a in n.names}
        for fns in lazy.values():
            assert not names & fns, f"{module} uses {sorted(names & fns)}"


def test_shim_imports_only_the_standard_library():
    # The shim starts every job, so what it imports is every job's start-up time; and it
    # runs with -I -S, without site-packages. privileges: system mode's drop to the job's
    # user; spawn and runreport: the job's start and the runner's word to the daemon,
    # shared with the supervisor; jobexec: the job's program found on its PATH; runfile:
    # the formats it writes.
    # All standard library only, and none loads the costly modules below.
    allowed_ours = {
        "gpusched",
        "gpusched.proc",
        "gpusched.proc.privileges",
        "gpusched.proc.spawn",
        "gpusched.proc.runreport",
        "gpusched.proc.jobexec",
        "gpusched.proc.jobtree",
        "gpusched.proc.runfile",
        "gpusched.proc.logcap",
        "gpusched.proc.ptyhost",  # a --pty job's terminal, and the wire to attach
        "gpusched.proc.ptywire",
        "gpusched.core",
        "gpusched.core.logmark",
        "gpusched.proc.containerrun",
        "gpusched.core.spec",  # a docstring only
        "gpusched.core.spec.container",
    }
    costly = {"dataclasses", "typing", "pathlib"}
    seen, todo = set(), ["gpusched.proc.shim"]
    while todo:
        module = todo.pop()
        seen.add(module)
        names = imports_of(module, at_run_time=True)
        mine = ours(names) - {"gpusched"}
        assert mine <= allowed_ours, f"{module} imports {sorted(mine - allowed_ours)}"
        others = roots(names) - {"gpusched", "__future__"}
        assert others <= set(sys.stdlib_module_names), f"{module} imports {sorted(others)}"
        assert not others & costly, f"{module} imports {sorted(others & costly)}"
        todo += [m for m in ours(names) if m in MODULES and m not in seen]
    assert (
        allowed_ours - {"gpusched", "gpusched.proc", "gpusched.core.spec"} | {"gpusched.proc.shim"}
        <= seen
    )


def test_the_command_line_modules_stay_small():
    # The command line was once one module of 700 lines; its commands now live in modules
    # by topic (*_cmds.py), gathered by app.py, each small enough to read at once.
    for module in cli_modules():
        lines = MODULES[module].read_text(encoding="utf-8").count("\n")
        assert lines <= 300, f"{module} has {lines} lines"


def test_a_users_name_is_looked_up_in_one_place():
    # core.users names a uid for everyone. The others read a whole password entry: the
    # shim's identity for the job (stdlib only), and the admin group's members.
    readers = {m for m in MODULES if "getpwuid(" in MODULES[m].read_text(encoding="utf-8")}
    assert readers <= {
        "gpusched.core.users",
        "gpusched.proc.privileges",
        "gpusched.daemon.requests.authz",
    }


def import_cycles() -> list[set[str]]:
    """Groups of our modules that import each other, round a cycle (Tarjan's SCCs)."""
    graph = {m: {n for n in ours(imports_of(m)) if n in MODULES and n != m} for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = set()
            while not group or module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                found.append(group)

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_the_tui_modules_import_each_other_without_a_cycle():
    # The snapshot types live in tui.model, which imports no other tui module: the
    # snapshot source, the render and the loop all build on it.
    assert not [group for group in import_cycles() if any(package_of(m) == "tui" for m in group)]
    assert not {m for m in ours(imports_of("gpusched.tui.model")) if package_of(m) == "tui"}


def test_the_simulator_only_computes():
    # `gpusched simulate` prints the metrics (cli/commands/simulate.py); sim/ writes nothing out.
    for module in (m for m in MODULES if package_of(m) == "sim"):
        text = MODULES[module].read_text(encoding="utf-8")
        assert not {"sys", "json", "rich"} & roots(imports_of(module)), module
        assert "print(" not in text and "stdout" not in text, module
