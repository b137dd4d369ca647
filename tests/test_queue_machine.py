"""The queue as a state machine (hypothesis): random submits, cancels, holds, releases, job
ends, passes of the loop and daemon crashes, on the daemon in this process (tests/inproc.py).

After every step: each acknowledged job is stored exactly once and nothing refused is
stored or run; no job is launched more often than its attempts allow; no GPU is leased
to two whole-GPU jobs; the daemon's pending and running jobs are the store's; and nothing
raised inside the daemon.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from gpusched.core.errors import GpuschedError
from inproc import Box

GPUS = 2
ACTIVE = ("pending", "running")


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # Writes failing on a full disk is news for the log, not an exception inside.
        if not record.name.startswith("gpusched.daemon.writes"):
            self.messages.append(record.getMessage())


# A job spec as the CLI sends it; `bad` ones are refused by the daemon's checks.
SPECS = st.fixed_dictionaries(
    {
        "gpus": st.integers(0, GPUS + 1),  # one more than the box has: refused
        "hold": st.booleans(),
        "retries": st.integers(0, 1),
        "array": st.none() | st.integers(1, 3),
        "bad": st.sampled_from(
            [
                None,
                None,
                None,
                ("gpus", True),
                ("retry_on", [[1]]),
                ("array", 5),
                ("priority", 2**70),
            ]
        ),
    }
)


class QueueMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")  # ids the daemon acknowledged

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="gpusched-machine-"))
        self.errors = Errors()
        logging.getLogger("gpusched").addHandler(self.errors)
        self.box = Box(self.root / "box", gpus=f"{GPUS}x80GiB")
        self.acked: set[int] = set()
        self.attempts: dict[int, int] = {}  # job id -> launches it may have (retries + 1)

    def teardown(self) -> None:
        logging.getLogger("gpusched").removeHandler(self.errors)
        self.box.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- requests, as the socket server hands them over ----------------------------------
    def request(self, name: str, **args: Any) -> Any:
        """The request's result, or the GpuschedError it was refused with."""
        try:
            call = self.box.send(name, **args)
        except GpuschedError as exc:  # refused by the protocol table's checks
            return exc
        assert call.done.is_set(), f"{name} was not answered"
        return call.error if call.error is not None else call.result

    def stored_ids(self) -> list[int]:
        with sqlite3.connect(f"file:{self.box.paths.db}?mode=ro", uri=True) as db:
            return [row[0] for row in db.execute("SELECT id FROM jobs ORDER BY id")]

    def stored_rows(self) -> list[tuple]:
        """What a change could alter, job by job."""
        with sqlite3.connect(f"file:{self.box.paths.db}?mode=ro", uri=True) as db:
            return db.execute(
                "SELECT id, state, held, cancel_requested, priority FROM jobs ORDER BY id"
            ).fetchall()

    # -- rules ---------------------------------------------------------------------------
    @initialize(target=jobs)
    def a_first_job(self):
        return multiple(
            *self._submit(
                {"gpus": 1, "hold": False, "retries": 0, "array": None, "bad": None}, deps=[]
            )
        )

    @rule(target=jobs, spec=SPECS, deps=st.lists(jobs, max_size=2), unknown_dep=st.booleans())
    def submit(self, spec, deps, unknown_dep):
        return multiple(*self._submit(spec, deps + ([10**9] if unknown_dep else [])))

    def _submit(self, spec: dict, deps: list[int]) -> list[int]:
        job = {
            "command": ["true"],
            "gpus": spec["gpus"],
            "hold": spec["hold"],
            "retries": spec["retries"],
            "dependencies": [["afterany", d] for d in deps],
        }
        if spec["array"]:
            job["array"] = {"indices": list(range(spec["array"])), "throttle": None}
        if spec["bad"]:
            job[spec["bad"][0]] = spec["bad"][1]
        before = self.stored_ids()
        outcome = self.request("submit", jobs=[job], cwd=str(self.root))
        if isinstance(outcome, GpuschedError):
            assert self.stored_ids() == before, f"refused ({outcome.message}) but stored"
            return []
        assert spec["bad"] is None and spec["gpus"] <= GPUS, f"{job} was queued"
        ids = outcome["ids"]
        assert not set(ids) & self.acked, f"ids {ids} given out again"
        self.acked |= set(ids)
        self.attempts.update(dict.fromkeys(ids, spec["retries"] + 1))
        return ids

    @rule(job=jobs)
    def cancel(self, job):
        self._change("cancel", job)

    @rule(job=jobs)
    def hold(self, job):
        self._change("hold", job)

    @rule(job=jobs)
    def release(self, job):
        self._change("release", job)

    def _change(self, verb: str, job_id: int) -> None:
        outcome = self.request(verb, ids=[job_id])
        assert not isinstance(outcome, GpuschedError), outcome.message  # the job exists

    @rule(unknown=st.sampled_from([10**9, "1_99", 2**70, "1_"]))
    def change_a_job_that_is_not_there(self, unknown):
        before = self.stored_ids()
        assert isinstance(self.request("cancel", ids=[unknown]), GpuschedError)
        assert self.stored_ids() == before

    @precondition(lambda self: self.box.shims.alive)
    @rule(data=st.data(), code=st.sampled_from([0, 1, 2, None]))
    def a_job_ends(self, data, code):
        """A running job's shim records how it ended (None: killed by a signal)."""
        job_id = data.draw(st.sampled_from(sorted(self.box.shims.alive)))
        self.box.shims.exit(job_id, code, None if code is not None else 9)
        self.box.step()

    @rule(seconds=st.sampled_from([0.0, 1.0, 11.0, 61.0]))
    def a_pass(self, seconds):
        """One turn of the loop, later (a retry's delay may have passed)."""
        self.box.step(seconds)

    @rule()
    def crash_and_restart(self):
        self.box.restart(crash=True)

    @rule(spec=SPECS, job=jobs, verb=st.sampled_from(["cancel", "hold", "release"]))
    def disk_full_on_a_request(self, spec, job, verb):
        """A full disk refuses a submit and a change: nothing stored, nothing remembered."""
        before = self.stored_rows()
        with self.box.failing_writes():
            job_spec = {
                "command": ["true"],
                "gpus": min(spec["gpus"], GPUS),
                "hold": spec["hold"],
                "retries": spec["retries"],
            }
            outcome = self.request("submit", jobs=[job_spec], cwd=str(self.root))
            assert isinstance(outcome, GpuschedError), "a submit on a full disk was acknowledged"
            self.request(verb, ids=[job])  # refused, or nothing to write (an ended job)
        assert self.stored_rows() == before

    @precondition(lambda self: self.box.shims.alive)
    @rule(data=st.data(), code=st.sampled_from([0, 1, None]))
    def disk_full_during_a_pass(self, data, code):
        """A job ends while the disk is full: the end is stored once writes work again,
        and nothing starts or ends twice meanwhile."""
        job_id = data.draw(st.sampled_from(sorted(self.box.shims.alive)))
        with self.box.failing_writes():
            self.box.shims.exit(job_id, code, None if code is not None else 9)
            self.box.step(1.0)
            self.box.step(1.0)
        self.box.step(11.0)  # past the longest delay before the loop writes again

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def nothing_raised_inside_the_daemon(self):
        assert not self.errors.messages, self.errors.messages

    @invariant()
    def every_acked_job_is_stored_once_and_nothing_else(self):
        stored = self.stored_ids()
        assert len(stored) == len(set(stored))
        assert set(stored) == self.acked

    @invariant()
    def no_job_runs_more_often_than_it_may(self):
        launches = Counter(self.box.shims.launches)
        assert set(launches) <= self.acked, "a job that was refused ran"
        too_often = {i: n for i, n in launches.items() if n > self.attempts[i]}
        assert not too_often, f"launched more often than retries allow: {too_often}"

    @invariant()
    def no_gpu_is_leased_twice(self):
        running = self.box.daemon.state.running()
        leased = [i for job in running for i in job.gpu_indices]
        assert len(leased) == len(set(leased)), f"a GPU leased twice: {leased}"
        assert all(len(job.gpu_indices) == job.request.gpus for job in running)

    @invariant()
    def the_daemons_jobs_are_the_stores_pending_and_running_ones(self):
        with sqlite3.connect(f"file:{self.box.paths.db}?mode=ro", uri=True) as db:
            rows = dict(db.execute(f"SELECT id, state FROM jobs WHERE state IN {ACTIVE}"))
        active = self.box.daemon.state.jobs
        assert {i: job.state.value for i, job in active.items()} == rows


# Each run is a fresh daemon and up to 40 steps; a few dozen runs take seconds.
QueueMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_the_queue_machine = QueueMachine.TestCase
