"""Replies that grow with the queue (ls, show, wait) cut into pages no frame limit can refuse.

A page holds rows up to a byte budget (at least one row, so it always moves on) and
says where the next one starts ("next": a job id for `list`, a position in the ids
named for `show` and `wait`; null on the last page). The client asks again from there.
"""

from __future__ import annotations

import bisect
import collections
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from gpusched.core.models import Job
from gpusched.core.spec import jobspec
from gpusched.core.spec.syntax import MAX_JOB_ID

# One page is about this many bytes of JSON unless the client asks for less; the most it
# may ask for keeps a page with one oversized last row (a 2 MiB command, escaped six times
# over in JSON) under the 16 MiB frame.
PAGE_BYTES = 2**20
MAX_PAGE_BYTES = 2 * 2**20
# Rows one `list` page looks at, shown or filtered out: a filter that matches few jobs
# among a million finished ones must not keep the loop busy for seconds in one request.
SCAN_ROWS = 2000
_T = TypeVar("_T")


def budget(args: dict[str, Any]) -> int:
    size = jobspec.whole_number(args, "page_bytes", PAGE_BYTES, 1024, MAX_PAGE_BYTES)
    return PAGE_BYTES if size is None else size


def start(args: dict[str, Any], high: int = MAX_JOB_ID) -> int:
    """Where the page starts: after this job id (`list`), or at this position."""
    after = jobspec.whole_number(args, "after", 0, 0, high)
    return 0 if after is None else after


def last(args: dict[str, Any]) -> int | None:
    """How many of the newest matching jobs a `list` keeps (None: all)."""
    return jobspec.whole_number(args, "last", None, 1, MAX_JOB_ID)


def fill(rows: Iterable[dict[str, Any]], budget_bytes: int) -> tuple[list[dict[str, Any]], bool]:
    """The rows that fit in the budget (at least one), and whether some were left out."""
    page: list[dict[str, Any]] = []
    used = 0
    for row in rows:
        size = len(json.dumps(row, separators=(",", ":"))) + 1
        if page and used + size > budget_bytes:
            return page, True
        page.append(row)
        used += size
    return page, False


def by_position(
    items: list[_T], args: dict[str, Any], rows_of: Callable[[list[_T]], list[dict[str, Any]]]
) -> dict[str, Any]:
    """One page of the rows for items (jobs named, in order) from position args["after"]."""
    first = start(args, high=max(len(items), 0))
    rows = lazy(items[first:], rows_of)
    page, more = fill(rows, budget(args))
    return {"jobs": page, "next": first + len(page) if more else None}


def lazy(
    items: list[_T], rows_of: Callable[[list[_T]], list[dict[str, Any]]], chunk: int = 200
) -> Iterable[dict[str, Any]]:
    """rows_of(items), made a few hundred at a time: a page stops long before 100,000 are."""
    for at in range(0, len(items), chunk):
        yield from rows_of(items[at : at + chunk])


def list_candidates(
    active: Mapping[int, Job], finished: Callable[[int, int, int], list[Job]] | None, after: int
) -> tuple[list[Job], int | None]:
    """The jobs with ids after `after`, in id order, that one `list` page looks at: up to
    SCAN_ROWS active ones and as many finished ones (finished(after, count, up_to) reads
    them from the store); and the last id looked at when more are left beyond (else None)."""
    ids = sorted(active)
    ids = ids[bisect.bisect_right(ids, after) :]
    horizon = ids[SCAN_ROWS - 1] if len(ids) > SCAN_ROWS else None
    jobs = [active[i] for i in ids[:SCAN_ROWS]]
    if finished is not None:  # none beyond the active ones' horizon: the page ends there
        done = finished(after, SCAN_ROWS, horizon or MAX_JOB_ID)
        if len(done) == SCAN_ROWS:
            horizon = min(horizon or MAX_JOB_ID, done[-1].id)
        jobs += done
    jobs.sort(key=lambda j: j.id)
    if horizon is not None:
        jobs = [j for j in jobs if j.id <= horizon]
    return jobs, horizon


def list_page(
    jobs: list[Job],
    horizon: int | None,
    rows_of: Callable[[list[Job]], list[dict[str, Any]]],
    budget_bytes: int,
) -> dict[str, Any]:
    """The page of rows (rows_of: viewed, filtered) for the candidate jobs; "next" is the
    last id this page covered when more may follow."""
    page, more = fill(lazy(jobs, rows_of), budget_bytes)
    if more:
        return {"jobs": page, "next": page[-1]["id"]}
    return {"jobs": page, "next": horizon}


def newest_first(
    active: Mapping[int, Job], finished: Callable[[int, int], list[Job]] | None, chunk: int
) -> Iterator[list[Job]]:
    """Every job (the active ones, and finished ones read from the store by
    finished(top_id, count) when given) in chunks, highest ids first: each chunk reads
    at most `chunk` rows of each kind, so a caller that stops early reads only the top."""
    ids, top = sorted(active), MAX_JOB_ID
    while True:
        at = bisect.bisect_right(ids, top)
        newer = [active[i] for i in ids[max(0, at - chunk) : at]]
        older = finished(top, chunk) if finished is not None else []
        # Where both kinds are known complete: below the higher of the two cut-offs, one
        # kind may hold more than this chunk read, so those wait for the next chunk.
        floor = max(newer[0].id if at > chunk else 0, older[-1].id if len(older) == chunk else 0)
        jobs = sorted((j for j in newer + older if j.id >= floor), key=lambda j: -j.id)
        if jobs:
            yield jobs
        if not floor:
            return
        top, chunk = floor - 1, min(chunk * 2, SCAN_ROWS)


def last_candidates(
    active: Mapping[int, Job],
    finished: Callable[[int, int], list[Job]] | None,
    matching: Callable[[list[Job]], list[dict[str, Any]]],
    count: int,
    after: int,
) -> tuple[list[Job], int | None]:
    """list_candidates() for a `list` with "last": the jobs from the count-th newest match
    on (or from `after`, if higher: a later page), in id order, and the horizon. The jobs
    are read newest first, once, down to there, however many older ones the store holds."""
    found = 0
    walked: collections.deque[Job] = collections.deque(maxlen=SCAN_ROWS + 1)
    for jobs in newest_first(active, finished, min(max(count, 64), SCAN_ROWS)):
        walked.extend(jobs)  # the lowest ids are the last walked: the ones this page needs
        ids = [row["id"] for row in matching(jobs)]  # still newest first
        if found + len(ids) >= count:
            after = max(after, ids[count - found - 1] - 1)
            break
        found += len(ids)
        if jobs[-1].id <= after:  # the newest `count` reach below this page's start
            break
    jobs = sorted((job for job in walked if job.id > after), key=lambda j: j.id)
    if len(jobs) > SCAN_ROWS:
        return jobs[:SCAN_ROWS], jobs[SCAN_ROWS - 1].id
    return jobs, None
