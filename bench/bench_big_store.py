"""A big store: `ls`, `submit` and `ls --all --last 100` with 100,000 finished jobs against
the same with 10, and the idle daemon's memory and CPU over the big store.

Two homes on 4 simulated GPUs: their stores are filled before their daemons start, through
the daemon's own Store API in one transaction, with the rows the daemon writes for a job
that ran `true` and succeeded (filling them by running 100,000 jobs would take 20 minutes).
Each command's samples alternate between the homes (and `ls --all --last 100` with plain
`ls` on the big home), the order flipping every round. `submit` queues a
held job (`--hold -- true`) so that no job's run competes with the next sample. Then the
big home's daemon is watched while idle: RSS (largest of one-a-second samples) and CPU.
"""

from __future__ import annotations

import argparse
import os
import pwd
import time
from collections.abc import Callable

import psutil
from common import (
    Gpusched,
    cpu_seconds,
    gpusched_script,
    interleaved,
    median_ms,
    print_table,
    ratio,
    timed_run,
    verdict,
)

from gpusched.client.paths import ensure_private_dir, resolve_paths
from gpusched.core.models import Job, JobState
from gpusched.proc import runfile
from gpusched.store.database import Store

FLAT_TARGET = 1.10  # "no slower than with 10 jobs", with a tenth for a shared machine's noise
LAST_TARGET = 2.0  # `ls --all --last 100` against plain `ls`
RSS_TARGET_MB = 60.0
IDLE_CPU_TARGET_PCT = 0.1


def fill_store(
    home: Gpusched,
    count: int,
    make: Callable[..., Job] | None = None,
    meta: dict[str, str] | None = None,
) -> float:
    """Store `count` finished jobs in the home's queue file, as the daemon would have after
    running them (or the jobs make(id, user, at, jobs_dir) returns, and meta rows); the
    seconds it took."""
    paths = resolve_paths({"GPUSCHED_HOME": str(home.home)})
    ensure_private_dir(paths.state_dir)
    user, now = pwd.getpwuid(os.getuid()).pw_name, time.time()
    make = make or _finished
    start = time.perf_counter()
    store = Store(paths.db, paths.jobs_dir)
    try:
        with store.write():
            for key, value in (meta or {}).items():
                store.set_meta(key, value)
            store.insert(
                make(job_id, user, now - count + job_id, paths.jobs_dir)
                for job_id in range(1, count + 1)
            )
    finally:
        store.close()
    return time.perf_counter() - start


def _finished(job_id: int, user: str, at: float, jobs_dir: str) -> Job:
    stdout, stderr = runfile.log_paths(jobs_dir, job_id)
    return Job(
        id=job_id,
        command=("/bin/sh", "-c", "true"),
        cwd="/tmp",
        uid=os.getuid(),
        user=user,
        name="sh",
        state=JobState.SUCCEEDED,
        submitted_at=at,
        started_at=at + 0.01,
        ended_at=at + 0.02,
        exit_code=0,
        stdout_path=stdout,
        stderr_path=stderr,
        boot_id="bench",
    )


def command_samples(small: Gpusched, big: Gpusched, runs: int) -> dict[str, list[float]]:
    """Samples of each group of commands, its contenders alternating (the order flipping
    every round): the homes side by side, and `ls --all --last 100` beside plain `ls` on
    the big home, so what runs just before weighs on both alike."""
    script = gpusched_script()

    def timed(home: Gpusched, *args: str) -> Callable[[], float]:
        return lambda: timed_run([script, *args], home.env)[0]

    last = ("ls", "--all", "--last", "100")
    groups = [
        {"ls 10": timed(small, "ls"), "ls big": timed(big, "ls")},
        {
            "submit 10": timed(small, "submit", "--hold", "--", "true"),
            "submit big": timed(big, "submit", "--hold", "--", "true"),
        },
        {
            "last 10": timed(small, *last),
            "last big": timed(big, *last),
            "ls big beside last": timed(big, "ls"),
        },
    ]
    samples: dict[str, list[float]] = {}
    for contenders in groups:
        for run in contenders.values():  # warm the page cache and byte-code, untimed
            run()
        samples.update(interleaved(runs, contenders))
    return samples


