"""Damaged queue files: the daemon refuses what it cannot trust and leaves it byte-identical,
opens what is intact (an old schema it migrates, a stray -shm that lost nothing), and
quarantines a bad row instead of dying of it."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reliability import variants
from reliability.harness import Figures, Home, python_for_others

GOOD_JOBS = ("k0", "k1", "k2")  # held jobs in every intact queue
CRASH_JOBS = ("w0", "w1")  # held jobs only in the -wal of a crashed daemon
# Words that must not be in the refusal: what it says of the file would be wrong.
MISLEADING = {"unreadable": "corrupt", "directory": "corrupt", "fifo": "corrupt"}


def fingerprint(state: Path) -> dict[str, str]:
    """Every queue.db* entry: its kind and content hash (a link: where it points, and
    what is there)."""
    out = {}
    for entry in sorted(state.glob("queue.db*")):
        if entry.is_symlink():
            target = Path(os.readlink(entry))
            out[entry.name] = f"link {target} " + fingerprint_file(target)
        else:
            out[entry.name] = fingerprint_file(entry)
    return out


def fingerprint_file(path: Path) -> str:
    if not os.path.lexists(path):
        return "absent"
    if path.is_dir():
        return "dir"
    if not path.is_file():
        return "special"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_sources() -> tuple[Path, Path]:
    """An intact queue after a clean stop, and one a SIGKILLed daemon left with a -wal."""
    home = Home("qsrc")
    try:
        home.start()
        for name in GOOD_JOBS:
            home.cli("submit", "--hold", "--name", name, "--", "true")
        home.cli("daemon", "stop")
        clean = home.path / "clean"
        clean.mkdir()
        for name in ("queue.db", "queue.db.created"):  # the note that a queue was made here
            shutil.copy2(home.state / name, clean / name)
        home.start()
        for name in CRASH_JOBS:
            home.cli("submit", "--hold", "--name", name, "--", "true")
        home.kill_daemon()
        crashed = home.path / "crashed"
        crashed.mkdir()
        for entry in home.state.glob("queue.db*"):
            shutil.copy2(entry, crashed / entry.name)
    finally:
        home.close()
    return clean, crashed


def _start(home: Home, as_nobody: bool) -> subprocess.CompletedProcess:
    if not as_nobody:
        return home.cli("daemon", "start", timeout_s=90)
    python, path = python_for_others() or ("", "")
    env = {**home.env, "PYTHONPATH": path, "HOME": str(home.path)}
    try:
        return subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                python,
                "-m",
                "gpusched",
                "daemon",
                "start",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            cwd="/",
        )
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, 124, "", "timed out")


def _try(name: str, expect: str, build: Callable[[Path], None], fig: Figures) -> None:
    """Start a daemon on one damaged queue; count what it did not do as designed."""
    home = Home(f"q-{name}")
    home.state.mkdir(mode=0o700)
    as_nobody = name == "unreadable"
    try:
        build(home.state)
        if as_nobody:
            subprocess.run(["chown", "-R", "65534:65534", str(home.path)], check=True)
            home.db.chmod(0)
        before = fingerprint(home.state)
        started = _start(home, as_nobody)
        listed = home.jobs() if started.returncode == 0 else None
        home.cli("daemon", "stop", timeout_s=30)
        after = fingerprint(home.state)
        _judge(name, expect, started, listed, before != after, fig)
    finally:
        home.close()


def _judge(
    name: str,
    expect: str,
    started: subprocess.CompletedProcess,
    listed: list[dict] | None,
    changed: bool,
    fig: Figures,
) -> None:
    lines = (started.stderr or "").strip().splitlines()
    names = {job["name"] for job in listed or ()}
    if expect == "refuse":
        if started.returncode == 0:
            fig.fail("started_on_damage", f"{name}: the daemon started")
        elif (
            len(lines) != 1
            or not lines[0].startswith("Error:")
            or "internal error" in lines[0]
            or MISLEADING.get(name, "\0") in lines[0]
        ):
            fig.fail("unclear_refusal", f"{name}: {' / '.join(lines)[:160]}")
        if changed:
            fig.fail("file_changed", f"{name}: the queue's files changed")
    elif listed is None or not set(GOOD_JOBS) <= names:
        key = "bad_row_fatal" if expect == "quarantine" else "intact_refused"
        why = " / ".join(lines)[:160] or f"listed {sorted(names)}"
        fig.fail(key, f"{name}: {why}")


def measure() -> Figures:
    fig = Figures("corrupt queue")
    fig.counts.update(
        started_on_damage=0, file_changed=0, unclear_refusal=0, bad_row_fatal=0, intact_refused=0
    )
    clean, crashed = make_sources()
    chosen = variants.build_all(clean, crashed, random.Random(14))
    if python_for_others() is None:
        chosen = [v for v in chosen if v[0] != "unreadable"]
        fig.notes.append("unreadable: skipped, no interpreter that user nobody may run")
    fig.info["variants"] = len(chosen)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda v: _try(*v, fig), chosen))
    shutil.rmtree(clean.parent, ignore_errors=True)
    return fig
