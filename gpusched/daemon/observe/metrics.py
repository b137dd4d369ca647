"""`[metrics] listen`: serve /metrics over HTTP with prometheus_client, in its own thread.

Off by default. prometheus_client is imported only when it is on, so a daemon without
metrics starts no faster or slower than before. A port that cannot be had does not stop
the daemon (the jobs matter more than their figures): `gpusched daemon status` says why
nothing is served, and the log does too. The server is daemon/observe/metricserver.py's: its
threads are bounded.
"""

from __future__ import annotations

import logging
from typing import Any

from gpusched.core.configkeys import parse_listen
from gpusched.daemon.state import DaemonState, Setup

log = logging.getLogger("gpusched.daemon.observe.metrics")


class MetricsEndpoint:
    """The HTTP server, or nothing; `status` is what `gpusched daemon status` shows."""

    def __init__(self, status: str = "off", server: Any = None, thread: Any = None):
        self.status, self._server, self._thread = status, server, thread

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None


def make_registry(state: DaemonState, setup: Setup) -> Any:
    """gpusched's families and the process's own (process_*: memory, CPU, open files)."""
    # prometheus_client: 60 ms of a daemon's start, imported only when metrics are served.
    import prometheus_client  # noqa: PLC0415
    from prometheus_client import CollectorRegistry, ProcessCollector  # noqa: PLC0415

    from gpusched.daemon.observe.collector import GpuschedCollector  # noqa: PLC0415

    # No *_created series beside each counter (prometheus_client leaves it unannotated).
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=False)  # describe() would scrape at start
    registry.register(GpuschedCollector(state, setup))
    ProcessCollector(registry=registry)
    return registry


def serve_metrics(state: DaemonState, setup: Setup) -> MetricsEndpoint:
    """Start serving when metrics.listen is set; the endpoint (with its status) either way."""
    listen = setup.settings.metrics_listen
    if not listen:
        endpoint = MetricsEndpoint()
    else:
        host, port = parse_listen(listen)
        try:
            # as above: metricserver imports prometheus_client
            from gpusched.daemon.observe.metricserver import start_server  # noqa: PLC0415

            server, thread = start_server(host, port, make_registry(state, setup))
        except OSError as exc:
            log.error("not serving metrics on %s: %s", listen, exc)
            endpoint = MetricsEndpoint(
                f"not served: cannot listen on {listen}: {exc}. "
                "Set [metrics] listen to a free port and restart the "
                "daemon."
            )
        else:
            bound_host, bound_port = server.server_address[:2]
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            endpoint = MetricsEndpoint(f"http://{shown}:{bound_port}/metrics", server, thread)
    state.note_metrics_status(endpoint.status)
    return endpoint
