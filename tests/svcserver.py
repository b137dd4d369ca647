"""A tiny replica for the service tests (standard library only, starts in a blink): answers
every request with its job id on $PORT; SLOW_SLOT's replica takes DELAY_S per request, and
every replica HEALTH_DELAY_S per health check (/healthz)."""

from __future__ import annotations

import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JOB_ID = os.environ.get("GPUSCHED_JOB_ID", "?")
SLOW = os.environ.get("GPUSCHED_SERVICE_REPLICA") == os.environ.get("SLOW_SLOT", "-")
DELAY_S = float(os.environ.get("DELAY_S", "0"))
HEALTH_DELAY_S = float(os.environ.get("HEALTH_DELAY_S", "0"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args) -> None:
        pass

    def answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if SLOW and self.path != "/healthz":
            time.sleep(DELAY_S)
        if self.path == "/healthz":
            time.sleep(HEALTH_DELAY_S)
        body = json.dumps({"job": JOB_ID}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


Server(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
