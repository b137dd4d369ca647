"""Requests on their way from the connection threads to the loop thread: a Call for each,
and the queue the loop takes them from a turn at a time."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpusched.core.errors import GpuschedError
from gpusched.daemon.requests.batches import Batched
from gpusched.daemon.requests.request import Request, Waiter

# How often a connection thread looks for its client's cancel while the loop works.
_WATCH_S = 0.05
# Put on the queue by a wake-up (a job's end, a Slurm command done): it only ends the
# loop's wait.
_WAKE = object()


@dataclass
class Call:
    """A request from a connection thread, answered by the loop thread."""

    request: Request
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: GpuschedError | None = None
    waiter: Waiter | None = None  # a `wait` answered later
    batched: Batched | None = None  # a request done a batch per turn, answered when done
    cancelled: bool = False  # its client cancelled: a batched request is dropped, if it can be

    def answer(self, result: Any) -> None:
        self.result = result
        self.done.set()

    def fail(self, error: GpuschedError) -> None:
        self.error = error
        self.done.set()


class Calls:
    """The loop's queue of Calls, and of wake-ups."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()  # Calls, and _WAKE

    def dispatch(
        self,
        name: str,
        args: dict[str, Any],
        creds: tuple[int, int, int],
        gone: Callable[[], bool] | None = None,
    ) -> Any:
        """On a connection thread: the request's result, from the loop thread; raises its
        GpuschedError. gone(): whether the client cancelled meanwhile (a streamed request:
        the loop drops what of it has not committed)."""
        call = Call(Request(name, args, creds))
        self.queue.put(call)
        while not call.done.wait(None if gone is None else _WATCH_S):
            if gone is not None and gone():
                call.cancelled, gone = True, None
        if call.error is not None:
            raise call.error
        return call.result

    def wake(self) -> None:
        """End the loop's wait now (from any thread, not a signal handler)."""
        self.queue.put(_WAKE)

    def take(self, timeout_s: float) -> list[Call]:
        """The calls waiting, after waiting up to timeout_s for the first (or a wake-up)."""
        calls = []
        try:
            calls.append(self.queue.get(timeout=timeout_s))
            while True:
                calls.append(self.queue.get_nowait())
        except queue.Empty:
            pass
        return [call for call in calls if call is not _WAKE]

    def fail_all(self, message: str) -> None:
        """Answer every call still queued with this error (the daemon is stopping)."""
        while not self.queue.empty():
            call = self.queue.get_nowait()
            if call is not _WAKE:
                call.fail(GpuschedError(message))
