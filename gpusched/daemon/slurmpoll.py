"""Cluster jobs: handed to Slurm by the daemon, which alone polls Slurm for them.

A cluster job is an ordinary gpusched job (same id, states, retries, `wait`) that the local
scheduler never starts: state.remote_ids names them. Its Slurm side lives in a record in
the store's meta table (`cluster.job.ID`): the cluster, the Slurm job of each attempt, and
the attempt being submitted, stored before sbatch runs, so that a daemon killed just after
sbatch finds that job again by its marker and never submits it twice.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from dataclasses import replace
from typing import Any

from gpusched.core import lifecycle, slurmspec
from gpusched.core.clusterconf import LOCAL, ClusterConfig
from gpusched.core.errors import UsageError
from gpusched.core.models import Job, JobState, transition
from gpusched.core.slurmparse import SlurmRow, final_state, parse_record, record_outcome
from gpusched.daemon.slurmcmd import SlurmCommands, SlurmError
from gpusched.daemon.slurmdeps import MET, NEVER, SLURM, dependency_state
from gpusched.daemon.state import DaemonState, Setup

log = logging.getLogger("gpusched.daemon.slurmpoll")

_KEY = "cluster.job."
# Slurm states whose outcome the wrapper's exit record decides (the others say the cause).
_DECIDED_BY_RECORD = ("COMPLETED", "FAILED")


class ClusterJobs:
    """Every cluster job of this daemon, and the one poller of each cluster."""

    def __init__(self, state: DaemonState, setup: Setup,
                 environ: dict[str, str] | None = None):
        self.state, self.setup = state, setup
        self.clusters = {c.name: c for c in setup.settings.clusters}
        self.commands = {name: SlurmCommands(c, environ) for name, c in self.clusters.items()}
        self.runs: dict[int, dict[str, Any]] = {}
        self.uuid = ""
        self.polled_at: dict[str, float] = {}  # when each cluster last answered
        self.stale: dict[str, str] = {}  # why its last poll failed, while it fails
        self._interval_s = {name: c.poll_min_s for name, c in self.clusters.items()}
        self._next_poll = {name: 0.0 for name in self.clusters}
        self._recovered: set[str] = set()
        state.remote_ids = set()
        state.clusters = self

    # -- start and submit --------------------------------------------------------------
    def load(self) -> None:
        """The records of every cluster job; before the active jobs are loaded."""
        store = self.state.store
        self.uuid = store.get_meta("cluster.uuid")
        for key, value in store.meta_starting(_KEY).items():
            self.runs[int(key[len(_KEY):])] = json.loads(value)
        self.state.remote_ids.update(self.runs)

    def cluster_for(self, asked: str | None) -> ClusterConfig | None:
        """The cluster a submit goes to (None: this machine), or UsageError naming the
        valid ones."""
        name = asked if asked else self.setup.settings.default_cluster
        if not name or name == LOCAL:
            return None
        if name not in self.clusters:
            raise UsageError(f"no cluster {name!r} in the daemon's config; valid: "
                             f"{', '.join([LOCAL, *self.clusters])}")
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
            job = replace(job, stdout_path=os.path.join(base, f"{name}.out"),
                          stderr_path=os.path.join(base, f"{name}.err"))
            self.runs[job.id] = {"cluster": cluster.name, "slurm": {}, "submitting": 0}
            self._save_run(job.id)
            out.append(job)
        self.state.remote_ids.update(j.id for j in out)
        self.wake(cluster.name)
        return out

    def check_dependencies(self, deps: tuple[tuple[str, int], ...], cluster: ClusterConfig
                           ) -> None:
        """A cluster job may wait only on cluster jobs of the same cluster."""
        for _, dep in deps:
            run = self.runs.get(dep)
            if run is None or run["cluster"] != cluster.name:
                raise UsageError(f"dependency on job {dep}: a job on cluster {cluster.name} "
                                 "may depend only on jobs gpusched handed to that cluster")

    def _save_run(self, job_id: int) -> None:
        self.state.store.set_meta(f"{_KEY}{job_id}", json.dumps(self.runs[job_id]))

    def wake(self, cluster: str) -> None:
        """Poll this cluster soon: something changed (a submit, a cancel)."""
        self._interval_s[cluster] = self.clusters[cluster].poll_min_s
        self._next_poll[cluster] = 0.0

    # -- the loop's turn ---------------------------------------------------------------
    def step(self) -> None:
        """Hand over what is due, and poll each cluster whose time has come."""
        active = self._active()
        if not active:
            return
        now, mono = self.setup.clock.time(), self.setup.clock.monotonic()
        for name, cluster in self.clusters.items():
            jobs = [j for j in active if self.runs[j.id]["cluster"] == name]
            if not jobs:
                continue
            try:
                if name not in self._recovered:
                    self._recover(cluster, jobs)
                self._hand_over(cluster, jobs, now)
                if mono >= self._next_poll[name]:
                    self._poll(cluster, now)
                    self.stale.pop(name, None)
            except SlurmError as exc:
                # The controller is down or slow: nothing changes state; try again later.
                if self.stale.get(name) != str(exc):
                    log.warning("cluster %s: %s", name, exc)
                self.stale[name] = str(exc)
                self._back_off(name, mono)

    def _active(self) -> list[Job]:
        """The cluster jobs still pending or running."""
        jobs = self.state.jobs
        return [jobs[i] for i in self.state.remote_ids if i in jobs]

    def _back_off(self, name: str, mono: float) -> None:
        cluster = self.clusters[name]
        self._next_poll[name] = mono + self._interval_s[name]
        self._interval_s[name] = min(self._interval_s[name] * 2, cluster.poll_max_s)

    def _recover(self, cluster: ClusterConfig, jobs: list[Job]) -> None:
        """After a start: find by their markers the jobs handed over just before the
        daemon stopped, whose Slurm ids it never stored."""
        cut_short = [j for j in jobs if self.runs[j.id]["submitting"]]
        if cut_short:
            found = {row.comment: row for row in self.commands[cluster.name].own_jobs().values()
                     if row.comment.startswith(slurmspec.MARKER_PREFIX)}
            with self.state.write():
                for job in cut_short:
                    self._adopt(job, found)
        self._recovered.add(cluster.name)

    def _adopt(self, job: Job, found: dict[str, SlurmRow]) -> None:
        run = self.runs[job.id]
        row = found.get(run.get("marker", ""))
        if row is not None:
            base = row.key.split("_")[0]
            key = f"{base}_{job.array_index}" if job.array_index is not None else base
            run["slurm"][str(job.attempt)] = key
            log.info("job %d: found Slurm job %s by its marker", job.id, key)
        run["submitting"] = 0
        self._save_run(job.id)

    # -- handing over --------------------------------------------------------------------
    def _hand_over(self, cluster: ClusterConfig, jobs: list[Job], now: float) -> None:
        due = [j for j in jobs if j.state is JobState.PENDING and not j.held
               and str(j.attempt) not in self.runs[j.id]["slurm"]
               and (j.eligible_at is None or j.eligible_at <= now)]
        groups: dict[tuple, list[Job]] = {}
        for job in sorted(due, key=lambda j: j.id):
            group = (job.array_id, job.attempt) if job.array_id is not None else (job.id, 0)
            groups.setdefault(group, []).append(job)
        for group in groups.values():
            deps = self._dependencies(group[0])
            if deps is not None:
                self._submit(cluster, group, deps, now)

    def _dependencies(self, job: Job) -> list[tuple[str, str]] | None:
        """The job's dependencies as Slurm ids; those already decided are dropped (a
        Slurm id purged long ago would count as met). None: not yet (a parent not handed
        over), or never (the job is cancelled here)."""
        deps: list[tuple[str, str]] = []
        for kind, dep in job.dependencies:
            parent = self.state.find(dep)
            elements = [self.state.jobs.get(j.id, j) for j in self.state.store.array(dep)]
            verdict, key = dependency_state(kind, parent, self.runs.get(dep), elements)
            if verdict == MET:
                continue
            if verdict == NEVER:
                with self.state.write():
                    self.state.save(transition(job, JobState.CANCELLED,
                                               ended_at=self.setup.clock.time(),
                                               end_reason=f"its dependency {kind}:{dep} can "
                                               "never be met"))
                return None
            if verdict != SLURM:
                return None
            deps.append((kind, key))
        return deps

    def _submit(self, cluster: ClusterConfig, group: list[Job], deps: list[tuple[str, str]],
                now: float) -> None:
        first = group[0]
        mark = slurmspec.marker(self.uuid, first.id, first.attempt)
        with self.state.write():  # stored before sbatch runs: see the module's docstring
            for job in group:
                self.runs[job.id].update(submitting=job.attempt, marker=mark)
                self._save_run(job.id)
        base = self.base_dir(cluster)
        name = first.array_id if first.array_id is not None else first.id
        script = os.path.join(base, f"{name}.{first.attempt}.sh")
        env_file = os.path.join(base, f"{first.id}.env")
        try:
            _write_files(base, script, env_file, group)
        except OSError as exc:
            self._not_submitted(group, f"cannot write the job's files on {base}: {exc}")
            return
        output = first.stdout_path if first.array_id is None else \
            os.path.join(base, f"{first.array_id}_%a.out")
        error = first.stderr_path if first.array_id is None else \
            os.path.join(base, f"{first.array_id}_%a.err")
        argv = slurmspec.sbatch_argv(group, cluster, script, output, error, mark, deps)
        try:
            slurm_id = self.commands[cluster.name].sbatch(argv)
        except SlurmError as exc:
            self._not_submitted(group, str(exc))
            raise
        with self.state.write():
            for job in group:
                run = self.runs[job.id]
                key = f"{slurm_id}_{job.array_index}" if job.array_index is not None \
                    else slurm_id
                run["slurm"][str(job.attempt)], run["submitting"] = key, 0
                self._save_run(job.id)
                job = self.state.jobs.get(job.id, job)  # cancelled meanwhile? see cancel()
                self.state.save(_pending(job, f"Slurm job {key} on {cluster.name}: submitted"))
                if job.cancel_requested:
                    self.state.after_commit(lambda k=key: _scancel(self.commands[cluster.name], k))
        self.wake(cluster.name)

    def _not_submitted(self, group: list[Job], why: str) -> None:
        with self.state.write():
            for job in group:
                self.runs[job.id]["submitting"] = 0
                self._save_run(job.id)
                self.state.save(_pending(job, f"not handed to Slurm yet ({why}); trying again"))

    # -- polling -------------------------------------------------------------------------
    def _poll(self, cluster: ClusterConfig, now: float) -> None:
        commands = self.commands[cluster.name]
        handed = {self.runs[j.id]["slurm"][str(j.attempt)]: j for j in self._active()
                  if self.runs[j.id]["cluster"] == cluster.name
                  and str(j.attempt) in self.runs[j.id]["slurm"]}
        if not handed:
            return
        rows = commands.squeue(sorted(handed))
        gone = [key for key in handed if key not in rows or rows[key].is_final]
        records = {key: self._exit_record(cluster, handed[key]) for key in gone}
        missing = [k for k in gone if k not in rows and records[k] is None]
        rows.update({k: r for k, r in commands.sacct(missing).items() if r.is_final})
        self.polled_at[cluster.name] = now
        changed = False
        with self.state.write():
            for key, job in handed.items():
                changed |= self._apply(job, key, rows.get(key), records.get(key), cluster, now)
        if changed:
            self._interval_s[cluster.name] = cluster.poll_min_s
        self._back_off(cluster.name, self.setup.clock.monotonic())

    def _exit_record(self, cluster: ClusterConfig, job: Job) -> dict[str, str] | None:
        path = os.path.join(self.base_dir(cluster), f"{job.id}.{job.attempt}.exit")
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return parse_record(fh.read())
        except OSError:
            return None

    def _apply(self, job: Job, key: str, row: SlurmRow | None, record: dict | None,
               cluster: ClusterConfig, now: float) -> bool:
        """One job after a poll; whether it changed."""
        run = self.runs[job.id]
        if row is not None and not row.is_final:
            run.pop("missing_since", None)
            seen = (row.state, row.reason, row.node)
            if tuple(run.get("seen", ())) == seen:
                return False
            run["seen"] = list(seen)
            self._save_run(job.id)
            if row.is_running and job.state is JobState.PENDING:
                self.state.save(transition(job, JobState.RUNNING, started_at=row.started_at or now,
                                           pending_reason=""))
            elif job.state is JobState.PENDING:
                why = f"Slurm job {key} on {cluster.name}: {row.state.lower()}"
                self.state.save(_pending(job, why + (f" ({row.reason})" if row.reason else "")))
            return True
        if record is None and (row is None or row.state in _DECIDED_BY_RECORD):
            # Gone, or ended without the wrapper's record: the shared filesystem may show
            # it late (NFS caches attributes), so wait for it up to the grace period.
            since = run.setdefault("missing_since", now)
            if now - since < cluster.lost_grace_s:
                return False
        if row is None and record is None:
            self._end(job, JobState.LOST, now, None, None,
                      f"Slurm job {key} vanished with no exit record for "
                      f"{cluster.lost_grace_s:g} s")
            return True
        state, why = final_state(row, record)
        code, sig, _ = record_outcome(record) if record else \
            ((row.exit_code, row.signal, "") if row else (None, None, ""))
        if row is not None:
            run["seen"] = [row.state, row.reason, row.node]
            self._save_run(job.id)
        if state is JobState.CANCELLED and job.cancel_requested:
            why = job.end_reason
        self._end(job, state, now, code, sig, why, row)
        return True

    def _end(self, job: Job, state: JobState, now: float, code: int | None, sig: int | None,
             why: str, row: SlurmRow | None = None) -> None:
        if job.state is JobState.PENDING:
            if state is JobState.CANCELLED:
                self.state.save(transition(job, state, ended_at=now, end_reason=why))
                return
            job = transition(job, JobState.RUNNING,
                             started_at=(row.started_at if row else None) or now)
        ended = lifecycle.finish(job, state, (row.ended_at if row else None) or now,
                                 exit_code=code, signal=sig, end_reason=why)
        self.state.save(ended)

    # -- requests ------------------------------------------------------------------------
    def cancel(self, job: Job, who: str) -> str:
        """Cancel a cluster job: at once if Slurm never got it, else by scancel, confirmed
        by a later poll (scancel says nothing of whether a job was cancelled)."""
        run = self.runs[job.id]
        key = run["slurm"].get(str(job.attempt))
        if key is None and not run["submitting"]:
            self.state.save(transition(job, JobState.CANCELLED, ended_at=self.setup.clock.time(),
                                       end_reason=f"cancelled by {who} before it started"))
            return "cancelled"
        if not job.cancel_requested:
            self.state.save(replace(job, cancel_requested=True, end_reason=f"cancelled by {who}"))
        commands = self.commands[run["cluster"]]
        if key is not None:
            self.state.after_commit(lambda: _scancel(commands, key))
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
        return {"name": run["cluster"], "slurm_job_id": run["slurm"].get(attempt, ""),
                "slurm_job_ids": [run["slurm"][a] for a in sorted(run["slurm"], key=int)],
                "slurm_state": seen[0], "slurm_reason": seen[1], "node": seen[2],
                "as_of": self.polled_at.get(run["cluster"]),
                "stale": self.stale.get(run["cluster"], "")}


def _scancel(commands: SlurmCommands, key: str) -> None:
    try:
        commands.scancel([key])
    except SlurmError as exc:
        log.warning("cancelling Slurm job %s: %s", key, exc)


def _pending(job: Job, why: str) -> Job:
    return replace(job, pending_reason=why)


def _write_files(base: str, script: str, env_file: str, group: list[Job]) -> None:
    os.makedirs(base, mode=0o755, exist_ok=True)
    with open(env_file + ".tmp", "wb", opener=lambda p, f: os.open(p, f, 0o600)) as fh:
        fh.write(slurmspec.env_file_bytes(group[0].env))
    os.replace(env_file + ".tmp", env_file)
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(slurmspec.wrapper_script(group, base, env_file))
    os.chmod(script, 0o755)
