"""An HTTP inference service for a small model with dynamic batching, /healthz and /metrics.

    python jobs/serve.py --port 0 --port-file port.txt --max-batch-size 32 --max-wait-ms 5

POST /predict {"input": [FEATURES floats]} -> {"output": [CLASSES floats], "batch_size": N}.
Requests wait at most --max-wait-ms for others, then up to --max-batch-size of them go
through one forward pass. jobs/README.md shows how to run it under gpusched.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from torch import nn

JOBS_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(JOBS_DIR), str(JOBS_DIR.parent)]  # prom beside us; gpusched from a checkout
import prom  # noqa: E402  (jobs/prom.py, beside this file)

from gpusched import job  # noqa: E402

MAX_BODY_BYTES = 1 << 20
ROUTES = ("/predict", "/healthz", "/metrics")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PORT") or 8000),
        help="0 picks a free port (default: $PORT, which gpusched gives "
        "each replica of a service, else 8000).",
    )
    parser.add_argument("--port-file", help="Write the port here once listening.")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument(
        "--max-queue",
        type=int,
        default=1024,
        help="Requests waiting beyond this get 503 (back-pressure).",
    )
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4, help="Hidden layers of the MLP.")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument(
        "--quantize",
        action="store_true",
        help="int8 dynamic quantization of the Linear layers (CPU only).",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads (0: torch's default). The HTTP threads "
        "need CPU too, so 1 is often fastest on a small CPU.",
    )
    args = parser.parse_args(argv)
    if min(args.max_batch_size, args.max_queue, args.layers) < 1 or args.max_wait_ms < 0:
        parser.error("--max-batch-size, --max-queue and --layers must be >= 1, --max-wait-ms >= 0")
    return args


def build_model(
    features: int, hidden: int, classes: int, layers: int = 4, quantize: bool = False
) -> nn.Module:
    """A fixed random MLP (seeded: every replica answers alike); no weights to download."""
    torch.manual_seed(0)
    blocks: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    model = nn.Sequential(*blocks, nn.Linear(hidden, classes)).eval()
    if quantize:
        from torch.ao.quantization import quantize_dynamic  # noqa: PLC0415 - only with --quantize

        model = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    return model


@dataclass
class Pending:
    features: list[float]
    done: threading.Event = field(default_factory=threading.Event)
    output: list[float] | None = None
    batch_size: int = 0
    error: str = ""


class Metrics:
    def __init__(self, queue_depth) -> None:
        self.requests = prom.Counter(
            "serve_requests_total", "HTTP requests by path and status.", ("path", "code")
        )
        self.batch_size = prom.Histogram(
            "serve_batch_size", "Requests per forward pass.", BATCH_BUCKETS
        )
        self.latency = prom.Histogram(
            "serve_request_latency_seconds",
            "Time from request to answer for /predict.",
            LATENCY_BUCKETS_S,
        )
        self.queue_depth = prom.Gauge(
            "serve_queue_depth", "Requests waiting for a batch.", queue_depth
        )

    def text(self) -> str:
        return prom.render([self.requests, self.batch_size, self.latency, self.queue_depth])


class Batcher:
    """One thread owns the model: it gathers requests into batches and runs them."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        threads: int = 0,
    ):
        self.model, self.device = model, device
        self.threads = threads or torch.get_num_threads()
        self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_ms / 1000
        self.queue: queue.Queue[Pending] = queue.Queue(maxsize=max_queue)
        self.metrics = Metrics(self.queue.qsize)
        self.thread = threading.Thread(target=self.run, name="batcher", daemon=True)

    def submit(self, pending: Pending) -> bool:
        try:
            self.queue.put_nowait(pending)
        except queue.Full:
            return False
        return True

    def gather(self) -> list[Pending]:
        """Block for the first request, then take more until the batch is full or time is up."""
        batch = [self.queue.get()]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            left_s = deadline - time.monotonic()
            try:
                batch.append(
                    self.queue.get(timeout=left_s) if left_s > 0 else self.queue.get_nowait()
                )
            except queue.Empty:
                break
        return batch

    def run(self) -> None:
        # torch's thread count is per calling thread (OpenMP): set here, where the model
        # runs. Left unset, a batch of 8 took 100x longer than one of 1 on a busy 2-core box.
        torch.set_num_threads(self.threads)
        while True:
            batch = self.gather()
            try:
                inputs = torch.tensor([p.features for p in batch], dtype=torch.float32)
                with torch.inference_mode():
                    outputs = self.model(inputs.to(self.device)).cpu().tolist()
            except Exception as exc:
                outputs, error = [None] * len(batch), f"{type(exc).__name__}: {exc}"
            else:
                error = ""
            self.metrics.batch_size.observe(len(batch))
            for pending, output in zip(batch, outputs):
                pending.output, pending.batch_size, pending.error = output, len(batch), error
                pending.done.set()


