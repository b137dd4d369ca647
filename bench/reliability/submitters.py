"""Concurrent submitters: every acknowledged id is stored, once, as the job it was given to."""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

from reliability.harness import Figures, Home


def _submit_many(home: Home, worker: int, count: int) -> list[tuple[str, int | None]]:
    """(name, id acknowledged or None) for each submit of one submitter, in turn."""
    out = []
    for n in range(count):
        name = f"w{worker}-{n}"
        # Held: the figure is about the queue, not about running thousands of `true`.
        proc = home.cli("submit", "--hold", "--name", name, "--", "true")
        text = proc.stdout.strip()
        out.append((name, int(text) if proc.returncode == 0 and text.isdigit() else None))
    return out


def measure(submitters: int, per_submitter: int) -> Figures:
    fig = Figures(f"concurrent submitters ({submitters} x {per_submitter})")
    home = Home("submit")
    try:
        home.start()
        with ThreadPoolExecutor(submitters) as pool:
            results = [
                r
                for rs in pool.map(
                    lambda w: _submit_many(home, w, per_submitter), range(submitters)
                )
                for r in rs
            ]
        stored = home.jobs() or []
        acked = {name: job_id for name, job_id in results if job_id is not None}
        by_id = {job["id"]: job for job in stored}
        names = collections.Counter(job["name"] for job in stored)
        ids_acked = collections.Counter(acked.values())
        fig.info.update(
            submits=len(results),
            acked=len(acked),
            stored=len(stored),
            refused=len(results) - len(acked),
        )
        for name, job_id in acked.items():
            job = by_id.get(job_id)
            if job is None or job["name"] != name:
                fig.fail(
                    "acked_not_stored", f"{name} acked as {job_id}, stored as {job and job['name']}"
                )
        fig.fail(
            "duplicates",
            by=sum(n - 1 for n in names.values() if n > 1)
            + sum(n - 1 for n in ids_acked.values() if n > 1),
        )
        fig.counts.setdefault("acked_not_stored", 0)
        fig.fail("stored_not_acked", by=sum(1 for job in stored if job["name"] not in acked))
        fig.fail("refused", by=len(results) - len(acked))  # a healthy daemon takes them all
    finally:
        home.close()
    return fig
