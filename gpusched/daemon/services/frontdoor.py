"""One service's front door as the daemon keeps it: its HAProxy, which replicas are in it
(checking, ready, draining), and what it measured (requests, latencies, load samples,
scale events) for autoscaling and `service show`."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gpusched.core.services import LoadSample, p95
from gpusched.proc.haproxy import Proxy, RequestLog, ServerStat, new_token

log = logging.getLogger("gpusched.daemon.services.frontdoor")

# Latency histogram bounds (ms) for `service show` and /metrics.
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
_KEEP_S = 600.0  # samples and latencies kept: the longest window, and then some
# Latencies kept for p50/p95 (the newest): a flood of requests must not grow the daemon.
_LATENCIES_MOST = 10000
_RETRY_START_S = 5.0


class Door:
    def __init__(self, folder: str, name: str, socket_folder: str):
        self.proxy = Proxy(folder, name, socket_folder)
        self.requests: RequestLog | None = None
        self.servers: dict[int, str] = {}  # replica job id -> checking | ready | draining
        self.draining_since: dict[int, float] = {}
        self.stats: dict[str, ServerStat] = {}
        self.problem = ""  # why the proxy is not running, for `service show`
        self.next_start_s = 0.0
        self.requests_total = 0
        self.failed_total = 0  # answered 5xx (or not at all) through the door
        self.histogram = [0] * (len(LATENCY_BUCKETS_MS) + 1)
        self.latency_sum_ms = 0.0
        self.scale_events = 0
        self.latencies: deque[tuple[float, float]] = deque(maxlen=_LATENCIES_MOST)  # (when, ms)
        self.counted: deque[tuple[float, int]] = deque()  # (when, requests) of each step
        self.samples: deque[LoadSample] = deque()
        self.events: deque[tuple[float, str]] = deque(maxlen=20)
        self.last_change_s = 0.0
        # Replicas that ended without ever passing a health check, in a row: each makes
        # the next replica wait longer (a broken command must not spin the queue).
        self.seen: dict[int, bool] = {}  # replica job id -> has it been ready
        self.failures_in_row = 0
        self.restart_at_mono = 0.0
        self.rolling = 0  # the update being rolled out, until its last old replica is gone

    def count_ends(
        self,
        active_ids: set[int],
        now_mono: float,
        now: float,
        ended: Callable[[int], tuple[str, str]],
    ) -> None:
        """Replicas gone without the service stopping them (it forgets those it stops):
        each an event, ended(job id) -> (which replica, how it ended)."""
        for job_id in [i for i in self.seen if i not in active_ids]:
            who, how = ended(job_id)
            # Ready in the door and gone before a step marked it so, it served all the same.
            if self.seen.pop(job_id) or self.servers.get(job_id) == "ready":
                self.failures_in_row = 0
                self.note(f"{who} died: {how}", now)
            else:
                self.failures_in_row += 1
                delay_s = min(2.0**self.failures_in_row, 60.0)
                self.restart_at_mono = now_mono + delay_s
                self.note(
                    f"{who} died before passing a health check: {how} "
                    f"({self.failures_in_row} in a row); the next one in {delay_s:.0f}s "
                    "(see `gpusched logs`)",
                    now,
                )
        for job_id, status in self.servers.items():
            if status == "ready" and job_id in active_ids:  # also one adopted at a restart
                self.seen[job_id] = True

    @staticmethod
    def server_name(job_id: int) -> str:
        return f"r{job_id}"

    def open_log(self, fresh: bool = False) -> RequestLog:
        """The request log, opened where it is not: a running proxy's on the port and with
        the secret of its config. Where another process took that port meanwhile (a daemon
        restart), it reads the lines, secret and all; a config of an older gpusched has no
        secret: either proxy is stopped, and the next step starts one with a new port and
        secret."""
        if self.requests is not None:
            return self.requests
        known = {} if fresh else self.proxy.configured()
        port = known.get("log_port", 0)
        requests = self.requests = RequestLog(port, known.get("token") or new_token())
        if port and (requests.port != port or "token" not in known):
            log.warning(
                "service %s: its request log port %d is taken, or has no secret; "
                "restarting its front door",
                self.proxy.name,
                port,
            )
            self.proxy.stop()
        return requests

    def close(self) -> None:
        if self.requests is not None:
            self.requests.close()
            self.requests = None

    def adopt(self) -> None:
        """A proxy that outlived a daemon: take its servers as they are."""
        self.read_stats()
        for name, stat in self.stats.items():
            if name.startswith("r") and name[1:].isdigit():
                self.servers[int(name[1:])] = (
                    "draining"
                    if stat.status.startswith("DRAIN") and stat.checked_ok
                    else "ready"
                    if stat.status.startswith("UP")
                    else "checking"
                )

    def read_stats(self) -> bool:
        try:
            self.stats = self.proxy.stats()
        except OSError:
            self.stats = {}
            return False
        return True

    def note(self, event: str, now: float) -> None:
        log.info("service %s: %s", self.proxy.name, event)
        self.events.append((now, event))

    def take_requests(self, now: float) -> list[float]:
        """The requests logged since the last call: counted, and their latencies (ms)."""
        if self.requests is None:
            return []
        got = self.requests.read()
        latencies = []
        for latency_ms, status, _server in got:
            self.requests_total += 1
            if status >= 500 or status < 0 or latency_ms < 0:
                self.failed_total += 1
            latencies.append(max(latency_ms, 0.0))
            self.histogram[_bucket(latency_ms)] += 1
            self.latency_sum_ms += max(latency_ms, 0.0)
            self.latencies.append((now, latency_ms))
        if got:
            self.counted.append((now, len(got)))
        for window in (self.latencies, self.counted):
            while window and window[0][0] < now - _KEEP_S:
                window.popleft()
        return latencies

    def sample(self, now: float, latencies: list[float], gpu_util_pct: float | None) -> None:
        backend = self.stats.get("BACKEND")
        in_flight = backend.in_flight if backend else 0
        ready = sum(1 for state in self.servers.values() if state == "ready")
        self.samples.append(LoadSample(now, in_flight, ready, p95(latencies), gpu_util_pct))
        while self.samples and self.samples[0].at_s < now - _KEEP_S:
            self.samples.popleft()

    def due_start(self, now_mono: float) -> bool:
        if now_mono < self.next_start_s:
            return False
        self.next_start_s = now_mono + _RETRY_START_S
        return True

    def summary(self, now: float, window_s: float = 60.0) -> dict[str, Any]:
        recent = [ms for when, ms in self.latencies if when >= now - window_s]
        requests = sum(count for when, count in self.counted if when >= now - window_s)
        last = self.samples[-1] if self.samples else None
        return {
            "proxy_pid": self.proxy.pid(),
            "problem": self.problem,
            "requests_total": self.requests_total,
            "failed_total": self.failed_total,
            "log_lines_refused": self.requests.refused if self.requests else 0,
            "in_flight": last.in_flight if last else 0,
            "requests_per_s": round(requests / window_s, 3),
            "p50_ms": _quantile(recent, 0.5),
            "p95_ms": p95(recent),
            "latency_buckets_ms": list(LATENCY_BUCKETS_MS),
            "latency_counts": list(self.histogram),
            "latency_sum_ms": self.latency_sum_ms,
            "scale_events_total": self.scale_events,
            "events": [{"at": at, "event": text} for at, text in self.events],
        }


def _bucket(latency_ms: float) -> int:
    for i, bound in enumerate(LATENCY_BUCKETS_MS):
        if latency_ms <= bound:
            return i
    return len(LATENCY_BUCKETS_MS)


def _quantile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def minute_of_day(epoch_s: float) -> int:
    local = time.localtime(epoch_s)
    return local.tm_hour * 60 + local.tm_min
