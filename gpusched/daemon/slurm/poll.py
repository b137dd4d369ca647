"""Cluster jobs: handed to Slurm by the daemon, which alone polls Slurm for them.

A cluster job is an ordinary gpusched job (same id, states, retries, `wait`) that the local
scheduler never starts: ClusterJobs.ids names them (the state builds ClusterJobs, and asks
it). Its Slurm side lives in a record in the store's meta table (`cluster.job.ID`): the
cluster, the Slurm job of each attempt, and the attempt being submitted, stored before
sbatch runs, so that a daemon killed just after sbatch finds that job again by its marker
and never submits it twice.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpusched.core import lifecycle
from gpusched.core.errors import GpuschedError, UsageError
from gpusched.core.models import Job, JobState, transition
from gpusched.core.slurm.clusterconf import LOCAL, ClusterConfig
from gpusched.core.slurm.slurmparse import SlurmRow, final_state, parse_record, record_outcome
from gpusched.core.spec.syntax import ANY_OF, SINGLETON
from gpusched.daemon.slurm.commands import SlurmCommands, SlurmError
from gpusched.daemon.slurm.submit import HandOver, log_failure, pending_because
from gpusched.daemon.slurm.worker import SlurmWorker

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpusched.daemon.state import DaemonState, Setup

    # What _fetch reads: Slurm's rows, exit records and start records, by Slurm id.
    Fetched = tuple[
        dict[str, SlurmRow], dict[str, dict[str, str] | None], dict[str, dict[str, str] | None]
    ]

log = logging.getLogger("gpusched.daemon.slurm.poll")

_KEY = "cluster.job."
# Slurm states whose outcome the wrapper's exit record decides (the others say the cause).
_DECIDED_BY_RECORD = ("COMPLETED", "FAILED")


class ClusterJobs:
    """Every cluster job of this daemon, and the one poller of each cluster: the state's
    Slurm part, which it builds (state.clusters)."""

    def __init__(self, state: DaemonState, setup: Setup, environ: dict[str, str] | None = None):
        self.state, self.setup = state, setup
        # A system daemon has none (its start refuses them: core/slurm/clusterconf.py): sbatch
        # would run as the daemon's user for every user, so it never builds a Slurm command.
        self.clusters = (
            {} if setup.paths.is_system else {c.name: c for c in setup.settings.clusters}
        )
        self.commands = {name: SlurmCommands(c, environ) for name, c in self.clusters.items()}
        self.runs: dict[int, dict[str, Any]] = {}
        self.uuid = ""
        self.polled_at: dict[str, float] = {}  # when each cluster last answered
        self.stale: dict[str, str] = {}  # why its last poll failed, while it fails
        self._interval_s = {name: c.poll_min_s for name, c in self.clusters.items()}
        self._next_poll = dict.fromkeys(self.clusters, 0.0)
        self.hand = HandOver(self)
        self._workers: dict[str, SlurmWorker] = {}
        self.wake_loop: Callable[[], None] = lambda: None  # ends the loop's wait (load)
        self.ids: set[int] = set()  # every cluster job's

    # -- start and submit --------------------------------------------------------------
    def load(self, wake_loop: Callable[[], None]) -> None:
        """The records of every cluster job; before the active jobs are loaded. wake_loop
        ends the loop's wait once a Slurm command is done."""
        self.wake_loop = wake_loop
        store = self.state.store
        self.uuid = store.get_meta("cluster.uuid")
        for key, value in store.meta_starting(_KEY).items():
            self.runs[int(key[len(_KEY) :])] = json.loads(value)
        self.ids.update(self.runs)

    def cluster_for(self, asked: str | None) -> ClusterConfig | None:
        """The cluster a submit goes to (None: this machine), or UsageError naming the
        valid ones."""
        name = asked if asked else self.setup.settings.default_cluster
        if not name or name == LOCAL:
            return None
        if self.setup.paths.is_system:
            raise GpuschedError(
                f"the system daemon hands no job to a cluster (--cluster "
                f"{name}): the hand-off would run as the daemon's user, "
                "not as you. Hand jobs to a cluster from a user daemon of "
                "your own: GPUSCHED_HOME=~/.gpusched gpusched submit --cluster "
                f"{name} ... (docs/slurm.md)"
            )
        if name not in self.clusters:
            raise UsageError(
                f"no cluster {name!r} in the daemon's config; valid: "
                f"{', '.join([LOCAL, *self.clusters])}"
            )
        return self.clusters[name]

    def base_dir(self, cluster: ClusterConfig) -> str:
        return os.path.join(cluster.shared_dir, self.uuid)

    def register(self, jobs: list[Job], cluster: ClusterConfig) -> list[Job]:
        """Jobs being queued for a cluster (inside the submit's write): their records, and
        their logs on the shared directory."""
        if not self.uuid:
            self.uuid = secrets.token_hex(6)
            self.state.store.set_meta("cluster.uuid", self.uuid)
        base, out = self.base_dir(cluster), []
        for job in jobs:
            name = f"{job.array_id}_{job.array_index}" if job.array_id else str(job.id)
            job = replace(
                job,
                stdout_path=os.path.join(base, f"{name}.out"),
                stderr_path=os.path.join(base, f"{name}.err"),
            )
            self.runs[job.id] = {"cluster": cluster.name, "slurm": {}, "submitting": 0}
            self.save_run(job.id)
            out.append(job)
        self.ids.update(j.id for j in out)
        self.wake(cluster.name)
        return out

    def check_dependencies(self, deps: tuple[tuple[str, int], ...], cluster: ClusterConfig) -> None:
        """A cluster job may wait only on cluster jobs of the same cluster, and only all of
        them, by the kinds daemon/slurm/dependencies.py decides (aftercorr, singleton and `?` are not)."""
        odd = [kind for kind, _ in deps if kind in ("aftercorr", SINGLETON, ANY_OF)]
        if odd:
            word = "'?' (any of)" if odd[0] == ANY_OF else odd[0]
            raise UsageError(
                f"--dependency {word} is not handed to a cluster (cluster "
                f"{cluster.name}); run the job here, or use afterok, afterany, "
                "afternotok or after, all of them (',')"
            )
        for _, dep in deps:
            run = self.runs.get(dep)
            if run is None or run["cluster"] != cluster.name:
                raise UsageError(
                    f"dependency on job {dep}: a job on cluster {cluster.name} "
                    "may depend only on jobs gpusched handed to that cluster"
                )

    def save_run(self, job_id: int) -> None:
        self.state.store.set_meta(f"{_KEY}{job_id}", json.dumps(self.runs[job_id]))

    def wake(self, cluster: str) -> None:
        """Poll this cluster soon: something changed (a submit, a cancel)."""
        self._interval_s[cluster] = self.clusters[cluster].poll_min_s
        self._next_poll[cluster] = 0.0

    # -- the loop's turn ---------------------------------------------------------------
    def step(self) -> None:
        """Take in what the workers did; hand over what is due and poll each cluster whose
        time has come, one task at a time per cluster (never a pile-up on a slow Slurm)."""
        for worker in self._workers.values():
            worker.drain()
        active = self._active()
        if not active:
            return
        now, mono = self.setup.clock.time(), self.setup.clock.monotonic()
        for name, cluster in self.clusters.items():
            jobs = [j for j in active if self.runs[j.id]["cluster"] == name]
            worker = self.worker(name)
            if not jobs or worker.pending or (name in self.stale and mono < self._next_poll[name]):
                continue  # nothing to do, a task under way, or backing off after a failure
            if name not in self.hand.recovered:
                self.hand.recover(cluster, jobs, worker)
            elif (
                not self.hand.hand_over(cluster, jobs, now, worker)
                and mono >= self._next_poll[name]
            ):
                self._poll(cluster, now, worker)

    def worker(self, name: str) -> SlurmWorker:
        """The cluster's worker thread, started on first use."""
        if name not in self._workers:
            self._workers[name] = SlurmWorker(name, self.wake_loop)
        return self._workers[name]

    def failed(self, name: str, error: BaseException) -> None:
        """A Slurm command failed: the controller is down or slow, or a bug. Nothing
        changes state; the cluster's jobs show as stale; try again later."""
        if not isinstance(error, SlurmError):
            log.error("cluster %s: %r", name, error, exc_info=error)
        elif self.stale.get(name) != str(error):
            log.warning("cluster %s: %s", name, error)
        self.stale[name] = str(error)
        self._back_off(name, self.setup.clock.monotonic())

    def _active(self) -> list[Job]:
        """The cluster jobs still pending or running."""
        jobs = self.state.jobs
        return [jobs[i] for i in self.ids if i in jobs]

    def _back_off(self, name: str, mono: float) -> None:
        cluster = self.clusters[name]
        self._next_poll[name] = mono + self._interval_s[name]
        self._interval_s[name] = min(self._interval_s[name] * 2, cluster.poll_max_s)

    # -- polling -------------------------------------------------------------------------
    def _poll(self, cluster: ClusterConfig, now: float, worker: SlurmWorker) -> None:
        handed = {
            self.runs[j.id]["slurm"][str(j.attempt)]: (j.id, j.attempt)
            for j in self._active()
            if self.runs[j.id]["cluster"] == cluster.name
            and str(j.attempt) in self.runs[j.id]["slurm"]
        }
        if not handed:
            self._back_off(cluster.name, self.setup.clock.monotonic())
            return
        base, commands = self.base_dir(cluster), self.commands[cluster.name]
        # The start record says where the job runs, and on which GPUs: read once per attempt.
        unplaced = {
            key
            for key, (job_id, attempt) in handed.items()
            if self.runs[job_id].get("start", [0])[0] != attempt
        }
        self._next_poll[cluster.name] = float("inf")  # until this poll is taken in
        worker.run(
            lambda: _fetch(commands, base, handed, unplaced),
            lambda found, error: self._polled(cluster, handed, found, error),
        )

    def _polled(
        self,
        cluster: ClusterConfig,
        handed: dict[str, tuple[int, int]],
        found: Fetched | None,
        error: BaseException | None,
    ) -> None:
        if error is not None:
            self.failed(cluster.name, error)
            return
        assert found is not None  # given whenever error is not
        rows, records, starts = found
        now = self.setup.clock.time()
        self.polled_at[cluster.name] = now
        self.stale.pop(cluster.name, None)
        changed = False
        with self.state.write():
            for key, (job_id, attempt) in handed.items():
                job = self.state.jobs.get(job_id)
                if job is not None and job.attempt == attempt:  # still the attempt polled
                    if start := starts.get(key):
                        self._placed(job, start)
                    changed |= self._apply(job, key, rows.get(key), records.get(key), cluster, now)
        if changed:
            self._interval_s[cluster.name] = cluster.poll_min_s
        self._back_off(cluster.name, self.setup.clock.monotonic())

    def _placed(self, job: Job, start: dict[str, str]) -> None:
        self.runs[job.id]["start"] = [job.attempt, start.get("host", ""), start.get("job_gpus", "")]
        self.save_run(job.id)

    def _apply(
        self,
        job: Job,
        key: str,
        row: SlurmRow | None,
        record: dict[str, Any] | None,
        cluster: ClusterConfig,
        now: float,
    ) -> bool:
        """One job after a poll; whether it changed."""
        run = self.runs[job.id]
        if row is not None and not row.is_final:
            run.pop("missing_since", None)
            seen = (row.state, row.reason, row.node)
            if tuple(run.get("seen", ())) == seen:
                return False
            run["seen"] = list(seen)
            self.save_run(job.id)
            if row.is_running and job.state is JobState.PENDING:
                self.state.save(
                    transition(
                        job, JobState.RUNNING, started_at=row.started_at or now, pending_reason=""
                    )
                )
            elif job.state is JobState.PENDING:
                why = f"Slurm job {key} on {cluster.name}: {row.state.lower()}"
                self.state.save(
                    pending_because(job, why + (f" ({row.reason})" if row.reason else ""))
                )
            return True
        if record is None and (row is None or row.state in _DECIDED_BY_RECORD):
            # Gone, or ended without the wrapper's record: the shared filesystem may show
            # it late (NFS caches attributes), so wait for it up to the grace period.
            since = run.setdefault("missing_since", now)
            if now - since < cluster.lost_grace_s:
                return False
        if row is None and record is None:
            self._end(
                job,
                JobState.LOST,
                now,
                None,
                None,
                f"Slurm job {key} vanished with no exit record for {cluster.lost_grace_s:g} s",
            )
            return True
        state, why = final_state(row, record)
        code, sig, _ = (
            record_outcome(record)
            if record
            else ((row.exit_code, row.signal, "") if row else (None, None, ""))
        )
        if row is not None:
            run["seen"] = [row.state, row.reason, row.node]
            self.save_run(job.id)
        if state is JobState.CANCELLED and job.cancel_requested:
            why = job.end_reason
        self._end(job, state, now, code, sig, why, row)
        return True

    def _end(
        self,
        job: Job,
        state: JobState,
        now: float,
        code: int | None,
        sig: int | None,
        why: str,
        row: SlurmRow | None = None,
    ) -> None:
        if job.state is JobState.PENDING:
            if state is JobState.CANCELLED:
                self.state.save(transition(job, state, ended_at=now, end_reason=why))
                return
            job = transition(
                job, JobState.RUNNING, started_at=(row.started_at if row else None) or now
            )
        ended = lifecycle.finish(
            job,
            state,
            (row.ended_at if row else None) or now,
            exit_code=code,
            signal=sig,
            end_reason=why,
        )
        self.state.save(ended)

    # -- requests ------------------------------------------------------------------------
    def cancel(self, job: Job, who: str) -> str:
        """Cancel a cluster job: at once if Slurm never got it, else by scancel, confirmed
        by a later poll (scancel says nothing of whether a job was cancelled)."""
        run = self.runs[job.id]
        key = run["slurm"].get(str(job.attempt))
        if key is None and not run["submitting"]:
            self.state.save(lifecycle.cancel_unstarted(job, who, self.setup.clock.time()))
            return "cancelled"
        name = run["cluster"]
        if name not in self.commands:  # its table left the config (a system daemon has none)
            self._end(
                job,
                JobState.CANCELLED,
                self.setup.clock.time(),
                None,
                None,
                f"cancelled by {who}; cluster {name} is not in the daemon's config, so "
                f"Slurm was not told: scancel {key or 'its job'} there",
            )
            return "cancelled"
        if not job.cancel_requested:
            self.state.save(replace(job, cancel_requested=True, end_reason=f"cancelled by {who}"))
        commands, worker = self.commands[run["cluster"]], self.worker(run["cluster"])
        if key is not None:
            self.state.after_commit(
                lambda: worker.run(lambda: commands.scancel([key]), log_failure)
            )
        self.wake(run["cluster"])
        return "cancelling"

    def describe(self, job_id: int) -> dict[str, Any] | None:
        """What `ls` and `show` add for a cluster job (None for a local one)."""
        run = self.runs.get(job_id)
        if run is None:
            return None
        job = self.state.find(job_id)
        attempt = str(job.attempt) if job else "1"
        seen = run.get("seen") or ["", "", ""]
        start = run.get("start") or [0, "", ""]
        gpus = start[2] if str(start[0]) == attempt else ""
        return {
            "gpu_ids": [int(g) for g in gpus.split(",") if g.isdigit()],
            "name": run["cluster"],
            "slurm_job_id": run["slurm"].get(attempt, ""),
            "slurm_job_ids": [run["slurm"][a] for a in sorted(run["slurm"], key=int)],
            "slurm_state": seen[0],
            "slurm_reason": seen[1],
            "node": seen[2],
            "as_of": self.polled_at.get(run["cluster"]),
            "stale": self.stale.get(run["cluster"], ""),
        }


def _fetch(
    commands: SlurmCommands, base: str, handed: dict[str, tuple[int, int]], unplaced: set[str]
) -> Fetched:
    """On the worker: Slurm's rows for the jobs handed over (squeue, then sacct for those
    it forgot that left no exit record), the exit records of those that ended, and the
    start records of those that started and have none read yet."""
    rows = commands.squeue(sorted(handed))
    gone = [key for key in handed if key not in rows or rows[key].is_final]
    records = {key: _record(base, *handed[key], "exit") for key in gone}
    missing = [k for k in gone if k not in rows and records[k] is None]
    rows.update({k: r for k, r in commands.sacct(missing).items() if r.is_final})
    starts = {
        key: _record(base, *handed[key], "start")
        for key in unplaced
        if key in rows and rows[key].state != "PENDING"
    }
    return rows, records, starts


def _record(base: str, job_id: int, attempt: int, kind: str) -> dict[str, str] | None:
    """The wrapper's start or exit record of an attempt; None while there is none."""
    try:
        with open(
            os.path.join(base, f"{job_id}.{attempt}.{kind}"), encoding="utf-8", errors="replace"
        ) as fh:
            return parse_record(fh.read())
    except OSError:
        return None