def idle_watch(pid: int, seconds: float) -> tuple[float, float]:
    """(CPU % of one core, largest RSS in MB) of a process over `seconds`."""
    proc = psutil.Process(pid)
    cpu_before, start, rss = cpu_seconds(proc), time.monotonic(), []
    while (elapsed := time.monotonic() - start) < seconds:
        rss.append(proc.memory_info().rss)
        time.sleep(min(1.0, seconds - elapsed))
    rss.append(proc.memory_info().rss)
    cpu_s, wall = cpu_seconds(proc) - cpu_before, time.monotonic() - start
    return 100 * cpu_s / wall, max(rss) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="finished jobs (100000)")
    parser.add_argument("--runs", type=int, default=15, help="samples per command (15)")
    parser.add_argument("--idle-seconds", type=float, default=15.0, help="idle window (15)")
    args = parser.parse_args()

    small, big = Gpusched("4x80GiB"), Gpusched("4x80GiB")
    fill_store(small, 10)
    fill_s = fill_store(big, args.jobs)
    print(
        f"filled the stores through the daemon's Store API in one transaction each: "
        f"10 and {args.jobs:,} finished jobs ({fill_s:.1f} s)"
    )
    with small, big:
        samples = command_samples(small, big, args.runs)
        time.sleep(2.0)  # let the last request's work settle before watching idle
        cpu_pct, rss_mb = idle_watch(big.pid, args.idle_seconds)
        _, small_rss_mb = idle_watch(small.pid, 1.0)
    med = {name: median_ms(values) for name, values in samples.items()}
    big_label = f"{args.jobs:,}"
    print_table(
        f"a store of 10 vs {big_label} finished jobs; median of {args.runs} runs each",
        ["measure", "10 jobs", f"{big_label} jobs", "ratio", "target"],
        [
            [
                "ls",
                f"{med['ls 10']:.0f} ms",
                f"{med['ls big']:.0f} ms",
                ratio(med["ls big"], med["ls 10"]),
                f"<= {FLAT_TARGET:.2f}x {verdict(med['ls big'] / med['ls 10'], FLAT_TARGET)}",
            ],
            [
                "submit --hold -- true",
                f"{med['submit 10']:.0f} ms",
                f"{med['submit big']:.0f} ms",
                ratio(med["submit big"], med["submit 10"]),
                f"<= {FLAT_TARGET:.2f}x {verdict(med['submit big'] / med['submit 10'], FLAT_TARGET)}",
            ],
            [
                "ls --all --last 100",
                f"{med['last 10']:.0f} ms",
                f"{med['last big']:.0f} ms",
                ratio(med["last big"], med["last 10"]),
                "",
            ],
            [
                f"last 100 / plain ls ({big_label})",
                "",
                f"{med['last big']:.0f} / {med['ls big beside last']:.0f} ms",
                ratio(med["last big"], med["ls big beside last"]),
                f"<= {LAST_TARGET:g}x "
                f"{verdict(med['last big'] / med['ls big beside last'], LAST_TARGET)}",
            ],
            [
                f"daemon RSS, idle over {args.idle_seconds:.0f} s",
                f"{small_rss_mb:.1f} MB",
                f"{rss_mb:.1f} MB",
                ratio(rss_mb, small_rss_mb),
                f"<= {RSS_TARGET_MB:g} MB {verdict(rss_mb, RSS_TARGET_MB)}",
            ],
            [
                f"daemon CPU, idle over {args.idle_seconds:.0f} s",
                "",
                f"{cpu_pct:.3f} %",
                "",
                f"<= {IDLE_CPU_TARGET_PCT:g} % {verdict(cpu_pct, IDLE_CPU_TARGET_PCT)}",
            ],
        ],
    )


if __name__ == "__main__":
    main()
