"""jobs/serve.py under a real daemon: answers, batches under concurrent load, strict /metrics."""

from __future__ import annotations

import http.client
import importlib.util
import itertools
import json
import math
import re
import subprocess
import sys
import threading

import pytest

from conftest import REPO, wait_until

JOBS = REPO / "jobs"


def load_prom():
    """jobs/prom.py (standard library only), without putting jobs/ on everyone's sys.path."""
    spec = importlib.util.spec_from_file_location("jobs_prom", JOBS / "prom.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prom = load_prom()

# -- a small strict parser of the Prometheus text format (0.0.4) --------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(rf"({NAME})(?:\{{((?:{LABEL},?)*)\}})? (\S+)(?: (-?\d+))?")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


def parse_value(text: str) -> float:
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise ValueError(f"bad sample value {text!r}")
    return float(text)


def family_of(name: str, types: dict[str, str]) -> str:
    for family, kind in types.items():
        if name == family or any(name == family + s for s in SUFFIXES.get(kind, ())):
            return family
    raise ValueError(f"sample {name} before its # TYPE line")


def parse_prometheus(text: str) -> dict[str, dict]:
    """{family: {"type", "help", "samples": [(name, labels, value)]}}; ValueError if malformed."""
    if not text.endswith("\n"):
        raise ValueError("the exposition must end with a newline")
    families: dict[str, dict] = {}
    types: dict[str, str] = {}
    finished: set[str] = set()
    current = None
    for line in text[:-1].split("\n"):
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                if not re.fullmatch(NAME, parts[2]):
                    raise ValueError(f"bad metric name in {line!r}")
                family = families.setdefault(
                    parts[2], {"type": "untyped", "help": None, "samples": []}
                )
                key = parts[1].lower()
                if parts[1] == "TYPE":
                    if (
                        parts[2] in types
                        or family["samples"]
                        or parts[3:] == []
                        or parts[3] not in TYPES
                    ):
                        raise ValueError(f"bad or repeated TYPE: {line!r}")
                    types[parts[2]] = family["type"] = parts[3]
                elif family["help"] is not None:
                    raise ValueError(f"repeated HELP: {line!r}")
                else:
                    family[key] = parts[3] if len(parts) > 3 else ""
            continue
        match = SAMPLE.fullmatch(line)
        if not match:
            raise ValueError(f"malformed sample line {line!r}")
        name = match.group(1)
        family = family_of(name, types)
        if family != current:
            if family in finished:
                raise ValueError(f"samples of {family} are not together")
            if current:
                finished.add(current)
            current = family
        labels = dict(re.findall(LABEL, match.group(2) or ""))
        families[family]["samples"].append((name, labels, parse_value(match.group(5))))
    for family in families.values():
        if family["type"] == "histogram":
            check_histogram(family["samples"])
    return families


def check_histogram(samples: list) -> None:
    buckets = [(parse_value(labels["le"]), v) for n, labels, v in samples if n.endswith("_bucket")]
    count = [v for n, _, v in samples if n.endswith("_count")]
    if not buckets or buckets[-1][0] != math.inf or len(count) != 1:
        raise ValueError("a histogram needs a +Inf bucket and one _count")
    if [b for b, _ in buckets] != sorted(b for b, _ in buckets):
        raise ValueError("histogram buckets out of order")
    if any(a > b for (_, a), (_, b) in itertools.pairwise(buckets)):
        raise ValueError("histogram buckets are not cumulative")
    if buckets[-1][1] != count[0] or not any(n.endswith("_sum") for n, _, _ in samples):
        raise ValueError("+Inf bucket differs from _count, or _sum is missing")


def test_the_parser_refuses_malformed_text():
    good = "# TYPE a counter\na 1\n"
    assert parse_prometheus(good)["a"]["samples"] == [("a", {}, 1.0)]
    for bad in (
        "a 1\n",  # no TYPE
        "# TYPE a counter\na one\n",
        "# TYPE a counter\na 1",  # no final newline
        "# TYPE a counter\n# TYPE a counter\na 1\n",
        "# TYPE a counter\n# TYPE b counter\na 1\nb 1\na 2\n",  # not together
        '# TYPE a counter\na{x="y} 1\n',
        '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',
    ):
        with pytest.raises(ValueError):
            parse_prometheus(bad)


def test_prom_renders_what_the_parser_accepts_with_escaped_labels():
    counter = prom.Counter("requests_total", "Requests.", ("path", "code"))
    counter.inc('/a"b\\c\nd', "200")
    histogram = prom.Histogram("size", "Sizes.", (1, 2, 4))
    for value in (1, 3, 3, 9):
        histogram.observe(value)
    parsed = parse_prometheus(
        prom.render([counter, histogram, prom.Gauge("depth", "Depth.", lambda: 2)])
    )
    assert parsed["requests_total"]["samples"] == [
        ("requests_total", {"path": '/a\\"b\\\\c\\nd', "code": "200"}, 1.0)
    ]
    buckets = {labels["le"]: v for n, labels, v in parsed["size"]["samples"] if n == "size_bucket"}
    assert buckets == {"1": 1, "2": 1, "4": 3, "+Inf": 4}
    assert parsed["depth"]["samples"] == [("depth", {}, 2.0)]


# -- the service under gpusched -----------------------------------------------------------------


class Client:
    def __init__(self, port: int):
        self.port = port

    def request(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def predict(self, features: list[float]) -> dict:
        status, body = self.request("POST", "/predict", {"input": features})
        assert status == 200, body
        return json.loads(body)

    def metrics(self) -> dict[str, dict]:
        status, body = self.request("GET", "/metrics")
        assert status == 200
        return parse_prometheus(body.decode())


def concurrent_predictions(client: Client, clients: int, rounds: int) -> list[dict]:
    """`clients` threads, each sending `rounds` requests back to back."""
    results: list[dict] = []
    errors: list[BaseException] = []

    def one_client(seed: int) -> None:
        try:
            for n in range(rounds):
                results.append(client.predict([seed + n / 10] * 8))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return results


def samples_of(metrics: dict, family: str) -> dict:
    return {
        (name, tuple(sorted(labels.items()))): value
        for name, labels, value in metrics[family]["samples"]
    }


def test_serve_under_gpusched_answers_batches_and_exports_metrics(home, tmp_path):
    pytest.importorskip("torch")
    port_file = tmp_path / "port"
    job_id = home.submit(
        "--name",
        "serve",
        "--",
        sys.executable,
        str(JOBS / "serve.py"),
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--features",
        "8",
        "--hidden",
        "32",
        "--layers",
        "2",
        "--max-batch-size",
        "16",
        "--max-wait-ms",
        "20",
    )
    port = int(
        wait_until(
            lambda: port_file.exists() and port_file.read_text(),
            "the service to listen",
            timeout=120,
        )
    )
    client = Client(port)
    assert client.request("GET", "/healthz") == (200, b"ok\n")
    single = client.predict([0.5] * 8)
    assert len(single["output"]) == 10 and single["batch_size"] == 1
    status, body = client.request("POST", "/predict", {"input": [1.0]})
    assert status == 400 and b"takes 8" in body
    assert client.request("GET", "/nope")[0] == 404

    results = concurrent_predictions(client, clients=16, rounds=5)
    assert len(results) == 80 and max(r["batch_size"] for r in results) > 1

    metrics = client.metrics()
    batches = samples_of(metrics, "serve_batch_size")
    forward_passes = batches[("serve_batch_size_count", ())]
    assert batches[("serve_batch_size_sum", ())] == 81  # every prediction, once
    assert forward_passes < 81  # so some pass carried more than one request
    assert batches[("serve_batch_size_bucket", (("le", "1"),))] < forward_passes
    latency = samples_of(metrics, "serve_request_latency_seconds")
    assert latency[("serve_request_latency_seconds_count", ())] == 81
    requests = samples_of(metrics, "serve_requests_total")
    assert requests[("serve_requests_total", (("code", "200"), ("path", "/predict")))] == 81
    assert requests[("serve_requests_total", (("code", "400"), ("path", "/predict")))] == 1
    assert requests[("serve_requests_total", (("code", "404"), ("path", "other")))] == 1
    assert metrics["serve_queue_depth"]["type"] == "gauge"
    assert metrics["serve_queue_depth"]["samples"][0][2] >= 0

    loadgen = subprocess.run(
        [
            sys.executable,
            str(JOBS / "loadgen.py"),
            "--url",
            f"http://127.0.0.1:{port}",
            "--clients",
            "4",
            "--duration-s",
            "1",
            "--features",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loadgen.returncode == 0, loadgen.stderr
    summary = json.loads(loadgen.stdout)
    assert summary["requests"] > 0 and summary["errors"] == 0
    assert 0 < summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"]

    home.run("cancel", str(job_id))
    assert home.wait_state(job_id, "cancelled")["exit_code"] == 143  # it shut down by itself
    with pytest.raises(ConnectionRefusedError):
        client.request("GET", "/healthz")
