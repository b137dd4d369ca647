"""Shared benchmark helpers: isolated gpusched and task-spooler instances, timing, tables."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

TSP = shutil.which("tsp") or shutil.which("ts") or "tsp"
REPO_ROOT = Path(__file__).resolve().parent.parent


def median_ms(seconds: Iterable[float]) -> float:
    return statistics.median(seconds) * 1e3


def ratio(ours: float, peer: float) -> str:
    return f"{ours / peer:.2f}x" if peer > 0 else "n/a"


def verdict(value: float, target: float) -> str:
    return "ok" if value <= target else "MISSED"


def machine_note() -> str:
    """Cores and load, printed with each table: figures from a busy machine read differently."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, load average {load}"


def cpu_seconds(proc: psutil.Process) -> float:
    """CPU time of a process's live threads, from the scheduler's nanosecond counts
    (/proc/PID/task/*/schedstat): user and system times tick in 10 ms, which over an
    idle window of seconds is a step of 0.07 % of a core, as large as the figure."""
    total_ns = 0
    try:
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                with open(f"/proc/{proc.pid}/task/{task}/schedstat") as stat:
                    total_ns += int(stat.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that just ended
    except OSError:
        times = proc.cpu_times()  # no /proc: ticks are all there is
        return times.user + times.system
    return total_ns / 1e9


def print_table(title: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """A plain aligned table: first column left, the rest right."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n{title}\n  ({machine_note()})")
    for n, row in enumerate(cells):
        print(
            "  "
            + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
            )
        )
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))


def timed_run(argv: Sequence[str], env: dict[str, str]) -> tuple[float, str]:
    """(wall seconds, stdout) of one command, which must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return elapsed, proc.stdout


def interleaved(rounds: int, contenders: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run each contender once per round, reversing the order every other round, so
    that drift in the machine's load falls on all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders)
    for n in range(rounds):
        for name in order if n % 2 == 0 else order[::-1]:
            samples[name].append(contenders[name]())
    return samples


def _private_tmpdir(prefix: str) -> Path:
    # Under /tmp, not $TMPDIR: Unix socket paths must stay under 108 bytes.
    # GPUSCHED_BENCH_TMP picks another short directory, to compare filesystems: where
    # creating a file is slow (ext4 without a journal), every job's log files show.
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("GPUSCHED_BENCH_TMP", "/tmp")))


_SCRATCH: list[Path] = []


def remove_at_exit(path: Path) -> None:
    """Delete a run's files when the benchmark ends, not between runs: on ext4 without a
    journal, creating a file skips over every inode freed in the last 30 s or so, so
    deleting one run's thousands of files would slow the next run's file creation
    several-fold, whichever scheduler it is (see bench/README.md)."""
    atexit.register(shutil.rmtree, path, True)


def scratch_dir() -> Path:
    """One temporary directory per benchmark process, removed at exit."""
    if not _SCRATCH:
        _SCRATCH.append(_private_tmpdir("bench-"))
        remove_at_exit(_SCRATCH[0])
    return _SCRATCH[0]


def base_env() -> dict[str, str]:
    """The environment for every command: byte-code caching on, as after a pip install.

    A developer shell may set PYTHONDONTWRITEBYTECODE, which makes every gpusched call
    compile its modules from source; the caches go to a scratch directory instead of the
    working tree.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUSCHED_", "XDG_", "TS_")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["PYTHONPYCACHEPREFIX"] = str(scratch_dir() / "pycache")
    return env


def _site_packages() -> Path:
    return next(Path(p) for p in sys.path if p.endswith("site-packages"))


def _path_venv_script(src: Path) -> str:
    """A `gpusched` console script in a scratch venv that imports gpusched from SRC and
    its dependencies from this interpreter's site-packages, through plain path entries."""
    venv = scratch_dir() / f"venv-{abs(hash(str(src)))}"
    script = venv / "bin" / "gpusched"
    if not script.exists():
        subprocess.run(
            [sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True
        )
        site = next(venv.glob("lib/python*/site-packages"))
        (site / "gpusched-bench.pth").write_text(f"{src}\n{_site_packages()}\n")
        script.write_text(f"#!{venv}/bin/python\n{console_script_body()}")
        script.chmod(0o755)
    return str(script)


# What an older pip (such as 23.2, which Python 3.11's venv brings) writes for a console
# script: it imports re, and with it enum, functools and collections, before any of
# gpusched's code.
OLD_PIP_SCRIPT = (
    "import re\nimport sys\nfrom gpusched.cli.entry import main\n"
    "if __name__ == '__main__':\n"
    "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
    "    sys.exit(main())\n"
)


def console_script_body() -> str:
    """The console script as the pip that installed this venv wrote it (its first line,
    the interpreter, left out): a wheel installed by that pip starts the same way."""
    beside = Path(sys.executable).with_name("gpusched")
    try:
        lines = beside.read_text(encoding="utf-8").splitlines(keepends=True)
    except OSError:
        return OLD_PIP_SCRIPT
    body = "".join(line for line in lines[1:] if not line.startswith("# -*-"))
    return body if "gpusched.cli.entry" in body else OLD_PIP_SCRIPT


@functools.cache
def gpusched_script() -> str:
    """The console script to benchmark: the installed one next to this interpreter, or,
    with GPUSCHED_BENCH_SRC=DIR, gpusched from another checkout (to compare commits, or
    to hold still while others edit the working tree)."""
    src = os.environ.get("GPUSCHED_BENCH_SRC")
    if src:
        return _path_venv_script(Path(src).resolve())
    beside = Path(sys.executable).with_name("gpusched")
    found = str(beside) if beside.exists() else shutil.which("gpusched")
    if not found:
        raise SystemExit(
            "no gpusched console script beside this Python or on PATH; "
            "run the benchmark with the venv's python"
        )
    return found


def script_python(script: str) -> str:
    """The interpreter a console script starts (its #! line)."""
    with open(script, encoding="utf-8") as fh:
        return fh.readline()[2:].strip()


def plain_install_gpusched() -> str | None:
    """The same gpusched as a wheel install would start it, when this one is editable.

    setuptools' editable install adds a .pth hook that imports pathlib and more at every
    interpreter start (about 20 ms here); a wheel install has none. None when there is
    no editable hook to compare against.
    """
    if os.environ.get("GPUSCHED_BENCH_SRC") or not any(_site_packages().glob("__editable__*.pth")):
        return None
    return _path_venv_script(REPO_ROOT)


def _kill(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Gpusched:
    """A gpusched daemon on simulated GPUs in a temporary GPUSCHED_HOME; stopped on exit."""

    def __init__(self, simulate: str = "8x80GiB", config: str = ""):
        self.home = _private_tmpdir("gs-bench-")
        if config:
            (self.home / "gpusched.toml").write_text(config)
        self.env = base_env()
        self.env.update(GPUSCHED_HOME=str(self.home), GPUSCHED_SIMULATE=simulate)
        self.pid: int | None = None
        self.socket = ""

    def cli(self, *args: str) -> str:
        return timed_run([gpusched_script(), *args], self.env)[1]

    def call(self, cmd: str, **args: object) -> dict:
        """One request over the daemon's socket, for the benchmark's own bookkeeping.

        Speaks the wire format itself (length-prefixed JSON) rather than importing
        gpusched, so the benchmark does not depend on the package's internals.
        """
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(300)  # a hung daemon fails the benchmark rather than stalls it
            sock.connect(self.socket)
            body = json.dumps({"cmd": cmd, "args": args}).encode()
            sock.sendall(struct.pack(">I", len(body)) + body)
            with sock.makefile("rb") as stream:
                (size,) = struct.unpack(">I", stream.read(4))
                reply = json.loads(stream.read(size))
        if not reply.get("ok"):
            raise RuntimeError(f"gpusched {cmd}: {reply.get('error')}")
        return reply["result"]

    def wait(self, ids: list[int]) -> list[dict]:
        """Block until the jobs ended; return them as `show --json` has them."""
        while True:
            result = self.call("wait", ids=ids)
            if result["done"]:
                return result["jobs"]

    def __enter__(self) -> Gpusched:
        self.cli("daemon", "start")
        status = json.loads(self.cli("daemon", "status", "--json"))
        self.pid, self.socket = status["pid"], status["socket"]
        return self

    def __exit__(self, exc_type: object, *_exc: object) -> None:
        if exc_type is not None:  # show why, before the log goes with the home
            log = self.home / "state" / "daemon.log"
            if log.exists():
                sys.stderr.write("daemon log (tail):\n" + log.read_text()[-3000:])
        try:
            self.cli("daemon", "stop")
        except RuntimeError:
            _kill(self.pid)
        remove_at_exit(self.home)


class TaskSpooler:
    """A task-spooler server with its own socket, save list and output directory."""

    def __init__(self, slots: int = 1):
        self.home = _private_tmpdir("ts-bench-")
        self.socket = str(self.home / "ts.sock")
        self.env = base_env()
        self.env.update(
            TS_SOCKET=self.socket, TS_SAVELIST=str(self.home / "savelist"), TMPDIR=str(self.home)
        )
        self.slots = slots
        self.pid: int | None = None

    def cli(self, *args: str) -> str:
        return timed_run([TSP, *args], self.env)[1]

    def submit(self, *command: str) -> int:
        return int(self.cli(*command).strip())

    def counts(self) -> dict[str, int]:
        """Jobs by state, from `tsp -l`."""
        states: dict[str, int] = {}
        for line in self.cli("-l").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 1:
                states[parts[1]] = states.get(parts[1], 0) + 1
        return states

    def wait_all(self, poll_s: float = 0.01) -> None:
        while set(self.counts()) - {"finished"}:
            time.sleep(poll_s)

    def _server_pid(self) -> int | None:
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] not in ("tsp", "ts"):
                continue
            try:
                if any(c.laddr == self.socket for c in proc.net_connections(kind="unix")):
                    return proc.pid
            except psutil.Error:
                continue
        return None

    def __enter__(self) -> TaskSpooler:
        self.cli("-S", str(self.slots))  # any command starts the server
        self.pid = self._server_pid()
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            self.cli("-K")
        except RuntimeError:
            _kill(self.pid)
        remove_at_exit(self.home)
