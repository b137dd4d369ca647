"""The daemon's answer to each command in the protocol table; runs on the loop thread only."""

from __future__ import annotations

import os
import pwd
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from gpusched import __version__, placement, runner
from gpusched.errors import GpuschedError, NotFound, PermissionDenied, UsageError
from gpusched.models import Job, JobState, Request, inventory_to_dict, job_to_dict, transition
from gpusched.protocol import COMMANDS
from gpusched.server import error_reply

if TYPE_CHECKING:
    from gpusched.daemon import Call, Daemon

MAX_GPUS_PER_JOB = 64
MAX_PRIORITY = 10**6
FINISHED_LISTED = 1000  # `ls --all` shows this many finished jobs unless asked for more


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _int(spec: dict, key: str, default: int | None, low: int, high: int) -> int | None:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{key.replace('_', '-')} must be a whole number from {low} to {high}, "
                         f"not {value!r}")
    return value


def parse_job_spec(spec: Any) -> tuple[tuple[str, ...], str, Request, int]:
    """(command, name, request, priority) from one submitted job, checked."""
    if not isinstance(spec, dict):
        raise UsageError("each job must be a JSON object")
    command = spec.get("command")
    if (not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command)
            or not command[0]):
        raise UsageError("the job has no command; put it after `--`, e.g. "
                         "`gpusched submit -- python train.py`")
    name = spec.get("name") or ""
    if not isinstance(name, str) or len(name) > 200:
        raise UsageError("the job name must be a string of at most 200 characters")
    gpus = _int(spec, "gpus", 0, 0, MAX_GPUS_PER_JOB)
    mem = _int(spec, "gpu_mem_bytes", None, 1, 2**50)
    if mem is not None and gpus == 0:
        raise UsageError("--gpu-mem needs at least one GPU; add --gpus 1")
    priority = _int(spec, "priority", 0, -MAX_PRIORITY, MAX_PRIORITY)
    return tuple(command), name, Request(gpus, mem), priority


