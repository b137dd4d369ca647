"""The deliveries waiting for a notification thread, by lane (the site's entries, or one
user's own): a lane runs at most `per_lane` at once and a free thread takes the next
lane in turn, so that one user's slow hooks hold one thread, never the others' turns.
Bounded, in all and per lane: what is beyond is refused, and the caller logs it."""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Hashable
from typing import Any


class FairQueue:
    def __init__(self, per_lane: int, max_queued: int, max_per_lane: int):
        self.per_lane, self.max_queued, self.max_per_lane = per_lane, max_queued, max_per_lane
        self._lanes: dict[Hashable, deque[Any]] = {}  # lanes with work waiting, in turn order
        self._running: Counter[Hashable] = Counter()
        self._queued = 0
        self._changed = threading.Condition()

    def put(self, lane: Hashable, item: Any) -> bool:
        """Queue item in its lane; False (nothing queued) when the queue or the lane is full."""
        with self._changed:
            waiting = self._lanes.get(lane)
            if self._queued >= self.max_queued or len(waiting or ()) >= self.max_per_lane:
                return False
            self._lanes.setdefault(lane, deque()).append(item)
            self._queued += 1
            self._changed.notify_all()
            return True

    def get(self) -> tuple[Hashable, Any]:
        """The next (lane, item) whose lane may run one more; blocks until there is one.
        The caller tells done(lane) when it has been delivered."""
        with self._changed:
            while True:
                lane = next(
                    (lane for lane in self._lanes if self._running[lane] < self.per_lane), None
                )
                if lane is not None:
                    break
                self._changed.wait()
            waiting = self._lanes.pop(lane)
            item = waiting.popleft()
            if waiting:
                self._lanes[lane] = waiting  # at the end: the other lanes' turn first
            self._running[lane] += 1
            self._queued -= 1
            return lane, item

    def done(self, lane: Hashable) -> None:
        with self._changed:
            self._running[lane] -= 1
            if self._running[lane] <= 0:
                del self._running[lane]
            self._changed.notify_all()
