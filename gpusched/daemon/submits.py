"""The requests that queue jobs: submit and resubmit, all or nothing."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Iterator

from gpusched.core import (jobspec, limits, memestimate, outpattern, placement, preemption,
                           scheduling, slurmspec, syntax)
from gpusched.core.errors import NotFound, UsageError
from gpusched.core.models import Job
from gpusched.core.values import shown
from gpusched.daemon import batches, gpumemory
from gpusched.daemon.authz import user_name
from gpusched.daemon.request import Request, named, targets
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc import runfile


class Submits:
    def __init__(self, state: DaemonState, setup: Setup):
        self.state, self.setup = state, setup

    def submit(self, req: Request) -> dict:
        limits.check_submit(req.args, limits.from_settings(self.setup.settings))
        # The kinds of values were checked with the request (protocol.ARGUMENTS).
        env, cwd, specs = req.args.get("env") or {}, req.args.get("cwd") or "", req.args["jobs"]
        if not os.path.isabs(cwd):
            raise UsageError(f"the working directory must be an absolute path, not {shown(cwd)}")
        pid, uid, _ = req.creds
        owner = Job(id=0, command=(), cwd=cwd, uid=uid, user=user_name(uid), env=env,
                    submitted_at=self.setup.clock.time(), submit_pid=pid)
        cluster = self._cluster(req.args.get("cluster"))
        # Check every job before queueing any: all or nothing.
        groups = [(self._template(spec, owner, cluster), *jobspec.check_array(spec))
                  for spec in specs]
        count = sum(len(indices) for _, indices, _ in groups)
        if count > batches.BIG_JOBS and cluster is None:  # stored a batch per turn
            return batches.BatchedSubmit(self.state, count, lambda ids: self._jobs_of(groups, ids),
                                         lambda ids: self._result(groups, ids))
        with self.state.write(undone="nothing was queued"):
            ids = [i for template, indices, throttle in groups
                   for i in self._insert(template, indices, throttle, cluster)]
        return self._result(groups, ids)

    @staticmethod
    def _result(groups: list, ids: list[int]) -> dict:
        """The reply to a submit: every id, and each array's (its first element's)."""
        array_ids, at = [], 0
        for _, indices, _ in groups:
            if indices != (None,):
                array_ids.append(ids[at])
            at += len(indices)
        return {"ids": ids, "array_ids": array_ids}

    def _jobs_of(self, groups: list, ids: list[int]) -> Iterator[Job]:
        """The jobs of a submit's groups (a job, or an array), given all their ids in order."""
        at = 0
        for template, indices, throttle in groups:
            yield from self._jobs_for(template, indices, throttle, ids[at:at + len(indices)])
            at += len(indices)

    def _with_element_ids(self, spec: Any) -> Any:
        """The spec with each dependency on ARRAY_INDEX text ('12_3') turned into one on
        that element's own job id."""
        deps = spec.get("dependencies") if isinstance(spec, dict) else None
        if not isinstance(deps, list):
            return spec  # check_job_spec says what is wrong with it
        return {**spec, "dependencies": [
            [dep[0], self._element_id(dep[1])]
            if isinstance(dep, list) and len(dep) == 2 and isinstance(dep[1], str) else dep
            for dep in deps]}

    def _element_id(self, text: str) -> int:
        base, index = syntax.parse_job_id(text)
        if index is None:
            return base
        try:
            element = named(self.state, text, whole_arrays=False)[0]
        except NotFound as exc:
            raise UsageError(f"dependency on {text}: {exc.message}") from None
        # Element 0's id is the array's id, and a dependency on an array's id means the
        # whole array (JobControl._dependency_states): it cannot name element 0 alone.
        if element.id == base and len(self.state.store.array(base)) > 1:
            raise UsageError(f"dependency on {text}: the first element of array {base} has the "
                             f"array's own id, and a dependency on {base} waits for the whole "
                             "array; depend on the whole array or on other elements")
        return element.id

    def _cluster(self, name: Any) -> Any:
        """The cluster a submit goes to (core/clusterconf.py), None for this machine."""
        if name is not None and not isinstance(name, str):
            raise UsageError(f"--cluster wants a cluster's name, not {shown(name)}")
        return self.state.clusters.cluster_for(name) if self.state.clusters else None

    def _template(self, spec: Any, owner: Job, cluster: Any = None) -> Job:
        """A checked job to queue from a spec, with owner's user, cwd, environment and
        submission (time and pid); for a cluster, one that Slurm can be given."""
        spec = self._with_element_ids(spec)
        fields = jobspec.check_job_spec(spec, placement.policy_names(self.setup.rules))
        fields["job_key"] = memestimate.job_key(fields["name"], fields["command"])
        if cluster is None and jobspec.wants_gpu_mem_auto(spec):
            fields["request"], fields["gpu_mem_reason"] = gpumemory.estimate_request(
                self.state.store, self.setup.settings, owner.uid, fields["job_key"],
                fields["request"], self.state.inventory)
        impossible = None if cluster is not None else (
            placement.impossible_reason(fields["request"], self.state.inventory) or
            placement.host_impossible_reason(fields["request"], self.setup.host.cpus,
                                             self.setup.host.mem_bytes))
        if impossible:
            raise UsageError(f"job {impossible}; see `gpusched gpus`")
        self._check_dependencies(fields["dependencies"])
        settings = self.setup.settings
        fields["preemptible"], fields["preempt_grace_s"] = preemption.job_defaults(
            owner.user, fields["preemptible"], fields["preempt_grace_s"],
            settings.default_preemptible, dict(settings.preemptible_users),
            settings.preempt_grace_s)
        job = Job(id=0, cwd=owner.cwd, uid=owner.uid, user=owner.user, env=owner.env,
                  submitted_at=owner.submitted_at, submit_pid=owner.submit_pid,
                  pending_reason="waiting to be placed", **fields)
        if cluster is not None:
            slurmspec.refuse_if(job, cluster)
            self.state.clusters.check_dependencies(job.dependencies, cluster)
            job = replace(job, pending_reason=f"waiting to be handed to cluster {cluster.name}")
        return job

    def resubmit(self, req: Request) -> dict:
        """A job (an array, an element) queued again as a new one, for its owner or an
        admin; it runs as the job's user, in its directory, with its environment."""
        jobs = targets(self.state, [req.args["id"]])
        self.setup.authz.require_owner(jobs, req.creds, "resubmit it", "resubmit")
        first = jobs[0]
        spec = jobspec.changed(jobspec.job_spec(first), req.args.get("changes") or {})
        if first.array_id is not None:  # the array, or one element, as an array again
            spec["array"] = {"indices": [j.array_index for j in jobs],
                             "throttle": first.array_throttle if len(jobs) > 1 else None}
        owner = replace(first, submitted_at=self.setup.clock.time(), submit_pid=req.creds[0])
        limits.check_spec(spec, limits.from_settings(self.setup.settings))
        template = self._template(spec, owner)
        with self.state.write(undone="nothing was queued"):
            ids = self._insert(template, *jobspec.check_array(spec))
        return {"ids": ids, "array_ids": ids[:1] if spec.get("array") is not None else []}

    def _check_dependencies(self, deps: tuple[tuple[str, int], ...]) -> None:
        # A new job may only depend on jobs that exist, all older than it, so a cycle
        # cannot form: refusing unknown ids is what keeps the graph acyclic.
        missing = [i for _, i in deps if i not in self.state.jobs and self.state.store.get(i) is None]
        if missing:
            raise UsageError(f"dependency on job {missing[0]}, which does not exist (a job can "
                             "only depend on jobs already queued, so no cycle can form)")

    def _insert(self, template: Job, indices: tuple, throttle: int | None,
                cluster: Any = None) -> list[int]:
        """Queue one job, or one per array index; returns their ids."""
        ids = self.state.store.next_ids(len(indices))
        jobs = list(self._jobs_for(template, indices, throttle, ids))
        if cluster is not None:
            jobs = self.state.clusters.register(jobs, cluster)
        self.state.store.insert(jobs)
        for job in jobs:
            self.state.remember(job)
        return ids

    def _jobs_for(self, template: Job, indices: tuple, throttle: int | None,
                  ids: list[int]) -> Iterator[Job]:
        """The job, or one per array index, with these ids."""
        array_id = ids[0] if indices != (None,) else None
        for job_id, index in zip(ids, indices):
            stdout, stderr = self._log_paths(template, job_id, array_id, index)
            yield replace(template, id=job_id, array_id=array_id, array_index=index,
                          array_throttle=throttle if array_id else None,
                          stdout_path=stdout, stderr_path=stderr,
                          pending_reason=scheduling.held_reason(job_id) if template.held
                          else template.pending_reason)

    def _log_paths(self, template: Job, job_id: int, array_id: int | None,
                   array_index: int | None) -> tuple[str, str]:
        """The logs of a job of this template: gpusched's own (runfile.own_log_paths), or
        the files its --output and --error patterns name; without --error, errors go
        with the output, as in Slurm."""
        own = runfile.own_log_paths(self.setup.paths.jobs_dir, self.setup.paths.log_root,
                                    template.user, job_id)
        if not template.open_mode:
            return own
        fields = {"job_id": job_id, "name": template.display_name, "user": template.user,
                  "host": os.uname().nodename, "array_id": array_id, "array_index": array_index}
        out_pattern, err_pattern = template.output_pattern, template.error_pattern
        stdout = (outpattern.expand_path(out_pattern, template.cwd, **fields) if out_pattern
                  else own[0])
        stderr = (outpattern.expand_path(err_pattern, template.cwd, **fields) if err_pattern
                  else stdout if out_pattern else own[1])
        return stdout, stderr
