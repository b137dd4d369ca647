"""Seeing a queue of 100,000 pending jobs: `ls`, `ls --all --json` and `top` (issue 23).

Two homes on 4 simulated GPUs, both drained (nothing starts, so nothing moves while the
commands are timed): one with an empty queue, one whose store is filled before its daemon
starts, through the daemon's own Store API in one transaction, with 100,000 pending jobs:
100 single jobs named `eval`, then one array of 99,900 elements.

- `ls` on each home, the samples alternating (the order flipping every round): target
  the big queue's <= 2x the empty one's.
- `ls --all --json` on the big home, printed to /dev/null: its wall time, the client's
  peak RSS (wait4) against plain `ls`'s, and the daemon's peak RSS while it streams
  (sampled every 20 ms) against its RSS just before: both flat.
- `top`: the daemon's `snapshot` request as top sends it (lean), the first of a client
  (every pending row it gets) and the steady ones (the pending jobs unchanged); and the
  frame top draws from it (140x50, as bench_top.py times it); each against the empty
  home's. Targets: snapshot <= 10 ms, frame <= 20 ms with 100,000 pending.
- A restart: each home's daemon stopped and started again (the byte-code caches warm from
  its first start), timed from `daemon start` until it answers, with its peak RSS over the
  start (VmHWM) and its RSS once it answers; the big home's against the empty one's.
  Targets: <= 5 s, peak and after <= 150 MB with 100,000 pending (each job its own command).

A request that only looks sets off no scheduling pass (before, each did, and the next
request waited for it): the first table shows what users see, through the socket and the
loop (each page of `ls --all --json` is a request too). The second measures the daemon's
own work for each request, in this process, on the same stores (their daemons stopped):
the real handlers alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time

import bench_big_store as big_store
import psutil
from bench_big_batches import ME, new_daemon
from bench_top import LINES, time_frame
from common import (
    Gpusched,
    gpusched_script,
    interleaved,
    median_ms,
    print_table,
    ratio,
    timed_run,
    verdict,
)

from gpusched.cli.views.lsview import LS_PENDING_ROWS
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths
from gpusched.core.models import Job, Request
from gpusched.daemon.requests.request import Request as HandlerRequest
from gpusched.gpus import open_backend
from gpusched.proc import runfile
from gpusched.tui.snapshot import SnapshotSource

LS_TARGET = 2.0
RESTART_TARGET_S = 5.0
RESTART_RSS_TARGET_MB = 150.0
SNAPSHOT_TARGET_MS = 10.0
FRAME_TARGET_MS = 20.0
SINGLES = 100  # jobs named `eval` before the array: the ones plain `ls` lists
# No GPU reading (and the scheduling pass each one sets off) while the commands are timed.
QUIET = '[daemon]\ngpu_poll_interval = "3600s"\n'


class SlowStart(Gpusched):
    """A home whose daemon may take longer to load its queue than `daemon start` waits:
    wait for it to answer. start_s: from `daemon start` until it answered; peak_rss and
    rss: its peak RSS until then (VmHWM) and its RSS then, in bytes."""

    def __enter__(self) -> SlowStart:
        started = time.perf_counter()
        subprocess.run(
            [gpusched_script(), "daemon", "start"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        deadline = time.monotonic() + 600
        while True:
            proc = subprocess.run(
                [gpusched_script(), "daemon", "status", "--json"],
                env=self.env,
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode == 0:
                break
            if time.monotonic() > deadline:
                self.__exit__(RuntimeError, None, None)  # stops what did start
                raise RuntimeError(f"the daemon did not answer: {proc.stderr.strip()}")
            time.sleep(0.05)
        self.start_s = time.perf_counter() - started
        status = json.loads(proc.stdout)
        self.pid, self.socket = status["pid"], status["socket"]
        self.peak_rss, self.rss = memory_of(self.pid)
        return self

    def restart(self) -> None:
        self.cli("daemon", "stop")
        self.__enter__()


def memory_of(pid: int) -> tuple[int, int]:
    """(peak RSS, RSS) of a process, in bytes: /proc's VmHWM and VmRSS (where there is no
    /proc, the RSS for both)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if line.startswith("Vm"))
        return (int(fields["VmHWM"].split()[0]) * 1024, int(fields["VmRSS"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        rss = psutil.Process(pid).memory_info().rss
        return rss, rss


def fill_store(home: Gpusched, count: int) -> float:
    """Queue `count` pending jobs (and drain the queue) in the home's store; the seconds."""
    return big_store.fill_store(home, count, _pending, {"draining": "1"})


def _pending(job_id: int, user: str, at: float, jobs_dir: str) -> Job:
    stdout, stderr = runfile.log_paths(jobs_dir, job_id)
    single = job_id <= SINGLES
    return Job(
        id=job_id,
        command=("python", "train.py", f"--seed={job_id}"),
        cwd="/tmp",
        uid=os.getuid(),
        user=user,
        name="eval" if single else "sweep",
        request=Request(gpus=1),
        submitted_at=at,
        stdout_path=stdout,
        stderr_path=stderr,
        array_id=None if single else SINGLES + 1,
        array_index=None if single else job_id - SINGLES - 1,
    )


def handler_samples(home: Gpusched, runs: int) -> dict[str, list[float]]:
    """Seconds the daemon's own work takes for each request (its handler, on the loop
    thread, in this process: the real handlers on the home's store, its daemon stopped)."""
    daemon = new_daemon(home.home)
    handle = daemon.handlers.handle
    try:
        version = handle(HandlerRequest("snapshot", {"lean": True}, ME))["pending_version"]
        requests = {
            "ls": ("list", {"pending_rows": LS_PENDING_ROWS}),
            "ls --all page": ("list", {"all": True, "stream": "pages"}),
            "snapshot first": ("snapshot", {"lean": True}),
            "snapshot steady": ("snapshot", {"lean": True, "pending_version": version}),
        }
        samples: dict[str, list[float]] = {name: [] for name in requests}
        for _ in range(runs):
            for name, (cmd, args) in requests.items():
                start = time.perf_counter()
                handle(HandlerRequest(cmd, args, ME))
                samples[name].append(time.perf_counter() - start)
        return samples
    finally:
        daemon.state.store.close()
        daemon.backend.close()


def ls_samples(empty: Gpusched, big: Gpusched, runs: int) -> dict[str, list[float]]:
    script = gpusched_script()
    contenders = {
        "empty": lambda: timed_run([script, "ls"], empty.env)[0],
        "big": lambda: timed_run([script, "ls"], big.env)[0],
    }
    for run in contenders.values():  # warm the page cache and byte-code, untimed
        run()
    return interleaved(runs, contenders)


def run_measured(argv: list[str], env: dict[str, str], daemon_pid: int) -> tuple[float, int, int]:
    """(wall seconds, the command's peak RSS, the daemon's peak RSS meanwhile) in bytes."""
    daemon, peak, done = psutil.Process(daemon_pid), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], daemon.memory_info().rss)
            done.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.read()}")
    return wall, usage.ru_maxrss * 1024, peak[0]


