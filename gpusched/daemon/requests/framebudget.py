"""How many bytes of large request frames the daemon reads at once, over all connections.

A frame may be 16 MiB; 32 connections sending one each would make the daemon hold half
a gigabyte of requests at once (and twice as much again, joined and decoded). A frame over
SMALL_BYTES takes its size from one daemon-wide budget before its body is read, and gives
it back once answered; a frame that finds the budget spent waits up to WAIT_S for others
to finish, then is refused with a reply that says to try again.
"""

from __future__ import annotations

import threading
import time

from gpusched.core.errors import ProtocolError

# Two frames of the largest size (each held about thrice over: read, joined, decoded).
BUDGET_BYTES = 32 * 2**20
SMALL_BYTES = 2**20  # every ordinary request, and a streamed sweep's parts, are smaller
WAIT_S = 10.0


class FrameBudget:
    def __init__(self, budget_bytes: int = BUDGET_BYTES, wait_s: float = WAIT_S):
        self.budget_bytes, self.wait_s = budget_bytes, wait_s
        self.used_bytes = 0
        self._freed = threading.Condition()

    def take(self, size: int) -> None:
        """Take size bytes (a large frame's), waiting for them up to wait_s."""
        deadline = time.monotonic() + self.wait_s
        with self._freed:
            while self.used_bytes and self.used_bytes + size > self.budget_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError(
                        f"the daemon is reading {self.used_bytes:,} bytes of other large "
                        f"requests, and this one of {size:,} bytes would take it over its "
                        f"{self.budget_bytes:,} at once; try again in a moment"
                    )
                self._freed.wait(left)
            self.used_bytes += size

    def give_back(self, size: int) -> None:
        if size:
            with self._freed:
                self.used_bytes -= size
                self._freed.notify_all()

    def reader(self) -> Taken:
        return Taken(self)


class Taken:
    """What the frames read on one connection hold of the budget until release():
    protocol.receive calls it with each frame's size before reading the body."""

    def __init__(self, budget: FrameBudget):
        self.budget, self.bytes = budget, 0

    def __call__(self, size: int) -> None:
        if size > SMALL_BYTES:
            self.budget.take(size)
            self.bytes += size

    def release(self) -> None:
        self.budget.give_back(self.bytes)
        self.bytes = 0