class Handlers:
    def __init__(self, daemon: Daemon):
        self.d = daemon
        self._table: dict[str, Callable[[Call], dict | None]] = {
            "status": self.status, "submit": self.submit, "list": self.list,
            "show": self.show, "cancel": self.cancel, "wait": self.wait, "gpus": self.gpus,
            "stop": self.stop, "snapshot": self.snapshot, "job_exited": lambda call: {},
        }
        assert set(self._table) | {"ping"} == set(COMMANDS), "handlers and protocol disagree"

    def handle(self, call: Call) -> None:
        try:
            result = self._table[call.name](call)
        except GpuschedError as exc:
            call.answer(error_reply(exc))
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

    def jobs(self, ids: Any) -> list[Job]:
        if not isinstance(ids, list) or not ids:
            raise UsageError("give at least one job id")
        return [self.job(i) for i in ids]

    def all_final(self, ids: list[int]) -> bool:
        return not any(i in self.d.jobs for i in ids)

    # -- commands -----------------------------------------------------------------------
    def status(self, call: Call) -> dict:
        d = self.d
        return {"pid": os.getpid(), "uptime_s": time.time() - d.started_at, "version": __version__,
                "backend": d.inventory.backend, "gpu_count": len(d.inventory.gpus),
                "gpu_problem": d.inventory.problem, "state_dir": str(d.paths.state_dir),
                "socket": str(d.paths.socket), "running": len(d.running()),
                "pending": len(d.pending())}

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
        now, user = time.time(), _user_name(uid)
        jobs = []
        for spec in specs:  # check every job before queueing any: all or nothing
            command, name, request, priority = parse_job_spec(spec)
            impossible = placement.impossible_reason(request, self.d.inventory)
            if impossible:
                raise UsageError(f"job {impossible}; see `gpusched gpus`")
            jobs.append(Job(id=0, command=command, cwd=cwd, uid=uid, user=user, request=request,
                            name=name, priority=priority, env=env, submitted_at=now,
                            submit_pid=pid, pending_reason="waiting to be placed"))
        store = self.d.store
        with store.write():
            ids = store.insert(jobs)
            for job_id, job in zip(ids, jobs):
                directory = runner.job_dir(self.d.paths.jobs_dir, job_id)
                self.d.save(replace(job, id=job_id, stdout_path=str(directory / "stdout.log"),
                                    stderr_path=str(directory / "stderr.log")))
        return {"ids": ids}

    def list(self, call: Call) -> dict:
        jobs = sorted(self.d.jobs.values(), key=lambda j: j.id)
        if call.args.get("all"):
            limit = _int(call.args, "limit", FINISHED_LISTED, 1, 10**7)
            jobs = sorted(self.d.store.finished(limit) + jobs, key=lambda j: j.id)
        return {"jobs": [job_to_dict(j) for j in jobs]}

    def show(self, call: Call) -> dict:
        return {"jobs": [job_to_dict(j) for j in self.jobs(call.args["ids"])]}

    def cancel(self, call: Call) -> dict:
        _, uid, _ = call.creds
        jobs = self.jobs(call.args["ids"])
        for job in jobs:  # refuse the whole request before touching any job
            if uid not in (0, job.uid):
                raise PermissionDenied(f"job {job.id} belongs to {job.user}; only they or root "
                                       "may cancel it")
        results = {}
        with self.d.store.write():
            for job in jobs:
                results[str(job.id)] = self._cancel_one(job)
        return {"results": results}

    def _cancel_one(self, job: Job) -> str:
        if job.state.is_final:
            return f"already {job.state.value}"
        if job.state is JobState.PENDING:
            self.d.save(transition(job, JobState.CANCELLED, ended_at=time.time(),
                                   end_reason="cancelled before it started"))
            return "cancelled"
        if not job.cancel_requested:
            self.d.save(replace(job, cancel_requested=True))
        # The shim passes SIGTERM to the job's process group and sends SIGKILL after the
        # grace period; its exit record then ends the job as cancelled.
        runner.signal_job(job, signal.SIGTERM)
        return "cancelling"

    def wait(self, call: Call) -> dict | None:
        self.jobs(call.args["ids"])  # unknown ids fail now, not after the wait
        if self.all_final(call.args["ids"]):
            return self.wait_reply(call)["result"]
        self.d.add_waiter(call)
        return None

    def wait_reply(self, call: Call) -> dict:
        jobs = [self.job(i) for i in call.args["ids"]]
        return {"ok": True, "result": {"jobs": [job_to_dict(j) for j in jobs],
                                       "done": all(j.state.is_final for j in jobs)}}

    def gpus(self, call: Call) -> dict:
        d = self.d
        loads = placement.gpu_loads(d.inventory, d.running(), d.pid_jobs)
        rows = []
        for gpu in d.inventory.schedulable():
            load = loads[gpu.uuid]
            rows.append({"index": gpu.index, "label": gpu.label, "uuid": gpu.uuid,
                         "name": gpu.name, "healthy": gpu.is_healthy,
                         "health_reason": gpu.health_reason,
                         "mem_total_bytes": gpu.mem_total_bytes,
                         "mem_used_bytes": gpu.mem_used_bytes,
                         "mem_reserved_bytes": load.promised_bytes, "util_pct": gpu.util_pct,
                         "jobs": list(load.job_ids),
                         "processes": [{"pid": p.pid, "user": p.user, "command": p.command,
                                        "used_mem_bytes": p.used_mem_bytes,
                                        "job": d.pid_jobs.get(p.pid), "visible": p.is_visible}
                                       for p in gpu.processes]})
        return {"backend": d.inventory.backend, "problem": d.inventory.problem, "gpus": rows}

    def snapshot(self, call: Call) -> dict:
        d = self.d
        loads = placement.gpu_loads(d.inventory, d.running(), d.pid_jobs)
        return {"daemon": self.status(call), "inventory": inventory_to_dict(d.inventory),
                "reserved_bytes": {uuid: l.promised_bytes for uuid, l in loads.items()},
                "pid_jobs": {str(pid): job for pid, job in d.pid_jobs.items()},
                "jobs": [job_to_dict(j) for j in sorted(d.jobs.values(), key=lambda j: j.id)]}

    def stop(self, call: Call) -> dict:
        self.d.stopping = True
        return {"stopping": True, "running_jobs_left": len(self.d.running())}
