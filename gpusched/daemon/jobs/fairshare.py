"""The daemon's fair-share ledger: every GPU-second users' runs used, decayed, kept in the store."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence

from gpusched.core.models import Job
from gpusched.core.sched import queuerules
from gpusched.store.database import Store

log = logging.getLogger("gpusched.daemon.jobs.fairshare")
# Stored in the queue's meta table under this key: when a run ends, and at least this
# often while jobs run. A restart counts the running jobs again from the stored time on,
# so a crash between two saves loses nothing of theirs.
USAGE_KEY = "fairshare_usage"
SAVE_INTERVAL_S = 60.0


class UsageLedger:
    def __init__(self, half_life_s: float, now: float):
        self.half_life_s = half_life_s
        self.usage: dict[str, float] = {}  # decayed GPU-seconds per user, as of self.at
        self.at = now
        self._ended: list[tuple[str, float]] = []  # (user, GPU-s) of runs ended since self.at
        self._save_due = 0.0  # monotonic

    def load(self, store: Store) -> None:
        text = store.get_meta(USAGE_KEY)
        if not text:
            return
        try:
            data = json.loads(text)
            usage = {str(user): float(value) for user, value in data["usage"].items()}
            self.usage, self.at = usage, float(data["at"])
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("ignoring unreadable fair-share usage in the queue file: %.200s", text)

    def snapshot(self) -> tuple[dict[str, float], float, list[tuple[str, float]], float]:
        """The ledger as it is, to restore if a write that changes it fails."""
        return dict(self.usage), self.at, list(self._ended), self._save_due

    def restore(
        self, snapshot: tuple[dict[str, float], float, list[tuple[str, float]], float]
    ) -> None:
        usage, self.at, ended, self._save_due = snapshot
        self.usage, self._ended = dict(usage), list(ended)

    def run_ended(self, job: Job, when: float) -> None:
        """Count a run's last stretch, up to its end (it may have been running unseen)."""
        self._ended.append((job.user, queuerules.run_gpu_seconds(job, self.at, when)))

    def until(self, running: Sequence[Job], now: float) -> dict[str, float]:
        """Each user's usage at `now`: every run counts, whether anything was pending or not.

        Runs that ended count before the decay (they ended before now, and their share may
        take back time counted after their end); running jobs' time is added after it.
        """
        ended = queuerules.add_usage(self.usage, self._ended, 0.0, self.half_life_s)
        used = [(job.user, queuerules.run_gpu_seconds(job, self.at, now)) for job in running]
        usage = queuerules.add_usage(ended, used, max(now - self.at, 0.0), self.half_life_s)
        return {user: value for user, value in usage.items() if value > 0}

    def account(self, running: Sequence[Job], now: float, store: Store, save: bool = False) -> None:
        """Bring the usage up to `now` (inside a write transaction), and store it when a
        run ended, when asked, or when it is due while jobs run."""
        ended = bool(self._ended)
        self.usage, self.at, self._ended = self.until(running, now), now, []
        if save or ended or (running and time.monotonic() >= self._save_due):
            store.set_meta(USAGE_KEY, json.dumps({"at": now, "usage": self.usage}))
            self._save_due = time.monotonic() + SAVE_INTERVAL_S
