"""Drive serve.py with N concurrent clients for T seconds; print throughput and p50/p95/p99.

python jobs/loadgen.py --url http://127.0.0.1:8000 --clients 16 --duration-s 10
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass

MAX_CLIENTS = 1024
MAX_DURATION_S = 3600.0


@dataclass(frozen=True)
class LoadResult:
    requests: int
    errors: int
    duration_s: float
    latencies_s: tuple[float, ...]  # successful requests only, sorted

    @property
    def throughput_rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    def percentile_ms(self, pct: float) -> float:
        """Nearest-rank percentile, in milliseconds (nan without any success)."""
        if not self.latencies_s:
            return math.nan
        rank = max(1, math.ceil(pct / 100 * len(self.latencies_s)))
        return self.latencies_s[rank - 1] * 1e3

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "duration_s": round(self.duration_s, 3),
            "throughput_rps": round(self.throughput_rps, 1),
            **{f"p{p}_ms": round(self.percentile_ms(p), 3) for p in (50, 95, 99)},
        }


def client_loop(
    host: str,
    port: int,
    body: bytes,
    deadline_s: float,
    timeout_s: float,
    latencies_s: list[float],
    errors: list[int],
) -> None:
    """One client: a keep-alive connection, one request at a time, until the deadline."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    headers = {"Content-Type": "application/json"}
    try:
        while time.monotonic() < deadline_s:
            started_s = time.perf_counter()
            try:
                conn.request("POST", "/predict", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                conn.close()  # reconnects on the next request
                time.sleep(0.01)  # a server that is down must not turn this into a busy loop
                ok = False
            if ok:
                latencies_s.append(time.perf_counter() - started_s)
            else:
                errors.append(1)
    finally:
        conn.close()


def run_load(
    url: str, clients: int, duration_s: float, features: int = 64, timeout_s: float = 10.0
) -> LoadResult:
    """Run the clients in threads (they wait on the network, so the GIL is no bottleneck)."""
    if not 1 <= clients <= MAX_CLIENTS or not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"need 1..{MAX_CLIENTS} clients and 0..{MAX_DURATION_S:.0f} s")
    parsed = urllib.parse.urlsplit(url)
    body = json.dumps({"input": [random.uniform(-1, 1) for _ in range(features)]}).encode()
    latencies_s: list[float] = []  # list.append is atomic under the GIL
    errors: list[int] = []
    started_s = time.monotonic()
    deadline_s = started_s + duration_s
    threads = [
        threading.Thread(
            target=client_loop,
            daemon=True,
            args=(
                parsed.hostname,
                parsed.port or 80,
                body,
                deadline_s,
                timeout_s,
                latencies_s,
                errors,
            ),
        )
        for _ in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=duration_s + timeout_s + 5)  # a stuck client cannot hang us
    elapsed_s = time.monotonic() - started_s
    return LoadResult(len(latencies_s), len(errors), elapsed_s, tuple(sorted(latencies_s)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--clients", type=int, default=16, help=f"1..{MAX_CLIENTS}")
    parser.add_argument(
        "--duration-s", type=float, default=10.0, help=f"up to {MAX_DURATION_S:.0f}"
    )
    parser.add_argument("--features", type=int, default=64, help="Must match serve.py's.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = parser.parse_args(argv)
    try:
        result = run_load(args.url, args.clients, args.duration_s, args.features)
    except ValueError as exc:
        parser.error(str(exc))
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['requests']} requests, {summary['errors']} errors in "
            f"{summary['duration_s']} s: {summary['throughput_rps']} req/s; latency "
            f"p50 {summary['p50_ms']} ms, p95 {summary['p95_ms']} ms, p99 {summary['p99_ms']} ms"
        )
    return 1 if result.requests == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
