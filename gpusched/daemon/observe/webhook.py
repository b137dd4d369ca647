"""Post one notification to a webhook: JSON with a Slack/Mattermost-style `text`, a
deadline on the whole of each try, retries with backoff where another try can help, no
redirects."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from gpusched import __version__

BACKOFF_FIRST_S = 1.0  # then doubled each retry,
BACKOFF_MAX_S = 30.0  # up to this
RESPONSE_KEPT_BYTES = 1024  # read of an answer at most: a webhook's answer is a status


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect would carry the body (and the URL's secret path) somewhere not configured.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Cutoff:
    """Shuts the sockets of one try at its deadline. A socket timeout bounds each read,
    not the answer: a server that drips a header line every few seconds would hold a
    notification thread forever."""

    def __init__(self, seconds: float):
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Cutoff:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def opener(self) -> urllib.request.OpenerDirector:
        cutoff = self

        class Http(urllib.request.HTTPHandler):
            def http_open(self, req: Any) -> Any:
                return self.do_open(cutoff._watched(http.client.HTTPConnection), req)

        class Https(urllib.request.HTTPSHandler):
            def https_open(self, req: Any) -> Any:
                return self.do_open(cutoff._watched(http.client.HTTPSConnection), req)

        return urllib.request.build_opener(_NoRedirects, Http, Https)

    def _watched(self, connection_class: Any) -> Callable[..., Any]:
        def make(*args: Any, **kwargs: Any) -> Any:
            conn = connection_class(*args, **kwargs)
            connect = conn.connect

            def connect_and_watch() -> None:
                connect()
                with self._lock:
                    self._sockets.append(conn.sock)
                    if self.fired:  # the deadline came during the connect
                        _shut(conn.sock)

            conn.connect = connect_and_watch
            return conn

        return make

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown (a TLS one's would talk TLS): a blocked read returns.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


def redacted(url: str) -> str:
    """The URL for logs: its path and query are often the secret (Slack, ntfy topics)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}/…"


def worth_retrying(status: int | None) -> bool:
    """None: no answer (a timeout or a connection error). A 4xx other than 429 is final."""
    return status is None or status == 429 or status >= 500


def post(
    url: str,
    body: dict[str, Any],
    timeout_s: float,
    retries: int,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """What happened, for the notification log: "HTTP 200 after 1 try", ..."""
    data = json.dumps(body).encode()
    outcome, delay_s = "", BACKOFF_FIRST_S
    for attempt in range(1, retries + 2):
        status, outcome = _post_once(url, data, timeout_s)
        tries = f"after {attempt} {'try' if attempt == 1 else 'tries'}"
        if status is not None and 200 <= status < 300:
            return f"HTTP {status} {tries}"
        if not worth_retrying(status) or attempt > retries:
            return f"{outcome} {tries}, given up"
        sleep(delay_s)
        delay_s = min(BACKOFF_MAX_S, delay_s * 2)
    return outcome  # not reached


def _post_once(url: str, data: bytes, timeout_s: float) -> tuple[int | None, str]:
    """One try, connect to answer, within timeout_s however slowly the server answers."""
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"gpusched/{__version__}"},
    )
    with _Cutoff(timeout_s) as cutoff:
        try:
            with cutoff.opener().open(request, timeout=timeout_s) as answer:
                answer.read(RESPONSE_KEPT_BYTES)
                status, outcome = answer.status, f"HTTP {answer.status}"
        except urllib.error.HTTPError as exc:
            status, outcome = exc.code, f"HTTP {exc.code}"
        except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError, timeouts
            status, outcome = None, f"no answer ({getattr(exc, 'reason', exc)})"
    if cutoff.fired:  # what was read by then may look whole: a shut socket reads as the end
        return None, f"no whole answer within {timeout_s:g} s (cut off)"
    return status, outcome
