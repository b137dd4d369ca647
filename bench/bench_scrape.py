"""The cost of one /metrics scrape of a daemon with 8 GPUs and 1,000 queued jobs, against
the daemon's own `status` request and an empty prometheus_client registry, in the same run
(issue 16: a scrape costs under 5 ms).

A real daemon on 8 simulated GPUs, `[metrics] listen` on a free port: 8 jobs run (one per
GPU) and 1,000 wait. Samples alternate: an HTTP GET of /metrics as Prometheus makes it (a
new connection each time), a `status` request over the daemon's socket, and a GET of an
empty registry served by prometheus_client in this process (the HTTP floor). Also
printed: the daemon's own figure for gathering a scrape (gpusched_metrics_scrape_duration_
seconds, read from each scrape), and the size of a scrape.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
import urllib.request

from common import Gpusched, interleaved, median_ms, print_table, ratio, scratch_dir, verdict
from prometheus_client import CollectorRegistry, start_http_server

TARGET_MS = 5.0
GPUS, QUEUED = 8, 1000
_OWN_FIGURE = re.compile(r"^gpusched_metrics_scrape_duration_seconds ([0-9.e+-]+)$", re.M)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def fill_queue(gs: Gpusched) -> list[int]:
    """GPUS jobs running and QUEUED waiting behind them: one submit --from-file."""
    lines = scratch_dir() / "jobs.txt"
    lines.write_text("sleep 3600\n" * (GPUS + QUEUED))
    ids = json.loads(gs.cli("submit", "--json", "--gpus", "1", "--from-file", str(lines)))
    ids = ids["ids"] if isinstance(ids, dict) else [job["id"] for job in ids]
    deadline = time.monotonic() + 60
    while gs.call("status")["running"] < GPUS:
        if time.monotonic() > deadline:
            raise RuntimeError("the first jobs did not start within 60 s")
        time.sleep(0.05)
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="samples of each (default 200)")
    args = parser.parse_args()

    empty, _ = start_http_server(0, addr="127.0.0.1", registry=CollectorRegistry())
    empty_url = f"http://127.0.0.1:{empty.server_address[1]}/metrics"
    config = '[metrics]\nlisten = "127.0.0.1:0"\n[host]\ncpus = 64\n'
    with Gpusched(f"{GPUS}x80GiB", config) as gs:
        ids = fill_queue(gs)
        url = gs.call("status")["metrics"]
        status = gs.call("status")
        assert (status["running"], status["pending"]) == (GPUS, QUEUED), status
        own_s: list[float] = []
        size: list[int] = []

        def scrape() -> float:
            started = time.perf_counter()
            body = get(url)
            elapsed = time.perf_counter() - started
            own_s.append(float(_OWN_FIGURE.search(body.decode()).group(1)))
            size.append(len(body))
            return elapsed

        def status_call() -> float:
            started = time.perf_counter()
            gs.call("status")
            return time.perf_counter() - started

        def floor() -> float:
            started = time.perf_counter()
            get(empty_url)
            return time.perf_counter() - started

        for _ in range(5):  # warm: imports, first connections
            scrape(), status_call(), floor()
        samples = interleaved(args.runs, {"scrape": scrape, "status": status_call, "floor": floor})
        gs.cli("cancel", *map(str, ids))
    empty.shutdown()

    ours = median_ms(samples["scrape"])
    print_table(
        f"/metrics scrape, {GPUS} simulated GPUs, {GPUS} jobs running and {QUEUED} pending, "
        f"{args.runs} samples each (a scrape is {statistics.median(size) / 1024:.1f} KiB)",
        ["measure", "median", "vs status", "vs empty registry", "target"],
        [
            [
                "GET /metrics (the daemon's scrape)",
                f"{ours:.2f} ms",
                ratio(ours, median_ms(samples["status"])),
                ratio(ours, median_ms(samples["floor"])),
                f"<= {TARGET_MS:g} ms {verdict(ours, TARGET_MS)}",
            ],
            ["  of which gathering the figures", f"{median_ms(own_s):.2f} ms", "", "", ""],
            [
                "`status` over the daemon's socket",
                f"{median_ms(samples['status']):.2f} ms",
                "1.00x",
                "",
                "",
            ],
            [
                "GET of an empty registry (HTTP floor)",
                f"{median_ms(samples['floor']):.2f} ms",
                "",
                "1.00x",
                "",
            ],
        ],
    )


if __name__ == "__main__":
    main()
