"""Post one notification to a webhook: JSON with a Slack/Mattermost-style `text`, a
timeout per try, retries with backoff where another try can help, no redirects."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Callable
from urllib.parse import urlsplit

from gpusched import __version__

BACKOFF_FIRST_S = 1.0  # then doubled each retry,
BACKOFF_MAX_S = 30.0  # up to this
RESPONSE_KEPT_BYTES = 1024  # read of an answer at most: a webhook's answer is a status


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect would carry the body (and the URL's secret path) somewhere not configured.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def redacted(url: str) -> str:
    """The URL for logs: its path and query are often the secret (Slack, ntfy topics)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}/…"


def worth_retrying(status: int | None) -> bool:
    """None: no answer (a timeout or a connection error). A 4xx other than 429 is final."""
    return status is None or status == 429 or status >= 500


def post(url: str, body: dict, timeout_s: float, retries: int,
         sleep: Callable[[float], None] = time.sleep) -> str:
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
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": f"gpusched/{__version__}"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as answer:
            answer.read(RESPONSE_KEPT_BYTES)
            return answer.status, f"HTTP {answer.status}"
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections
        reason = getattr(exc, "reason", exc)
        return None, f"no answer ({reason})"