class BadRequest(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection
    batcher: Batcher
    features: int

    def log_message(self, *_args) -> None:
        pass  # one line per request would drown the job's log; /metrics counts them

    def reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        route = self.path if self.path in ROUTES else "other"  # bounded label values
        self.batcher.metrics.requests.inc(route, str(code))
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def reply_json(self, code: int, data: dict) -> None:
        self.reply(code, json.dumps(data).encode())

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self.reply(200, b"ok\n", "text/plain; charset=utf-8")
        elif self.path == "/metrics":
            self.reply(200, self.batcher.metrics.text().encode(), prom.CONTENT_TYPE)
        else:
            self.reply_json(404, {"error": f"no route {self.path}; try POST /predict"})

    def do_POST(self) -> None:
        started_s = time.perf_counter()
        if self.path != "/predict":
            self.close_connection = True  # its body stays unread
            self.reply_json(404, {"error": f"no route {self.path}; try POST /predict"})
            return
        try:
            pending = Pending(self.read_features())
        except BadRequest as exc:
            self.reply_json(exc.code, {"error": str(exc)})
            return
        if not self.batcher.submit(pending):
            self.reply_json(503, {"error": "queue full; retry later"})
            return
        pending.done.wait()
        if pending.error:
            self.reply_json(500, {"error": pending.error})
            return
        # Observed before the answer goes out, so a client that has its answer
        # also finds it counted in /metrics.
        self.batcher.metrics.latency.observe(time.perf_counter() - started_s)
        self.reply_json(200, {"output": pending.output, "batch_size": pending.batch_size})

    def read_features(self) -> list[float]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True  # where this body ends is anyone's guess
            raise BadRequest(400, "a valid Content-Length is required")
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the unread body would be parsed as the next request
            raise BadRequest(413, f"body over {MAX_BODY_BYTES} bytes")
        try:
            features = [float(v) for v in json.loads(self.rfile.read(length))["input"]]
        except (ValueError, TypeError, KeyError):
            raise BadRequest(400, f'send JSON {{"input": [{self.features} numbers]}}') from None
        if len(features) != self.features:
            raise BadRequest(
                400, f"input has {len(features)} numbers; the model takes {self.features}"
            )
        return features


class Server(ThreadingHTTPServer):
    daemon_threads = True  # open keep-alive connections must not block the exit
    request_queue_size = 256  # the default backlog of 5 drops connections under a burst


def write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(f"{port}\n")
    os.replace(tmp, path)  # a reader never sees a half-written port


def make_server(args: argparse.Namespace) -> tuple[ThreadingHTTPServer, Batcher]:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quantize else "cpu")
    model = build_model(args.features, args.hidden, args.classes, args.layers, args.quantize).to(
        device
    )
    batcher = Batcher(
        model, device, args.max_batch_size, args.max_wait_ms, args.max_queue, args.threads
    )
    handler = type("BoundHandler", (Handler,), {"batcher": batcher, "features": args.features})
    server = Server(("127.0.0.1", args.port), handler)
    return server, batcher


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    job.limit_torch_memory()  # a service sharing a GPU stays within its --gpu-mem
    server, batcher = make_server(args)
    batcher.thread.start()
    # SIGTERM (a cancel) unwinds serve_forever with SystemExit; the finally closes the socket.
    job.on_preempt(lambda signum: print(f"signal {signum}: shutting down", flush=True))
    port = server.server_address[1]
    if args.port_file:
        write_port_file(args.port_file, port)
    print(
        f"listening on http://127.0.0.1:{port} (max batch {args.max_batch_size}, "
        f"max wait {args.max_wait_ms} ms, device {batcher.device})",
        flush=True,
    )
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
