"""The requests that queue jobs: submit and resubmit, all or nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpusched.core.errors import NotFound, UsageError
from gpusched.core.models import Job, job_with
from gpusched.core.sched import memestimate, placement, preemption, reservations, scheduling
from gpusched.core.slurm import slurmspec
from gpusched.core.spec import jobspec, limits, outpattern, syntax
from gpusched.core.spec.values import shown
from gpusched.core.users import user_name
from gpusched.daemon.jobs import forecasts, gpumemory
from gpusched.daemon.requests import batches, preview, quotas
from gpusched.daemon.requests.request import Request, check_priority, named, targets
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc import runfile

if TYPE_CHECKING:
    from collections.abc import Sequence

    # A submit's group of jobs: (template, array indices, throttle, commands), commands
    # (None,) for the template's own or a streamed submit's lines (Submits._groups).
    Group = tuple[Job, tuple[int | None, ...], int | None, Sequence[str | None]]


class Submits:
    def __init__(self, state: DaemonState, setup: Setup):
        self.state, self.setup = state, setup

    def submit(self, req: Request) -> dict[str, Any] | batches.BatchedSubmit:
        limits.check_submit(req.args, limits.from_settings(self.setup.settings))
        # The kinds of values were checked with the request (protocol.ARGUMENTS).
        env, cwd, specs = req.args.get("env") or {}, req.args.get("cwd") or "", req.args["jobs"]
        if not os.path.isabs(cwd):
            raise UsageError(f"the working directory must be an absolute path, not {shown(cwd)}")
        pid, uid, _ = req.creds
        owner = Job(
            id=0,
            command=(),
            cwd=cwd,
            uid=uid,
            user=user_name(uid),
            env=env,
            submitted_at=self.setup.clock.time(),
            submit_pid=pid,
        )
        cluster = self._cluster(req.args.get("cluster"))
        # Check every job before queueing any: all or nothing.
        groups = self._groups(specs, owner, cluster, streamed_lines(req.args))
        check_priority(self.setup, req.creds, max(template.priority for template, *_ in groups))
        count = sum(len(indices) * len(commands) for _, indices, _, commands in groups)
        limits.check_job_count(count, limits.from_settings(self.setup.settings))
        size = stored_bytes(groups)
        self.state.jobs.check(
            uid, owner.user, count, size, self.setup.settings, now=self.setup.clock.time()
        )
        if req.args.get("dry_run"):
            return preview.preview(self.state, self.setup, groups[0][0], count, cluster is not None)

        def make_jobs(ids: list[int]) -> Iterator[tuple[Job, Job]]:
            return self._jobs_of(groups, ids)

        if count > batches.BIG_JOBS and cluster is None:  # stored a batch per turn
            # Counted against the user's quota until its jobs are in the table.
            held = quotas.Reservation(uid, count, size)
            return batches.BatchedSubmit(
                self.state, count, make_jobs, lambda ids: self._result(groups, ids), held
            )
        with self.state.write(undone="nothing was queued"):
            ids = self.state.store.next_ids(count)
            self._store(list(make_jobs(ids)), cluster)
        return self._result(groups, ids)

    def _groups(
        self, specs: list[dict[str, Any]], owner: Job, cluster: Any, lines: list[str] | None
    ) -> list[Group]:
        """(template, array indices, throttle, commands) for each spec: commands is
        (None,) for the template's own, or a streamed submit's lines (each the last word
        of the template's command, checked as it arrived: daemon/requests/streamedrequest.py)."""
        groups: list[Group] = []
        for spec in specs:
            template = self._template(spec, owner, cluster)
            indices, throttle = jobspec.check_array(spec)
            if lines is not None and (cluster is not None or template.gpu_mem_reason):
                # Each line its own job key, whose estimate may differ; Slurm jobs too:
                # templates one by one (slow, and rare with a big sweep).
                groups += [
                    (
                        self._template(
                            {**spec, "command": [*spec["command"], line]}, owner, cluster
                        ),
                        indices,
                        throttle,
                        (None,),
                    )
                    for line in lines
                ]
            else:
                groups.append((template, indices, throttle, (None,) if lines is None else lines))
        return groups

    def _store(self, made: list[tuple[Job, Job]], cluster: Any) -> None:
        """Insert new jobs and keep them in the active set (inside a write)."""
        if cluster is not None:
            jobs = self.state.clusters.register([job for _, job in made], cluster)
            self.state.store.insert(jobs)
        else:
            jobs = batches.store_alike(self.state.store, made)
        for job in jobs:
            self.state.remember(job)

    @staticmethod
    def _result(groups: list[Group], ids: list[int]) -> dict[str, Any]:
        """The reply to a submit: every id, and each array's (its first element's). A
        group's jobs, len(indices) per command, have the next ids: no look at each of a
        sweep's 100,000 commands, on the loop's thread."""
        array_ids, at = [], 0
        for _, indices, _, commands in groups:
            span = len(indices) * len(commands)
            if indices != (None,):
                array_ids += ids[at : at + span : len(indices)]
            at += span
        return {"ids": ids, "array_ids": array_ids}

    def _jobs_of(self, groups: list[Group], ids: list[int]) -> Iterator[tuple[Job, Job]]:
        """The jobs of a submit's groups, each with its template, given all their ids in
        order: per group, per command, the job or one per array index."""
        at = 0
        for template, indices, throttle, commands in groups:
            for line in commands:
                command = template.command if line is None else (*template.command, line)
                job_key = (
                    template.job_key
                    if line is None
                    else memestimate.job_key(template.name, command)
                )
                for job in self._jobs_for(
                    template,
                    indices,
                    throttle,
                    ids[at : at + len(indices)],
                    command=command,
                    job_key=job_key,
                ):
                    yield template, job
                at += len(indices)

    def _with_element_ids(self, spec: Any) -> Any:
        """The spec with each dependency on ARRAY_INDEX text ('12_3') turned into one on
        that element's own job id."""
        deps = spec.get("dependencies") if isinstance(spec, dict) else None
        if not isinstance(deps, list):
            return spec  # check_job_spec says what is wrong with it
        return {
            **spec,
            "dependencies": [
                [dep[0], self._element_id(dep[1], whole_array=dep[0] == "aftercorr")]
                if isinstance(dep, list) and len(dep) == 2 and isinstance(dep[1], str)
                else dep
                for dep in deps
            ],
        }

    def _element_id(self, text: str, whole_array: bool = False) -> int:
        base, index = syntax.parse_job_id(text)
        if index is None or whole_array:
            # aftercorr:12_3 pairs elements with array 12's, as in Slurm.
            return base
        try:
            element = named(self.state, text, whole_arrays=False)[0]
        except NotFound as exc:
            raise UsageError(f"dependency on {text}: {exc.message}") from None
        # Element 0's id is the array's id, and a dependency on an array's id means the
        # whole array (daemon/jobs/depstates.py): it cannot name element 0 alone.
        if element.id == base and len(self.state.store.array(base)) > 1:
            raise UsageError(
                f"dependency on {text}: the first element of array {base} has the "
                f"array's own id, and a dependency on {base} waits for the whole "
                "array; depend on the whole array or on other elements"
            )
        return element.id

    def _cluster(self, name: Any) -> Any:
        """The cluster a submit goes to (core/slurm/clusterconf.py), None for this machine."""
        if name is not None and not isinstance(name, str):
            raise UsageError(f"--cluster wants a cluster's name, not {shown(name)}")
        return self.state.clusters.cluster_for(name)

    def _template(self, spec: Any, owner: Job, cluster: Any = None) -> Job:
        """A checked job to queue from a spec, with owner's user, cwd, environment and
        submission (time and pid); for a cluster, one that Slurm can be given."""
        spec = self._with_element_ids(spec)
        fields = jobspec.check_job_spec(spec, placement.policy_names(self.setup.rules))
        fields["job_key"] = memestimate.job_key(fields["name"], fields["command"])
        if cluster is None and jobspec.wants_gpu_mem_auto(spec):
            fields["request"], fields["gpu_mem_reason"] = gpumemory.estimate_request(
                self.state.store,
                self.setup.settings,
                owner.uid,
                fields["job_key"],
                fields["request"],
                self.state.inventory,
            )
        if cluster is None:  # a prediction never limits: it orders backfill, and forecasts
            fields.update(
                forecasts.predicted_fields(self.state.store, owner.uid, fields["job_key"])
            )
        impossible = (
            None
            if cluster is not None
            else (
                placement.impossible_reason(fields["request"], self.state.inventory)
                or placement.host_impossible_reason(
                    fields["request"], self.setup.host.cpus, self.setup.host.mem_bytes
                )
            )
        )
        if impossible:
            raise UsageError(f"job {impossible}; see `gpusched gpus`")
        self._check_dependencies(fields["dependencies"])
        settings = self.setup.settings
        fields["preemptible"], fields["preempt_grace_s"] = preemption.job_defaults(
            owner.user,
            fields["preemptible"],
            fields["preempt_grace_s"],
            settings.default_preemptible,
            dict(settings.preemptible_users),
            settings.preempt_grace_s,
        )
        job = Job(
            id=0,
            cwd=owner.cwd,
            uid=owner.uid,
            user=owner.user,
            env=owner.env,
            submitted_at=owner.submitted_at,
            submit_pid=owner.submit_pid,
            pending_reason="waiting to be placed",
            **fields,
        )
        if job.reservation:
            if cluster is not None:
                raise UsageError("--reservation is for this machine's GPUs, not a --cluster")
            reservations.check_job(job, self.state.reservations, self.setup.clock.time())
        if cluster is not None:
            slurmspec.refuse_if(job, cluster)
            self.state.clusters.check_dependencies(job.dependencies, cluster)
            job = replace(job, pending_reason=f"waiting to be handed to cluster {cluster.name}")
        return job

    def resubmit(self, req: Request) -> dict[str, Any]:
        """A job (an array, an element) queued again as a new one, for its owner or an
        admin; it runs as the job's user, in its directory, with its environment."""
        jobs = targets(self.state, [req.args["id"]])
        self.setup.authz.require_owner(jobs, req.creds, "resubmit it", "resubmit")
        first = jobs[0]
        spec = jobspec.changed(jobspec.job_spec(first), req.args.get("changes") or {})
        if first.array_id is not None:  # the array, or one element, as an array again
            spec["array"] = {
                "indices": [j.array_index for j in jobs],
                "throttle": first.array_throttle if len(jobs) > 1 else None,
            }
        owner = replace(first, submitted_at=self.setup.clock.time(), submit_pid=req.creds[0])
        limits.check_spec(spec, limits.from_settings(self.setup.settings))
        template = self._template(spec, owner)
        check_priority(self.setup, req.creds, template.priority)  # the caller's, not the owner's
        count = len(jobspec.check_array(spec)[0])
        self.state.jobs.check(
            template.uid,
            template.user,
            count,
            count * quotas.job_bytes(template),
            self.setup.settings,
            now=self.setup.clock.time(),
        )
        with self.state.write(undone="nothing was queued"):
            ids = self._insert(template, *jobspec.check_array(spec))
        return {"ids": ids, "array_ids": ids[:1] if spec.get("array") is not None else []}

    def check_priority(self, creds: tuple[int, int, int], priority: int) -> None:
        """request.check_priority, for a service's replicas (daemon/services/requests.py)."""
        check_priority(self.setup, creds, priority)

    def _check_dependencies(self, deps: tuple[tuple[str, int], ...]) -> None:
        # A new job may only depend on jobs that exist, all older than it, so a cycle
        # cannot form: refusing unknown ids is what keeps the graph acyclic.
        missing = [
            i
            for i in syntax.dependency_job_ids(deps)
            if i not in self.state.jobs and self.state.store.get(i) is None
        ]
        if missing:
            raise UsageError(
                f"dependency on job {missing[0]}, which does not exist (a job can "
                "only depend on jobs already queued, so no cycle can form)"
            )

    def _insert(
        self, template: Job, indices: tuple[int | None, ...], throttle: int | None
    ) -> list[int]:
        """Queue one job, or one per array index (inside a write); returns their ids."""
        ids = self.state.store.next_ids(len(indices))
        self._store(
            [(template, job) for job in self._jobs_for(template, indices, throttle, ids)], None
        )
        return ids

    def _jobs_for(
        self,
        template: Job,
        indices: tuple[int | None, ...],
        throttle: int | None,
        ids: list[int],
        **changes: Any,
    ) -> Iterator[Job]:
        """The job, or one per array index, with these ids (and these changes to the
        template: a streamed line's command)."""
        array_id = ids[0] if indices != (None,) else None
        for job_id, index in zip(ids, indices):
            stdout, stderr = self._log_paths(template, job_id, array_id, index)
            yield job_with(
                template,
                id=job_id,
                array_id=array_id,
                array_index=index,
                array_throttle=throttle if array_id else None,
                stdout_path=stdout,
                stderr_path=stderr,
                pending_reason=scheduling.held_reason(job_id)
                if template.held
                else template.pending_reason,
                **changes,
            )

    def _log_paths(
        self, template: Job, job_id: int, array_id: int | None, array_index: int | None
    ) -> tuple[str, str]:
        """The logs of a job of this template: gpusched's own (runfile.own_log_paths), or
        the files its --output and --error patterns name; without --error, errors go
        with the output, as in Slurm."""
        own = runfile.own_log_paths(
            self.setup.paths.jobs_dir, self.setup.paths.log_root, template.user, job_id
        )
        if not template.open_mode:
            return own
        fields = {
            "job_id": job_id,
            "name": template.display_name,
            "user": template.user,
            "host": os.uname().nodename,
            "array_id": array_id,
            "array_index": array_index,
        }
        out_pattern, err_pattern = template.output_pattern, template.error_pattern
        stdout = (
            outpattern.expand_path(out_pattern, template.cwd, **fields) if out_pattern else own[0]
        )
        stderr = (
            outpattern.expand_path(err_pattern, template.cwd, **fields)
            if err_pattern
            else stdout
            if out_pattern
            else own[1]
        )
        return stdout, stderr


def stored_bytes(groups: list[Group]) -> int:
    """What the jobs of a submit's groups store (quotas.job_bytes), without making them."""
    total = 0
    for template, indices, _, commands in groups:
        base = quotas.job_bytes(template)
        lines = 0 if commands == (None,) else quotas.command_bytes(commands)
        total += len(indices) * (base * len(commands) + lines)
    return total


def streamed_lines(args: dict[str, Any]) -> list[str] | None:
    """A streamed submit's lines, which the socket server puts in its args once read;
    None for a plain submit. A stream's args without them came some other way."""
    if args.get("stream") is None:
        return None
    lines = args.get("lines")
    if not isinstance(lines, list) or len(args["jobs"]) != 1:
        raise UsageError(
            "a streamed submit sends its commands after the request, on the "
            "same connection (client/streamedrequest.py), with one job spec"
        )
    return lines
