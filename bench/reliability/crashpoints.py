"""Crash points: the daemon SIGKILLed at random moments while submits and cancels go on;
no acked job lost, none run twice, nothing refused or cancelled run."""

from __future__ import annotations

import random
import threading
import time

from reliability.harness import Figures, Home, lost_connection, poll
from reliability.jobwatch import ENDED


class Traffic:
    """Submits (each job appends its token and start time to one file) and cancels of
    earlier jobs, until stopped; what the CLI answered to each."""

    def __init__(self, home: Home, rng: random.Random):
        self.home, self.rng = home, rng
        self.runs = home.path / "runs"
        self.acked: dict[str, int] = {}  # token -> id
        self.refused: set[str] = set()  # an answer that refused the submit
        self.ambiguous: set[str] = set()  # the daemon went away mid-request
        self.cancelled: set[int] = set()  # ids whose cancel was acked
        # Of those, the ones acked as pending ("cancelled", not "cancelling"): they must
        # never run. A running job's process may still be starting when its cancel is acked
        # (its SIGTERM follows), so only the pending ones say anything about starts.
        self.cancelled_pending: set[int] = set()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._submits, daemon=True),
            threading.Thread(target=self._cancels, daemon=True),
        ]

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        for thread in self.threads:
            thread.join()

    def _submits(self) -> None:
        n = 0
        while not self._done.is_set():
            token = f"c{n}"
            n += 1
            proc = self.home.cli(
                "submit",
                "--gpus",
                "1",
                "--name",
                token,
                "--",
                "sh",
                "-c",
                f"echo {token} $(date +%s.%N) >> {self.runs}; sleep 0.3",
            )
            with self._lock:
                if proc.returncode == 0 and proc.stdout.strip().isdigit():
                    self.acked[token] = int(proc.stdout)
                elif lost_connection(proc):
                    self.ambiguous.add(token)
                else:
                    self.refused.add(token)

    def _cancels(self) -> None:
        while not self._done.is_set():
            with self._lock:
                ids = sorted(set(self.acked.values()) - set(self.cancelled))
                job_id = self.rng.choice(ids[-5:]) if ids else None
            if job_id is None:
                time.sleep(0.05)
                continue
            proc = self.home.cli("cancel", str(job_id))
            if proc.returncode == 0:
                with self._lock:
                    self.cancelled.add(job_id)
                    if proc.stdout.strip() == f"job {job_id}: cancelled":
                        self.cancelled_pending.add(job_id)

    def started(self) -> dict[str, list[float]]:
        """token -> the start time of each run of it."""
        out: dict[str, list[float]] = {}
        if self.runs.exists():
            for line in self.runs.read_text().splitlines():
                token, _, when = line.partition(" ")
                out.setdefault(token, []).append(float(when or 0))
        return out


def measure(points: int, seed: int) -> Figures:
    fig = Figures(f"crash points ({points} SIGKILLs during submits and cancels, seed {seed})")
    fig.counts.update(acked_missing=0, run_twice=0, unacked_ran=0, cancelled_ran=0)
    rng = random.Random(seed)
    home = Home("crash", simulate="1x80GiB")
    try:
        home.start()
        kills = 0
        with Traffic(home, rng) as traffic:
            for _ in range(points):
                time.sleep(rng.uniform(0.05, 0.8))
                kills += home.kill_daemon()
        home.start()
        _check(home, traffic, fig)
        fig.info.update(
            kills=kills,
            acked=len(traffic.acked),
            cancels=len(traffic.cancelled),
            cancels_of_pending=len(traffic.cancelled_pending),
            refused=len(traffic.refused),
            connection_lost=len(traffic.ambiguous),
        )
    finally:
        home.close()
    return fig


def _check(home: Home, traffic: Traffic, fig: Figures) -> None:
    acked_ids = set(traffic.acked.values())
    jobs = (
        poll(
            lambda: (
                (js := home.jobs()) is not None
                and all(j["state"] in ENDED for j in js if j["id"] in acked_ids)
                and js
            ),
            120,
        )
        or home.jobs()
        or []
    )
    by_id = {job["id"]: job for job in jobs}
    for token, job_id in traffic.acked.items():
        if by_id.get(job_id, {}).get("name") != token:
            fig.fail(
                "acked_missing",
                f"{token} acked as job {job_id}; stored: {by_id.get(job_id, {}).get('name')}",
            )
    started = traffic.started()
    for token, times in started.items():
        if len(times) > 1:
            fig.fail("run_twice", f"{token} started {len(times)} times")
        if token in traffic.refused:
            fig.fail("unacked_ran", f"{token}: submit refused, yet it ran")
        if traffic.acked.get(token) in traffic.cancelled_pending:
            fig.fail("cancelled_ran", f"{token} ran, though cancelled while pending")
    for job_id in traffic.cancelled:
        if by_id.get(job_id, {}).get("state") in ("pending", "running"):
            fig.fail("cancelled_ran", f"job {job_id} still {by_id[job_id]['state']} after cancel")
