"""The daemon's decisions in this process: its real loop, request handlers and job control,
on a real SQLite store in a temporary directory and simulated GPUs, with fake shims (a
process seam that runs nothing) and a clock the test moves.

A Box is one such daemon. Requests go in as the socket server hands them over
(box.call); box.step() is one turn of the loop with no request. A launched job runs
nowhere: the fake writes its run file as a shim would (so the daemon reads it with its own
code), and the test says how the job ends (box.shims.exit(job_id, 3)).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpusched.client import protocol
from gpusched.client.paths import ensure_private_dir, resolve_paths
from gpusched.client.submit import fastsubmit
from gpusched.client.submit.jobrequest import build_request
from gpusched.core.config import load_settings
from gpusched.core.models import Job
from gpusched.daemon.loop import Call, Daemon
from gpusched.daemon.requests.request import Request
from gpusched.gpus import open_backend
from gpusched.proc import runfile
from gpusched.store.database import Store

ME = (os.getpid(), os.getuid(), os.getgid())
DEFAULT_HOST_CONFIG = "[host]\ncpus = 64\n"  # as tests/conftest.py: cores never limit by surprise
_FAKE_PID_BASE = 4_000_000  # above any real pid (pid_max is at most 2**22)


class FakeClock:
    """time() and monotonic(), moved only by advance()."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now, self.mono = start, 10_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


