"""Helpers of the service tests: create a service, wait for its replicas, send requests
through its front door and count who answered."""

from __future__ import annotations

import http.client
import importlib.util
import json
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import REPO, wait_until

# Where gpusched looks for it too (proc/haproxy.py): on PATH, or in the sbin folders.
HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
_haproxy_installed = pytest.mark.skipif(
    HAPROXY is None,
    reason="HAProxy is not installed (Debian/Ubuntu: apt-get install haproxy); .ci/run installs it",
)


def needs_haproxy(test):
    """A test of a real HAProxy front door: the system tier, skipped where HAProxy is missing."""
    return pytest.mark.system(_haproxy_installed(test))


# jobs/serve.py is a torch model: without the `jobs` extra, the tests that run it skip.
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="jobs/serve.py needs torch: pip install torch==2.13.0 -e '.[test,jobs]'",
)

SERVER = Path(__file__).resolve().parent / "svcserver.py"
SERVE = [
    sys.executable,
    str(REPO / "jobs" / "serve.py"),
    "--hidden",
    "32",
    "--layers",
    "1",
    "--threads",
    "1",
    "--max-wait-ms",
    "0",
]
TINY = [sys.executable, str(SERVER)]


def create(home, name: str, *args: str, command: list[str] = TINY) -> dict:
    proc = home.run("service", "create", name, "--json", *args, "--", *command)
    return json.loads(proc.stdout)


def show(home, name: str) -> dict:
    return json.loads(home.run("service", "show", name, "--json").stdout)


def wait_ready(
    home, name: str, count: int, timeout: float = 90.0, generation: int | None = None
) -> dict:
    """The service once exactly `count` replicas (of `generation`, if given) are ready and
    no other is left."""

    def ready():
        shown = show(home, name)
        replicas = shown["replicas"]
        good = [
            r
            for r in replicas
            if r["door"] == "ready" and (generation is None or r["generation"] == generation)
        ]
        return shown if len(good) == count and len(replicas) == count else None

    return wait_until(ready, f"{count} ready replica(s) of {name}", timeout)


def ask(
    listen: str,
    path: str = "/predict",
    body: bytes | None = None,
    conn: http.client.HTTPConnection | None = None,
) -> tuple[int, bytes]:
    host, port = listen.rsplit(":", 1)
    own = conn is None
    conn = conn or http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        if own:
            conn.close()


def who_answers(listen: str, count: int) -> Counter:
    """Which replica (job id) answered each of `count` requests, one after another."""
    return Counter(json.loads(ask(listen, "/")[1])["job"] for _ in range(count))


PREDICT = json.dumps({"input": [0.5] * 64}).encode()


class Traffic:
    """Requests sent without a pause from `clients` threads until stopped: each outcome
    recorded with its time."""

    def __init__(
        self, listen: str, clients: int = 2, path: str = "/predict", body: bytes | None = PREDICT
    ):
        self.listen, self.path, self.body = listen, path, body
        self.outcomes: list[tuple[float, int]] = []  # (monotonic time, status; 0: no answer)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = ask(self.listen, self.path, self.body)[0]
            except (OSError, http.client.HTTPException):
                status = 0
            self.outcomes.append((time.monotonic(), status))

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def failures(self, after: float = 0.0) -> list[tuple[float, int]]:
        return [o for o in self.outcomes if o[0] >= after and o[1] != 200]

    def served(self) -> int:
        return sum(1 for _, status in self.outcomes if status == 200)
