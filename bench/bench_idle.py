"""An idle daemon with 8 simulated GPUs: CPU (% of one core) and memory, against tsp's server.

Both are started, left a few seconds to settle, then watched side by side over the same
window: CPU is the process's user + system time over the window's wall time; RSS is
sampled once a second (the largest sample is shown). Wake-ups are voluntary context
switches per second, a hint at how often the process polls.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import psutil
from common import Gpusched, TaskSpooler, cpu_seconds, print_table, ratio, verdict

CPU_TARGET_PCT = 1.0
RSS_TARGET_MB = 60.0
SETTLE_S = 3.0


@dataclass
class Watch:
    """CPU time, wake-ups and peak RSS of one process over a window."""

    proc: psutil.Process
    cpu_s: float = 0.0
    switches: int = 0
    rss_samples: list[int] = field(default_factory=list)

    def begin(self) -> None:
        self.cpu_s = -cpu_seconds(self.proc)
        self.switches = -self.proc.num_ctx_switches().voluntary

    def sample(self) -> None:
        self.rss_samples.append(self.proc.memory_info().rss)

    def end(self) -> None:
        self.cpu_s += cpu_seconds(self.proc)
        self.switches += self.proc.num_ctx_switches().voluntary


def watch(procs: list[Watch], seconds: float) -> float:
    """Watch the processes for SECONDS; return the window's wall time."""
    for w in procs:
        w.begin()
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        for w in procs:
            w.sample()
        time.sleep(min(1.0, seconds - elapsed))
    for w in procs:
        w.sample()
        w.end()
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="window (default 60)")
    args = parser.parse_args()

    with Gpusched("8x80GiB") as gs, TaskSpooler() as ts:
        if ts.pid is None:
            raise RuntimeError("could not find the task-spooler server process")
        ours, peer = Watch(psutil.Process(gs.pid)), Watch(psutil.Process(ts.pid))
        time.sleep(SETTLE_S)
        wall_s = watch([ours, peer], args.seconds)

    def cpu_pct(w: Watch) -> float:
        return 100 * w.cpu_s / wall_s

    def rss_mb(w: Watch) -> float:
        return max(w.rss_samples) / 2**20

    print_table(
        f"idle daemon over {wall_s:.0f} s (gpusched: 8 simulated GPUs)",
        ["measure", "gpusched", "tsp server", "ratio", "target"],
        [
            [
                "CPU, % of one core",
                f"{cpu_pct(ours):.2f} %",
                f"{cpu_pct(peer):.2f} %",
                ratio(cpu_pct(ours), cpu_pct(peer)),
                f"<= {CPU_TARGET_PCT:g} % {verdict(cpu_pct(ours), CPU_TARGET_PCT)}",
            ],
            [
                "RSS, largest sample",
                f"{rss_mb(ours):.1f} MB",
                f"{rss_mb(peer):.1f} MB",
                ratio(rss_mb(ours), rss_mb(peer)),
                f"<= {RSS_TARGET_MB:g} MB {verdict(rss_mb(ours), RSS_TARGET_MB)}",
            ],
            [
                "main-thread wake-ups per second",
                f"{ours.switches / wall_s:.1f}",
                f"{peer.switches / wall_s:.1f}",
                "",
                "",
            ],
        ],
    )


if __name__ == "__main__":
    main()