class FakeShims:
    """A process seam with no processes (gpusched/proc/seam.py's ProcessSeam is the real one).

    A launch is recorded and its shim "forks" at once (unless held: fork() later), writing
    the run file's spec and shim records as a shim does; exit() and vanish() end it.
    """

    boot_id = "fake-boot"

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.launched: dict[int, dict] = {}  # job id -> the spec of its last launch
        self.launches: list[int] = []  # job ids, in launch order (a retry again)
        self.alive: dict[int, int] = {}  # job id -> its shim's fake pid
        self.signals: list[tuple[int, int]] = []  # (job id, signal) sent to a live shim
        self.killed: list[int] = []  # job ids whose processes were SIGKILLed (memory)
        self.notes: list[tuple[str, str]] = []  # (log path, line) the daemon appended
        self.rss_bytes: dict[int, int] = {}  # job id -> what its processes use
        self.children: dict[int, list[int]] = {}  # job id -> pids under its shim
        self.ports: dict[int, int] = {}  # job id -> the MASTER_PORT held for it
        self.hold_forks = False  # launches wait for fork(job_id)
        # A job's processes as the seam finds them without its shim, by run token: pid ->
        # whether it ignores SIGTERM; and (pid, signal) for each signal sent to one.
        self.marked: dict[str, dict[int, bool]] = {}
        self.process_signals: list[tuple[int, int]] = []
        self.refuse_launches = False  # the launcher cannot be asked: OSError
        self.container_removals: list[dict] = []  # what remove_container was given
        # The daemon's wake(): an exit reports the job's end as a shim does (Box.start).
        self.report_end: Any = None
        self.acks: dict[str, runfile.ShimRecord] = {}  # the supervisor's, not yet taken
        self.acknowledges = True  # False: a supervisor of a version before acknowledgements

    # -- what the test does ----------------------------------------------------------
    def fork(self, job_id: int) -> int:
        """The job's shim starts: its run file with the spec and its own record."""
        spec, pid = self.launched[job_id], _FAKE_PID_BASE + len(self.launches)
        os.makedirs(os.path.dirname(spec["run_file"]), exist_ok=True)  # as the shim does
        with open(spec["run_file"], "w") as run:
            run.write(
                runfile.record_line("spec", spec)
                + runfile.record_line(
                    "shim", {"pid": pid, "start_ticks": pid, "run": spec.get("run")}
                )
            )
        self.alive[job_id] = pid
        if self.acknowledges:
            self.acks[spec["run"]] = runfile.ShimRecord(pid, pid)
        return pid

    def die_unstarted(self, job_id: int) -> None:
        """The job's shim is forked, acknowledged, and dies before it writes its run file."""
        pid = _FAKE_PID_BASE + len(self.launches)
        self.acks[self.launched[job_id]["run"]] = runfile.ShimRecord(pid, pid)

    def exit(
        self, job_id: int, code: int | None = 0, signum: int | None = None, error: str = ""
    ) -> None:
        """The job ended: its shim writes the exit record and is gone."""
        runfile.append_record(
            self.launched[job_id]["run_file"],
            "exit",
            {
                "exit_code": code,
                "signal": signum,
                "ended_at": self.clock.time(),
                "error": error,
                "run": self.launched[job_id].get("run"),
            },
        )
        pid = self.alive.pop(job_id)
        if self.report_end is not None:  # from the run's end address, as a shim reports it
            self.report_end(runfile.WAKE, runfile.end_address(pid, self.launched[job_id]["run"]))

    def vanish(self, job_id: int) -> None:
        """The shim dies without a record (SIGKILL, a reboot)."""
        del self.alive[job_id]

    def leave_running(self, job_id: int, pid: int, ignores_term: bool = False) -> None:
        """A process of the job's (by its run token) that runs on if its shim dies: it
        ends on SIGTERM (unless it ignores it), on SIGKILL, or by end_process."""
        token = self.launched[job_id]["env"].get("GPUSCHED_RUN_TOKEN", "")
        self.marked.setdefault(token, {})[pid] = ignores_term

    def end_process(self, pid: int) -> None:
        for pids in self.marked.values():
            pids.pop(pid, None)

    def signalled(self, job_id: int) -> list[int]:
        return [s for j, s in self.signals if j == job_id]

    # -- the seam's calls ---------------------------------------------------------------
    def launch(self, spec: dict) -> None:
        if self.refuse_launches:
            raise OSError("the shim launcher does not take requests")
        self.launched[spec["job_id"]] = spec
        self.launches.append(spec["job_id"])
        if not self.hold_forks:
            self.fork(spec["job_id"])

    def started(self) -> dict[str, runfile.ShimRecord]:
        acks, self.acks = self.acks, {}
        return acks

    def close(self) -> None:
        pass

    def _live(self, job: Job) -> bool:
        return job.runner_pid is not None and self.alive.get(job.id) == job.runner_pid

    def is_alive(self, job: Job) -> bool:
        return self._live(job)

    def signal_job(self, job: Job, signum: int = signal.SIGTERM) -> bool:
        if not self._live(job):
            return False
        self.signals.append((job.id, signum))
        return True

    def warn_job(self, job: Job, signum: int) -> bool:
        return self.signal_job(job, signum)  # who in the job gets it: proc/jobtree.py

    def tree_rss_bytes(self, job: Job) -> int | None:
        return self.rss_bytes.get(job.id, 0) if self._live(job) else None

    def kill_job_now(self, job: Job) -> None:
        if self._live(job):
            self.killed.append(job.id)

    def job_processes(self, marks: Any) -> dict[int, int]:
        return {pid: pid for pid in self.marked.get(marks.token, {})}

    def signal_processes(self, found: dict[int, int], signum: int) -> None:
        for pid in found:
            self.process_signals.append((pid, signum))
            ignores = next((m[pid] for m in self.marked.values() if pid in m), None)
            if ignores is not None and (signum == signal.SIGKILL or not ignores):
                self.end_process(pid)

    def identify_shim(self, pid: int, ticks: int, supervised: bool = False) -> tuple[int, float]:
        live = pid in self.alive.values()
        return pid, float(pid) if live else 0.0

    def pid_owners(self, running: list[Job]) -> dict[int, int]:
        owners = {job.runner_pid: job.id for job in running if job.runner_pid}
        for job in running:
            owners.update(dict.fromkeys(self.children.get(job.id, ()), job.id))
        return owners

    def remove_container(self, spec: dict) -> None:
        self.container_removals.append(spec)

    def append_to_log(self, path: str, line: str, uid: int) -> None:
        self.notes.append((path, line))

    def pick_master_port(self, job_id: int, low: int, high: int, taken: Any) -> int:
        busy = set(taken) | set(self.ports.values())
        port = next((p for p in range(low, high + 1) if p not in busy), low)
        self.ports[job_id] = port
        return port

    def hold_port(self, job_id: int, port: int) -> None:
        self.ports.setdefault(job_id, port)

    def release_port(self, job_id: int) -> None:
        self.ports.pop(job_id, None)


