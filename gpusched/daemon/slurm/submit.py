"""Handing cluster jobs to Slurm: one sbatch per job (or per array), the attempt and its
marker stored first; after a restart, jobs cut short are found again by their marker.
The loop's thread decides and stores; the cluster's worker thread runs sbatch."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

from gpusched.core.models import Job, JobState, transition
from gpusched.core.slurm import slurmspec
from gpusched.core.slurm.clusterconf import ClusterConfig
from gpusched.core.slurm.slurmparse import SlurmRow
from gpusched.daemon.slurm.commands import SlurmCommands, SlurmError
from gpusched.daemon.slurm.dependencies import MET, NEVER, SLURM, dependency_state
from gpusched.daemon.slurm.worker import SlurmWorker

log = logging.getLogger("gpusched.daemon.slurm.submit")


class Plan:
    """One sbatch to run: the jobs it submits (a job, or elements of one array), its
    command line, and the files to write first on the shared directory."""

    def __init__(self, group: list[Job], argv: list[str], base: str, script: str, env_file: str):
        self.group, self.argv = group, argv
        self.base, self.script, self.env_file = base, script, env_file


class HandOver:
    """The hand-over half of ClusterJobs (daemon/slurm/poll.py), which it is given."""

    def __init__(self, cluster_jobs: Any):
        self.c = cluster_jobs
        self.recovered: set[str] = set()  # clusters whose cut-short submits were settled

    # -- after a restart -----------------------------------------------------------------
    def recover(self, cluster: ClusterConfig, jobs: list[Job], worker: SlurmWorker) -> None:
        """Find by their markers the jobs handed over just before the daemon stopped,
        whose Slurm ids it never stored; until then none is submitted (again)."""
        cut_short = [j.id for j in jobs if self.c.runs[j.id]["submitting"]]
        if not cut_short:
            self.recovered.add(cluster.name)
            return
        worker.run(
            self.c.commands[cluster.name].own_jobs,
            lambda rows, error: self._recovered(cluster, cut_short, rows, error),
        )

    def _recovered(
        self,
        cluster: ClusterConfig,
        cut_short: list[int],
        rows: dict[str, SlurmRow] | None,
        error: BaseException | None,
    ) -> None:
        if error is not None:
            self.c.failed(cluster.name, error)
            return
        assert rows is not None  # given whenever error is not
        found = {
            row.comment: row
            for row in rows.values()
            if row.comment.startswith(slurmspec.MARKER_PREFIX)
        }
        with self.c.state.write():
            for job_id in cut_short:
                job = self.c.state.find(job_id)
                if job is not None:
                    self._adopt(job, found)
        self.recovered.add(cluster.name)

    def _adopt(self, job: Job, found: dict[str, SlurmRow]) -> None:
        run = self.c.runs[job.id]
        row = found.get(run.get("marker", ""))
        if row is not None:
            base = row.key.split("_")[0]
            key = f"{base}_{job.array_index}" if job.array_index is not None else base
            run["slurm"][str(job.attempt)] = key
            log.info("job %d: found Slurm job %s by its marker", job.id, key)
        run["submitting"] = 0
        self.c.save_run(job.id)

    # -- handing over --------------------------------------------------------------------
    def hand_over(
        self, cluster: ClusterConfig, jobs: list[Job], now: float, worker: SlurmWorker
    ) -> bool:
        """Give Slurm the jobs that are due, in one task of the worker; whether any were."""
        runs = self.c.runs
        due = [
            j
            for j in jobs
            if j.state is JobState.PENDING
            and not j.held
            and not runs[j.id]["submitting"]
            and str(j.attempt) not in runs[j.id]["slurm"]
            and (j.eligible_at is None or j.eligible_at <= now)
        ]
        groups: dict[tuple[int, int], list[Job]] = {}
        for job in sorted(due, key=lambda j: j.id):
            key = (job.array_id, job.attempt) if job.array_id is not None else (job.id, 0)
            groups.setdefault(key, []).append(job)
        plans = []
        for group in groups.values():
            deps = self._dependencies(group[0])
            if deps is not None:
                plans.append(self._plan(cluster, group, deps))
        if not plans:
            return False
        with self.c.state.write():  # stored before sbatch runs: see poll.py's docstring
            for plan in plans:
                for job in plan.group:
                    runs[job.id].update(submitting=job.attempt, marker=_mark(plan.argv))
                    self.c.save_run(job.id)
        commands = self.c.commands[cluster.name]
        worker.run(
            lambda: _sbatch_all(commands, plans),
            lambda results, error: self._submitted(cluster, plans, results, error),
        )
        return True

    def _dependencies(self, job: Job) -> list[tuple[str, str]] | None:
        """The job's dependencies as Slurm ids; those already decided are dropped (a
        Slurm id purged long ago would count as met). None: not yet (a parent not handed
        over), or never (the job is cancelled here)."""
        deps: list[tuple[str, str]] = []
        state = self.c.state
        for kind, dep in job.dependencies:
            elements = [state.jobs.get(j.id, j) for j in state.store.array(dep)]
            verdict, key = dependency_state(kind, state.find(dep), self.c.runs.get(dep), elements)
            if verdict == MET:
                continue
            if verdict == NEVER:
                with state.write():
                    state.save(
                        transition(
                            job,
                            JobState.CANCELLED,
                            ended_at=self.c.setup.clock.time(),
                            end_reason=f"its dependency {kind}:{dep} can never be met",
                        )
                    )
            if verdict != SLURM:
                return None
            deps.append((kind, key))
        return deps

    def _plan(self, cluster: ClusterConfig, group: list[Job], deps: list[tuple[str, str]]) -> Plan:
        first, base = group[0], self.c.base_dir(cluster)
        name = first.array_id if first.array_id is not None else first.id
        script = os.path.join(base, f"{name}.{first.attempt}.sh")
        output, error = first.stdout_path, first.stderr_path
        if first.array_id is not None:  # Slurm puts each element's index for %a
            output, error = (
                os.path.join(base, f"{first.array_id}_%a.{ext}") for ext in ("out", "err")
            )
        mark = slurmspec.marker(self.c.uuid, first.id, first.attempt)
        argv = slurmspec.sbatch_argv(group, cluster, script, output, error, mark, deps)
        return Plan(group, argv, base, script, os.path.join(base, f"{first.id}.env"))

    def _submitted(
        self,
        cluster: ClusterConfig,
        plans: list[Plan],
        results: list[tuple[str, str]] | None,
        error: BaseException | None,
    ) -> None:
        """Store each Slurm id; put back what was not submitted (and say why)."""
        results = results or [("error", f"{error}")] * len(plans)
        commands, problem = self.c.commands[cluster.name], ""
        with self.c.state.write():
            for plan, (outcome, value) in zip(plans, results):
                for job in plan.group:
                    run = self.c.runs[job.id]
                    run["submitting"] = 0
                    job = self.c.state.jobs.get(job.id, job)
                    if outcome != "ok":
                        problem = problem or value
                        self.c.save_run(job.id)
                        self.c.state.save(
                            pending_because(job, f"not handed to Slurm yet ({value}); trying again")
                        )
                        continue
                    key = f"{value}_{job.array_index}" if job.array_index is not None else value
                    run["slurm"][str(job.attempt)] = key
                    self.c.save_run(job.id)
                    self.c.state.save(
                        pending_because(job, f"Slurm job {key} on {cluster.name}: submitted")
                    )
                    if job.cancel_requested:  # cancelled while sbatch ran: see cancel()
                        self.c.worker(cluster.name).run(
                            lambda k=key: commands.scancel([k]), log_failure
                        )
        if problem:
            self.c.failed(cluster.name, SlurmError(problem))
        self.c.wake(cluster.name)


def _mark(argv: list[str]) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith("--comment="))


def _sbatch_all(commands: SlurmCommands, plans: list[Plan]) -> list[tuple[str, str]]:
    """On the worker: write each plan's files and run its sbatch; once one fails to reach
    Slurm, the rest wait for the next turn (each try would take as long)."""
    results: list[tuple[str, str]] = []
    for plan in plans:
        if results and results[-1][0] == "error":
            results.append(("error", "an earlier sbatch failed"))
            continue
        try:
            _write_files(plan)
            results.append(("ok", commands.sbatch(plan.argv)))
        except OSError as exc:
            results.append(("error", f"cannot write the job's files on {plan.base}: {exc}"))
        except SlurmError as exc:
            results.append(("error", str(exc)))
    return results


def log_failure(_result: Any, error: BaseException | None) -> None:
    if error is not None:
        log.warning("Slurm: %s", error)


def pending_because(job: Job, why: str) -> Job:
    return replace(job, pending_reason=why)


def _write_files(plan: Plan) -> None:
    os.makedirs(plan.base, mode=0o755, exist_ok=True)
    tmp = plan.env_file + ".tmp"
    with open(tmp, "wb", opener=lambda p, f: os.open(p, f, 0o600)) as fh:
        fh.write(slurmspec.env_file_bytes(plan.group[0].env))
    os.replace(tmp, plan.env_file)
    with open(plan.script, "w", encoding="utf-8") as fh:
        fh.write(slurmspec.wrapper_script(plan.group, plan.base, plan.env_file))
    os.chmod(plan.script, 0o755)
