"""The daemon's answer to each command in the protocol table; runs on the loop thread only."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import psutil

from gpusched import __version__
from gpusched.core import jobspec, placement, syntax
from gpusched.core import jobfilter
from gpusched.proc import runfile, runner
from gpusched.daemon.authz import HIDDEN, user_name
from gpusched.core.errors import GpuschedError, NotFound, UsageError
from gpusched.job import read_progress_file
from gpusched.core.models import Job, JobState, inventory_to_dict, job_to_dict, transition
from gpusched.client.protocol import COMMANDS, LEAN_JOB_FIELDS
from gpusched.daemon.server import error_reply

log = logging.getLogger("gpusched.daemon.handlers")

if TYPE_CHECKING:
    from gpusched.daemon.loop import Call, Daemon

FINISHED_LISTED = 1000  # `ls --all` shows this many finished jobs unless asked for more


def _array(spec: dict) -> tuple[tuple[int, ...], int | None]:
    """The checked array part of a job spec: ((None,), None) for a single job."""
    array = spec.get("array")
    if array is None:
        return (None,), None
    indices, throttle = array.get("indices"), array.get("throttle")
    if (not isinstance(indices, list) or not indices or len(indices) > syntax.MAX_ARRAY_SIZE
            or not all(isinstance(i, int) and i >= 0 for i in indices)):
        raise UsageError(f"an array needs 1 to {syntax.MAX_ARRAY_SIZE} indices of 0 or more")
    if throttle is not None and (not isinstance(throttle, int) or throttle < 1):
        raise UsageError("an array's at-most-at-once count must be a positive number")
    return tuple(indices), throttle


class Refused(Exception):
    """One job of a change that cannot be made (a running job to hold): reported as
    refused while the other jobs named are still changed."""


class Handlers:
    def __init__(self, daemon: Daemon):
        self.d = daemon
        self._table: dict[str, Callable[[Call], dict | None]] = {
            "status": self.status, "submit": self.submit, "list": self.list,
            "show": self.show, "cancel": self.cancel, "wait": self.wait, "gpus": self.gpus,
            "stop": self.stop, "snapshot": self.snapshot, "hold": self.hold,
            "release": self.release, "update": self.update, "drain": self.drain,
            "resume": self.resume, "logs": self.logs, "env": self.env,
            "resubmit": self.resubmit,
        }
        assert set(self._table) | {"ping"} == set(COMMANDS), "handlers and protocol disagree"

    def handle(self, call: Call) -> None:
        try:
            result = self._table[call.name](call)
        except GpuschedError as exc:
            call.answer(error_reply(exc))
            return
        except Exception:  # noqa: BLE001 - a bug in one request must not stop the daemon
            log.exception("request %r failed", call.name)
            call.answer(error_reply(GpuschedError("the daemon failed on this request; see its log")))
            return
        if result is not None:  # None: answered later (wait)
            call.answer({"ok": True, "result": result})

    # -- lookups ------------------------------------------------------------------------
    def job(self, job_id: Any) -> Job:
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise UsageError(f"job ids are whole numbers, not {job_id!r}")
        job = self.d.jobs.get(job_id) or self.d.store.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}; `gpusched ls --all` lists the jobs")
        return job

    def named(self, item: Any, whole_arrays: bool) -> list[Job]:
        """The jobs an id names: ID, or ARRAY_INDEX (12_3) for one element of array 12.
        With whole_arrays, an array's id names every element (the commands that change
        jobs, and wait); otherwise the one job with that id (show, logs, env)."""
        base, index = syntax.parse_job_id(item)
        job = self.job(base)
        if index is None:
            if whole_arrays and job.array_id == job.id:
                return [self.d.jobs.get(j.id, j) for j in self.d.store.array(job.id)]
            return [job]
        if job.array_id != job.id:
            raise NotFound(f"job {base} is not an array, so {base}_{index} names no job")
        for element in self.d.store.array(base):
            if element.array_index == index:
                return [self.d.jobs.get(element.id, element)]
        raise NotFound(f"array {base} has no element {index}")

    def named_each(self, ids: Any, whole_arrays: bool) -> list[Job]:
        """Every job the ids name, each once, in the order named."""
        if not isinstance(ids, list) or not ids:
            raise UsageError("give at least one job id")
        out: dict[int, Job] = {}
        for item in ids:
            for job in self.named(item, whole_arrays):
                out.setdefault(job.id, job)
        return list(out.values())

    def targets(self, ids: Any) -> list[Job]:
        """Jobs named for a change: an id, an array's id (every element), or ARRAY_INDEX."""
        return sorted(self.named_each(ids, whole_arrays=True), key=lambda j: j.id)

    def change(self, call: Call, verb: str, apply: Callable[[Job], str]) -> dict:
        """Apply a change to each job named: what happened to each in "results", and
        why each job that could not be changed was not in "refused" (the client then
        exits 1)."""
        jobs = self.targets(call.args["ids"])
        self.d.authz.require_owner(jobs, call.creds, f"{verb} it", call.name)
        results, refused = {}, {}
        with self.d.store.write():
            for job in jobs:
                try:
                    results[str(job.id)] = apply(self.d.jobs.get(job.id, job))
                except Refused as exc:
                    refused[str(job.id)] = str(exc)
        return {"results": results, "refused": refused}

    # -- commands -----------------------------------------------------------------------
    def status(self, call: Call) -> dict:
        d = self.d
        return {"pid": os.getpid(), "uptime_s": time.time() - d.started_at, "version": __version__,
                "backend": d.inventory.backend, "gpu_count": len(d.inventory.gpus),
                "gpu_problem": d.inventory.problem, "state_dir": str(d.paths.state_dir),
                "socket": str(d.paths.socket), "running": len(d.running()),
                "pending": len(d.pending()), "draining": d.draining,
                "policy": d.rules.policy, "discipline": d.queue_rules().discipline,
                "host": self.host_usage(), "mem_enforcement": d.mem_enforcement(),
                "fairshare_usage": d.control.usage.until(d.running(), time.time()),
                "fairshare_half_life_s": d.settings.fairshare_half_life_s}

    def host_usage(self) -> dict:
        """Cores and memory: usable, reserved by running jobs, and used by the whole host."""
        d, running = self.d, self.d.running()
        mem = psutil.virtual_memory()
        return {"cpus": d.host.cpus, "cpus_reserved": sum(j.request.cpus for j in running),
                "mem_bytes": d.host.mem_bytes,
                "mem_reserved_bytes": sum(j.request.mem_bytes or 0 for j in running),
                "mem_used_bytes": mem.total - mem.available,
                "cpu_used_pct": psutil.cpu_percent(interval=None)}

    def submit(self, call: Call) -> dict:
        env, cwd, specs = call.args.get("env", {}), call.args.get("cwd", ""), call.args["jobs"]
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise UsageError("the job environment must map names to strings")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise UsageError(f"the working directory must be an absolute path, not {cwd!r}")
        if not isinstance(specs, list) or not specs:
            raise UsageError("nothing to submit: give a command after `--`, or lines in --from-file")
        pid, uid, _ = call.creds
        owner = Job(id=0, command=(), cwd=cwd, uid=uid, user=user_name(uid), env=env,
                    submitted_at=time.time(), submit_pid=pid)
        # Check every job before queueing any: all or nothing.
        batches = [(self._template(spec, owner), *_array(spec)) for spec in specs]
        with self.d.store.write():
            ids = [self._insert(template, indices, throttle)
                   for template, indices, throttle in batches]
        array_ids = [group[0] for (_, indices, _), group in zip(batches, ids) if indices != (None,)]
        return {"ids": [i for group in ids for i in group], "array_ids": array_ids}

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
            element = self.named(text, whole_arrays=False)[0]
        except NotFound as exc:
            raise UsageError(f"dependency on {text}: {exc.message}") from None
        # Element 0's id is the array's id, and a dependency on an array's id means the
        # whole array (JobControl._dependency_states): it cannot name element 0 alone.
        if element.id == base and len(self.d.store.array(base)) > 1:
            raise UsageError(f"dependency on {text}: the first element of array {base} has the "
                             f"array's own id, and a dependency on {base} waits for the whole "
                             "array; depend on the whole array or on other elements")
        return element.id

    def _template(self, spec: Any, owner: Job) -> Job:
        """A checked job to queue from a spec, with owner's user, cwd, environment and
        submission (time and pid)."""
        fields = jobspec.check_job_spec(self._with_element_ids(spec),
                                        placement.policy_names(self.d.rules))
        impossible = (placement.impossible_reason(fields["request"], self.d.inventory) or
                      placement.host_impossible_reason(fields["request"], self.d.host.cpus,
                                                       self.d.host.mem_bytes))
        if impossible:
            raise UsageError(f"job {impossible}; see `gpusched gpus`")
        self._check_dependencies(fields["dependencies"])
        return Job(id=0, cwd=owner.cwd, uid=owner.uid, user=owner.user, env=owner.env,
                   submitted_at=owner.submitted_at, submit_pid=owner.submit_pid,
                   pending_reason="waiting to be placed", **fields)

    def resubmit(self, call: Call) -> dict:
        """A job (an array, an element) queued again as a new one, for its owner or an
        admin; it runs as the job's user, in its directory, with its environment."""
        jobs = self.targets([call.args["id"]])
        self.d.authz.require_owner(jobs, call.creds, "resubmit it", "resubmit")
        first = jobs[0]
        spec = jobspec.changed(jobspec.job_spec(first), call.args.get("changes") or {})
        if first.array_id is not None:  # the array, or one element, as an array again
            spec["array"] = {"indices": [j.array_index for j in jobs],
                             "throttle": first.array_throttle if len(jobs) > 1 else None}
        owner = replace(first, submitted_at=time.time(), submit_pid=call.creds[0])
        template = self._template(spec, owner)
        with self.d.store.write():
            ids = self._insert(template, *_array(spec))
        return {"ids": ids, "array_ids": ids[:1] if spec.get("array") is not None else []}

    def _check_dependencies(self, deps: tuple[tuple[str, int], ...]) -> None:
        # A new job may only depend on jobs that exist, all older than it, so a cycle
        # cannot form: refusing unknown ids is what keeps the graph acyclic.
        missing = [i for _, i in deps if i not in self.d.jobs and self.d.store.get(i) is None]
        if missing:
            raise UsageError(f"dependency on job {missing[0]}, which does not exist (a job can "
                             "only depend on jobs already queued, so no cycle can form)")

    def _insert(self, template: Job, indices: tuple, throttle: int | None) -> list[int]:
        """Queue one job, or one per array index; returns their ids."""
        ids = self.d.store.next_ids(len(indices))
        array_id = ids[0] if indices != (None,) else None
        jobs = []
        for job_id, index in zip(ids, indices):
            stdout, stderr = self._log_paths(job_id, template.user)
            jobs.append(replace(template, id=job_id, array_id=array_id, array_index=index,
                                array_throttle=throttle if array_id else None,
                                stdout_path=stdout, stderr_path=stderr))
        self.d.store.insert(jobs)
        for job in jobs:
            self.d.remember(job)
        return ids

    def _log_paths(self, job_id: int, user: str) -> tuple[str, str]:
        """Beside the job's run file; in system mode in the user's own log directory, so
        that the user's client reads them directly and root never writes them."""
        log_root = self.d.paths.log_root
        return runfile.log_paths(self.d.paths.jobs_dir if log_root is None
                                 else os.path.join(log_root, user), job_id)

    def list(self, call: Call) -> dict:
        jobs = sorted(self.d.jobs.values(), key=lambda j: j.id)
        if call.args.get("all") or set(call.args.get("states") or ()) & jobfilter.FINAL:
            limit = jobspec.whole_number(call.args, "limit", FINISHED_LISTED, 1, 10**7)
            jobs = sorted(self.d.store.finished(limit) + jobs, key=lambda j: j.id)
        # Filtered as the caller sees them: a hidden name must not be found by its pattern.
        rows = jobfilter.select(self.d.authz.viewer(call.creds[1]).jobs(jobs), call.args)
        return {"jobs": self.with_progress(rows)}

    def show(self, call: Call) -> dict:
        named = self.named_each(call.args["ids"], whole_arrays=False)
        jobs = self.d.authz.viewer(call.creds[1]).jobs(named)
        return {"jobs": self.with_progress(jobs)}

    def with_progress(self, rows: list[dict]) -> list[dict]:
        """Each running job's last gpusched.job.progress() report; None for the others.

        One small file read per running job; a report from an earlier attempt is ignored,
        and so is the message when the caller may not see the job's command.
        """
        for row in rows:
            job, row["progress"] = self.d.jobs.get(row["id"]), None
            if job is None or not job.is_running or not job.stdout_path:
                continue
            report = read_progress_file(runfile.progress_path(job.stdout_path, job.id),
                                        owner_uid=job.uid)
            if report is None or report["updated_at"] < (job.started_at or 0.0):
                continue
            if row["command"] == [HIDDEN]:
                report["message"] = ""
            row["progress"] = report
        return rows

    def logs(self, call: Call) -> dict:
        """The job, for its owner or an admin, whose client then reads the log files."""
        job = self.named(call.args["id"], whole_arrays=False)[0]
        self.d.authz.require_owner([job], call.creds, "read its logs", "logs")
        return {"job": job_to_dict(job)}

    def env(self, call: Call) -> dict:
        """The environment the job was submitted with (its owner's or an admin's to see)."""
        job = self.named(call.args["id"], whole_arrays=False)[0]
        self.d.authz.require_owner([job], call.creds, "read its environment", "env")
        return {"id": job.id, "env": dict(job.env)}

    def cancel(self, call: Call) -> dict:
        who = user_name(call.creds[1])
        return self.change(call, "cancel", lambda job: self._cancel_one(job, who))

    def hold(self, call: Call) -> dict:
        return self.change(call, "hold", lambda job: self._set_held(job, True))

    def release(self, call: Call) -> dict:
        return self.change(call, "release", lambda job: self._set_held(job, False))

    def update(self, call: Call) -> dict:
        priority = jobspec.whole_number(call.args, "priority", None, -jobspec.MAX_PRIORITY,
                                jobspec.MAX_PRIORITY)
        if priority is None:
            raise UsageError("nothing to update; give --priority N")

        def apply(job: Job) -> str:
            if job.state.is_final:
                raise Refused(f"already {job.state.value}; only pending and running jobs "
                              "can be updated")
            self.d.save(replace(job, priority=priority))
            return f"priority {priority}"
        return self.change(call, "update", apply)

    def _set_held(self, job: Job, held: bool) -> str:
        if job.state is not JobState.PENDING:
            raise Refused(f"{job.state.value}; only pending jobs can be held or released")
        self.d.save(replace(job, held=held))
        return "held" if held else "released"

    def drain(self, call: Call) -> dict:
        return self._set_draining(call, True)

    def resume(self, call: Call) -> dict:
        return self._set_draining(call, False)

    def _set_draining(self, call: Call, draining: bool) -> dict:
        self.d.authz.require_admin(call.creds, call.name, "drain or resume the queue")
        with self.d.store.write():
            self.d.store.set_meta("draining", "1" if draining else "0")
        self.d.draining = draining
        return {"draining": draining, "running": len(self.d.running())}

    def _cancel_one(self, job: Job, who: str) -> str:
        if job.state.is_final:
            return f"already {job.state.value}"
        if job.state is JobState.PENDING:
            self.d.save(transition(job, JobState.CANCELLED, ended_at=time.time(),
                                   end_reason=f"cancelled by {who} before it started"))
            return "cancelled"
        if not job.cancel_requested:
            # Who asked is kept for the end: lifecycle.end_reason adds how the job went.
            self.d.save(replace(job, cancel_requested=True, end_reason=f"cancelled by {who}"))
        # The shim passes SIGTERM to the job's process group and sends SIGKILL after the
        # grace period; its exit record then ends the job as cancelled. A shim being
        # launched, its pid not known yet, gets it once it is (JobControl._found_shim).
        runner.signal_job(job, signal.SIGTERM)
        return "cancelling"

    def wait(self, call: Call) -> dict | None:
        # Ids become job ids now (an array's id all its elements, in order), so that
        # unknown ids fail now, not after the wait, and each later look is a lookup.
        call.args["ids"] = [job.id for job in self.named_each(call.args["ids"], whole_arrays=True)]
        if self.d.all_ended(call):
            return self.wait_reply(call)["result"]
        self.d.add_waiter(call)
        return None

    def wait_reply(self, call: Call) -> dict:
        ids = call.args["ids"]
        stored = self.d.store.many([i for i in ids if i not in self.d.jobs])  # one query
        jobs = [job for i in ids if (job := self.d.jobs.get(i) or stored.get(i))]
        viewed = self.with_progress(self.d.authz.viewer(call.creds[1]).jobs(jobs))
        return {"ok": True, "result": {"jobs": viewed,
                                       "done": all(j.state.is_final for j in jobs)}}

    def gpus(self, call: Call) -> dict:
        d = self.d
        loads = placement.gpu_loads(d.inventory, d.running(), d.pid_jobs, d.rules, d.idle_since,
                                    time.time())
        rows = []
        for gpu in d.inventory.schedulable():
            load = loads[gpu.uuid]
            rows.append({"index": gpu.index, "label": gpu.label, "uuid": gpu.uuid,
                         "name": gpu.name, "healthy": gpu.is_healthy,
                         "health_reason": gpu.health_reason, "bus_id": gpu.bus_id,
                         "mem_total_bytes": gpu.mem_total_bytes,
                         "mem_used_bytes": gpu.mem_used_bytes,
                         "mem_reserved_bytes": load.promised_bytes, "util_pct": gpu.util_pct,
                         "temperature_c": gpu.temperature_c, "power_w": gpu.power_w,
                         "power_limit_w": gpu.power_limit_w,
                         "compute_capability": gpu.compute_capability,
                         "jobs": list(load.job_ids),
                         "processes": [{"pid": p.pid, "user": p.user, "command": p.command,
                                        "used_mem_bytes": p.used_mem_bytes,
                                        "job": d.pid_jobs.get(p.pid), "visible": p.is_visible}
                                       for p in gpu.processes]})
        rows = self.d.authz.viewer(call.creds[1]).gpus(rows)
        return {"backend": d.inventory.backend, "problem": d.inventory.problem, "gpus": rows,
                "host": self.host_usage()}

    def snapshot(self, call: Call) -> dict:
        d = self.d
        loads = placement.gpu_loads(d.inventory, d.running(), d.pid_jobs, d.rules, d.idle_since,
                                    time.time())
        viewer = d.authz.viewer(call.creds[1])
        inventory = inventory_to_dict(d.inventory)
        inventory["gpus"] = viewer.gpus(inventory["gpus"])
        jobs = self.with_progress(viewer.jobs(sorted(d.jobs.values(), key=lambda j: j.id)))
        if call.args.get("lean"):
            jobs = [{key: row[key] for key in LEAN_JOB_FIELDS} for row in jobs]
        return {"daemon": self.status(call), "inventory": inventory,
                "reserved_bytes": {uuid: l.promised_bytes for uuid, l in loads.items()},
                "pid_jobs": {str(pid): job for pid, job in d.pid_jobs.items()}, "jobs": jobs}

    def stop(self, call: Call) -> dict:
        self.d.authz.require_admin(call.creds, "stop", "stop the daemon", root_only=True)
        self.d.stopping = True
        return {"stopping": True, "running_jobs_left": len(self.d.running())}