def snapshot_samples(home: Gpusched, runs: int) -> tuple[list[float], list[float], list[float]]:
    """(first snapshots, steady snapshots, frames) of top against the home, in seconds."""
    paths = resolve_paths({"GPUSCHED_HOME": str(home.home)})
    client = Client(paths, autostart=False, check_daemon=False)
    first, steady = [], []
    for _ in range(runs):
        start = time.perf_counter()
        reply = client.call("snapshot", lean=True)
        first.append(time.perf_counter() - start)
        start = time.perf_counter()
        client.call("snapshot", lean=True, pending_version=reply["pending_version"])
        steady.append(time.perf_counter() - start)
    source = SnapshotSource(open_backend, paths)
    snapshot = source.take()
    frames = [time_frame(snapshot, LINES) for _ in range(runs)]
    source.close()
    return first, steady, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="pending jobs (100000)")
    parser.add_argument("--runs", type=int, default=15, help="samples per measure (15)")
    parser.add_argument("--quick", action="store_true", help="10,000 jobs, 5 runs")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.runs = 10_000, 5

    empty, big = SlowStart("4x80GiB", QUIET), SlowStart("4x80GiB", QUIET)
    fill_store(empty, 0)
    fill_s = fill_store(big, args.jobs)
    print(f"filled the big home's store with {args.jobs:,} pending jobs ({fill_s:.1f} s)")
    with empty, big:
        print(f"the big home's daemon answered {big.start_s:.1f} s after `daemon start`")
        for home in (empty, big):
            home.restart()
        ls = ls_samples(empty, big, args.runs)
        script = gpusched_script()
        idle_rss = psutil.Process(big.pid).memory_info().rss
        _, plain_client_rss, _ = run_measured([script, "ls"], big.env, big.pid)
        all_s, all_client_rss, all_daemon_rss = run_measured(
            [script, "ls", "--all", "--json"], big.env, big.pid
        )
        top_empty, top_big = snapshot_samples(empty, args.runs), snapshot_samples(big, args.runs)
    own_empty, own_big = handler_samples(empty, args.runs), handler_samples(big, args.runs)
    med = {name: median_ms(values) for name, values in ls.items()}
    first_e, steady_e, frame_e = (median_ms(v) for v in top_empty)
    first_b, steady_b, frame_b = (median_ms(v) for v in top_big)
    mib, label = 2**20, f"{args.jobs:,}"
    print_restart(empty, big, label)
    print_table(
        f"an empty queue vs {label} pending jobs, as users see it; medians of {args.runs} runs",
        ["measure", "empty", label, "ratio", "target"],
        [
            [
                "ls",
                f"{med['empty']:.0f} ms",
                f"{med['big']:.0f} ms",
                ratio(med["big"], med["empty"]),
                f"<= {LS_TARGET:g}x {verdict(med['big'] / med['empty'], LS_TARGET)}",
            ],
            ["ls --all --json > /dev/null (one run)", "", f"{all_s:.1f} s", "", ""],
            [
                "  client peak RSS, vs plain ls",
                f"{plain_client_rss / mib:.0f} MB",
                f"{all_client_rss / mib:.0f} MB",
                ratio(all_client_rss, plain_client_rss),
                "flat",
            ],
            [
                "  daemon peak RSS, vs before",
                f"{idle_rss / mib:.0f} MB",
                f"{all_daemon_rss / mib:.0f} MB",
                ratio(all_daemon_rss, idle_rss),
                "flat",
            ],
            [
                "top: a client's first snapshot",
                f"{first_e:.1f} ms",
                f"{first_b:.1f} ms",
                ratio(first_b, first_e),
                "",
            ],
            [
                "top: a steady snapshot",
                f"{steady_e:.1f} ms",
                f"{steady_b:.1f} ms",
                ratio(steady_b, steady_e),
                f"<= {SNAPSHOT_TARGET_MS:g} ms {verdict(steady_b, SNAPSHOT_TARGET_MS)}",
            ],
            [
                "top: a frame, 140x50",
                f"{frame_e:.1f} ms",
                f"{frame_b:.1f} ms",
                ratio(frame_b, frame_e),
                f"<= {FRAME_TARGET_MS:g} ms {verdict(frame_b, FRAME_TARGET_MS)}",
            ],
        ],
    )
    print_table(
        f"the daemon's own work per request (its handler, no pass); medians of {args.runs} runs",
        ["request", "empty", label, "ratio", "target"],
        [
            [
                name,
                f"{median_ms(own_empty[name]):.2f} ms",
                f"{median_ms(own_big[name]):.2f} ms",
                ratio(median_ms(own_big[name]), median_ms(own_empty[name])),
                f"<= {SNAPSHOT_TARGET_MS:g} ms "
                f"{verdict(median_ms(own_big[name]), SNAPSHOT_TARGET_MS)}"
                if "snapshot" in name
                else "",
            ]
            for name in own_big
        ],
    )


def print_restart(empty: SlowStart, big: SlowStart, label: str) -> None:
    mib = 2**20
    print_table(
        f"a restart: the daemon stopped and started again on an empty queue vs {label} "
        "pending jobs (each its own command); one run",
        ["measure", "empty", label, "ratio", "target"],
        [
            [
                "daemon start until it answers",
                f"{empty.start_s:.2f} s",
                f"{big.start_s:.2f} s",
                ratio(big.start_s, empty.start_s),
                f"<= {RESTART_TARGET_S:g} s {verdict(big.start_s, RESTART_TARGET_S)}",
            ],
            *(
                [
                    what,
                    f"{getattr(empty, key) / mib:.0f} MB",
                    f"{getattr(big, key) / mib:.0f} MB",
                    ratio(getattr(big, key), getattr(empty, key)),
                    f"<= {RESTART_RSS_TARGET_MB:g} MB "
                    f"{verdict(getattr(big, key) / mib, RESTART_RSS_TARGET_MB)}",
                ]
                for what, key in (
                    ("daemon peak RSS until then", "peak_rss"),
                    ("daemon RSS once it answers", "rss"),
                )
            ),
        ],
    )


if __name__ == "__main__":
    main()