DISK_FULL = ("database or disk is full", "SQLITE_FULL", 13)
LOCKED = ("database is locked", "SQLITE_BUSY", 5)


class FailingCommits:
    """A store's connection whose COMMIT fails while `failure` is set, for the transactions
    that `only` accepts (their statements, in order): what a full disk or a lock held
    elsewhere does to a write."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self.failure: tuple[str, str, int] | None = None
        self.only = lambda statements: True
        self.failed_commits = 0
        self._statements: list[str] = []

    def execute(self, sql: str, *args):
        if sql == "BEGIN IMMEDIATE":
            self._statements = []
        elif sql == "COMMIT" and self.failure and self.only(self._statements):
            self.failed_commits += 1
            message, name, code = self.failure
            exc = sqlite3.OperationalError(message)
            exc.sqlite_errorname, exc.sqlite_errorcode = name, code
            raise exc
        else:
            self._statements.append(sql.split()[0].upper())
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


def failing(box: Box) -> FailingCommits:
    store = box.daemon.state.store
    if not isinstance(store._conn, FailingCommits):
        store._conn = FailingCommits(store._conn)
    return store._conn


class Box:
    """One daemon in this process, on a home in a temporary directory."""

    def __init__(self, root: Path, gpus: str = "4x80GiB", config: str = ""):
        self.root, self.gpus = root, gpus
        self.clock = FakeClock()
        self.shims = FakeShims(self.clock)
        self.paths = resolve_paths({"GPUSCHED_HOME": str(root)})
        self.configure(config)
        self.daemon: Daemon | None = None
        self.start()

    def configure(self, config: str) -> None:
        """The home's config; the next start() reads it."""
        self.root.mkdir(parents=True, exist_ok=True)
        if "[host]" not in config:
            config = f"{config}\n{DEFAULT_HOST_CONFIG}"
        Path(self.paths.config_file).write_text(config)

    def start(self) -> Daemon:
        """A daemon on this home's store: the first, or the next one after stop()."""
        settings = load_settings(self.paths.config_file, environ={})
        backend = open_backend(self.gpus, self.paths.sim_processes)
        ensure_private_dir(self.paths.state_dir)
        daemon = Daemon(self.paths, settings, backend, seam=self.shims, clock=self.clock)
        daemon.attach(Store(self.paths.db))
        daemon.take_over()
        self.shims.report_end = daemon.wake
        self.daemon = daemon
        return daemon

    def stop(self, crash: bool = False) -> None:
        """The daemon goes (its fair-share usage saved, unless it crashed); shims stay."""
        daemon, self.daemon = self.daemon, None
        if daemon is None:
            return
        if not crash:
            daemon.save_usage()
        daemon.state.store.close()
        daemon.backend.close()
        gc.enable()  # a daemon stopped in a big request's batches left the collector off
        gc.unfreeze()  # and what they made frozen (daemon/gcfreeze.py)

    def restart(self, crash: bool = False) -> Daemon:
        self.stop(crash)
        return self.start()

    # -- requests and passes -------------------------------------------------------------
    def send(
        self, name: str, creds: tuple[int, int, int] = ME, lines: Any = None, **args: Any
    ) -> Call:
        """A request as the server hands it to the loop, and one turn of the loop; the
        Call is answered, or (a `wait`) still waiting. lines: a streamed submit's."""
        protocol.check_request({"cmd": name, "args": args})
        if lines is not None:  # read from the stream and handed over with the request
            args = {**args, "stream": "lines", "lines": [x for x in lines if x is not None]}
        call = Call(Request(name, args, creds))
        self.daemon.step([call])
        while call.batched is not None and not call.done.is_set():
            self.daemon.step([])  # a big submit or change: a batch per turn, to the end
        return call

    def call(self, name: str, creds: tuple[int, int, int] = ME, **args: Any) -> Any:
        """A request's result; raises the GpuschedError a client would get."""
        call = self.send(name, creds, **args)
        assert call.done.is_set(), f"{name} was not answered"
        if call.error is not None:
            raise call.error
        return json.loads(json.dumps(call.result))  # as a client reads it: tuples are lists

    def step(self, seconds: float = 0.0) -> None:
        """Move the clock, then one turn of the loop with no request."""
        self.clock.advance(seconds)
        self.daemon.step([])

    def submit_all(
        self, *argv: str, creds: tuple[int, int, int] = ME, stdin: str = ""
    ) -> list[int]:
        """`gpusched submit ARGV` as the CLI builds the request; the ids queued. stdin:
        what `--from-file -` reads."""
        opts = fastsubmit.parse(list(argv))
        assert opts is not None, f"the fast path cannot parse {argv}"
        if opts.cwd is None:
            opts.cwd = str(self.root)
        if opts.from_file == "-":
            opts.from_file = str(self.root / "stdin.txt")
            Path(opts.from_file).write_text(stdin)
        return self.call("submit", creds, **build_request(opts))["ids"]  # lines: streamed

    def submit(self, *argv: str, creds: tuple[int, int, int] = ME) -> int:
        (job_id,) = self.submit_all(*argv, creds=creds)
        return job_id

    def show(self, job_id: int) -> dict:
        return self.call("show", ids=[job_id])["jobs"][0]

    def states(self, *ids: int) -> list[str]:
        return [self.show(i)["state"] for i in ids]

    def running(self) -> set[int]:
        return {j.id for j in self.daemon.state.running()}

    def exit(
        self, job_id: int, code: int | None = 0, signum: int | None = None, seconds: float = 0.0
    ) -> dict:
        """`seconds` later, the job's shim records its end; a turn of the loop reads it.
        The job as shown then."""
        if job_id not in self.shims.alive:
            self.step()  # the pass that started it is over: its shim has forked
        self.clock.advance(seconds)
        self.shims.exit(job_id, code, signum)
        self.step()
        return self.show(job_id)

    def declare_outside(self, *processes: dict) -> None:
        """Processes not ours on the simulated GPUs (the backend reads this file when it
        changes: each write gets a new mtime here)."""
        blocks = []
        for proc in processes:
            blocks.append(
                "[[process]]\n"
                + "".join(
                    f"{k} = {v!r}\n" if isinstance(v, str) else f"{k} = {v}\n"
                    for k, v in proc.items()
                )
            )
        path = Path(self.paths.sim_processes)
        before = path.stat().st_mtime_ns if path.exists() else 0
        path.write_text("\n".join(blocks))
        os.utime(path, ns=(before + 10**9, before + 10**9))

    @contextmanager
    def failing_writes(self, failure: tuple[str, str, int] = DISK_FULL) -> Iterator[None]:
        """Every commit to the queue fails (a full disk, by default) until the block ends."""
        commits = failing(self)
        commits.failure = failure
        try:
            yield
        finally:
            commits.failure = None

    def close(self) -> None:
        self.stop(crash=True)


@pytest.fixture
def make_box(tmp_path: Path):
    """Boxes on other GPUs or configs: make_box("1x80GiB", '[daemon]\\n...')."""
    boxes: list[Box] = []

    def make(gpus: str = "4x80GiB", config: str = "") -> Box:
        box = Box(tmp_path / f"box{len(boxes)}", gpus, config)
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.close()


@pytest.fixture
def box(make_box) -> Box:
    """A daemon on 4 simulated 80 GiB GPUs, in this process."""
    return make_box()
