"""The /metrics HTTP server: prometheus_client's WSGI app, with at most MAX_CONNECTIONS
connections (a thread each), each closed once idle for IDLE_S. prometheus_client's own
server starts a thread per connection without bound: 4,000 idle connections made 4,000
threads in the daemon."""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

MAX_CONNECTIONS = 64  # more at once are closed as they come (a scrape takes milliseconds)
IDLE_S = 5.0  # a connection that sends nothing for this long is closed


def start_server(host: str, port: int, registry: Any) -> tuple[Any, threading.Thread]:
    """prometheus_client's WSGI app behind a server of bounded threads, serving in a thread."""
    # As prometheus_client picks them: the first address the host gives, and its family.
    family, *_, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    host = str(address[0])  # a name or address: a str for AF_INET and AF_INET6
    server_class = type("MetricsServer", (_BoundedServer,), {"address_family": family})
    server: WSGIServer = make_server(
        host, port, make_wsgi_app(registry), server_class, _QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread


class _QuietHandler(WSGIRequestHandler):
    timeout = IDLE_S  # set on the connection: each read waits this long at most

    def log_message(self, *args: Any) -> None:
        pass  # a scrape every few seconds is not news


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS of them: one more is closed at once."""

    daemon_threads = True
    # Connections waiting to be accepted: with socketserver's 5, a burst of connections
    # waits out SYN retries of a second and more.
    request_queue_size = 128

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out or went away; the next scrape is another
