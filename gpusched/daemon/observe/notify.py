"""Notifications: which `[[notify]]` entries a committed job change sets off, and their
delivery off the loop, each run logged: the site's entries by threads of their own, users'
own entries by others, taken in turn by user (daemon/observe/notifyqueue.py), so that no user's
slow hooks delay the site's or another user's.

DaemonState.remember calls job_changed once a transition is committed (the place where
/metrics counts it too); the loop calls check_pending now and then for the
pending_longer_than event. Neither waits for a hook or a webhook: they only queue.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpusched import __version__
from gpusched.core.errors import ConfigError
from gpusched.core.models import Job, JobState
from gpusched.core.notifyconf import END_EVENTS, NotifyRule
from gpusched.daemon.observe import webhook
from gpusched.daemon.observe.notifyqueue import FairQueue
from gpusched.daemon.observe.usernotify import user_rules
from gpusched.proc.hookrun import kill_session, run_hook
from gpusched.proc.privileges import open_owned

log = logging.getLogger("gpusched.daemon.observe.notify")

SITE_WORKERS = 4  # the site's hooks and webhooks at once
USER_WORKERS = 4  # users' own hooks at once, one per user
MAX_QUEUED = 256  # deliveries waiting beyond these are dropped (and logged): memory stays bounded
MAX_QUEUED_PER_USER = 32  # so that one user's fill no more than their share
SITE = "site"  # the site entries' lane; a user's is their uid
LOG_TAIL_READ_BYTES = 64 * 1024  # of the job's log, read from its end for the last lines


def events_of(before: Job | None, after: Job) -> list[str]:
    """The events a committed change is: start, or end plus its kind (fail, timeout, ...)."""
    was = before.state if before is not None else None
    if was is after.state:  # a running job that just went over its --gpu-mem
        return (
            ["gpu_mem_over"]
            if after.gpu_mem_over_by and before and not before.gpu_mem_over_by
            else []
        )
    if after.state is JobState.RUNNING:
        return ["start"]
    if not after.state.is_final:
        return []  # queued, or queued again for a retry: not an end
    return ["end", *[event for event, state in END_EVENTS.items() if state == after.state.value]]


class Notifier:
    """Decides what to send and hands it to the pool. `dispatch(rule, event)` is what
    queues one delivery; tests replace it to see the decisions."""

    def __init__(
        self,
        rules: tuple[NotifyRule, ...],
        log_path: str,
        clock: Any = time,
        site_uid: int | None = None,
        user_hooks: bool = False,
        user_timeout_s: float = 30.0,
    ):
        self.rules, self.log_path, self.clock = rules, log_path, clock
        self.site_uid = site_uid  # whom site hooks run as (a root daemon only)
        # System mode with a root daemon: each job's owner may have entries of their own
        # (daemon/observe/usernotify.py), run as the owner, each for user_timeout_s at most.
        # dispatch() gets None for those.
        self.user_hooks, self.user_timeout_s = user_hooks, user_timeout_s
        self.host = socket.gethostname()
        self._pending_rules = [r for r in rules if r.wants("pending_longer_than")]
        self._told_pending: set[tuple[int, float]] = set()  # (job id, threshold) told
        self._site = FairQueue(SITE_WORKERS, MAX_QUEUED, MAX_QUEUED)
        self._users = FairQueue(1, MAX_QUEUED, MAX_QUEUED_PER_USER)
        self._workers: list[threading.Thread] = []
        self._running_pids: set[int] = set()
        self._closed = False
        self._lock = threading.Lock()
        self.dispatch: Callable[[NotifyRule | None, dict[str, Any]], None] = self._to_pool

    def job_changed(self, before: Job | None, after: Job) -> None:
        if not self.rules and not self.user_hooks:
            return
        for event in events_of(before, after):
            body = event_body(event, after, self.clock.time(), self.host)
            for rule in self.rules:
                if rule.wants(event):
                    self.dispatch(rule, body)
            if self.user_hooks:
                self.dispatch(None, body)  # the owner's file is read off the loop

    def check_pending(
        self, pending: Callable[[], Iterable[tuple[int, Job]]], job_of: Callable[[int], Job | None]
    ) -> None:
        """Tell, once per job and threshold, of each job pending longer than a rule's
        threshold. Held jobs are left out: their wait is their owner's choice.
        pending(): (id, job or its template) pairs (DaemonState.pending_alike), read only
        when a rule wants them; job_of(id): the whole job, for the jobs told of."""
        if not self._pending_rules:
            return
        now = self.clock.time()
        told, still = self._told_pending, set()
        for rule in self._pending_rules:
            limit_s = rule.pending_longer_than_s
            if limit_s is None:  # none such: core/notifyconf.py checks that each has one
                continue
            for job_id, job in pending():
                key = (job_id, limit_s)
                if job.held or now - job.submitted_at < limit_s:
                    continue
                still.add(key)
                if key not in told and (whole := job_of(job_id)) is not None:
                    self.dispatch(rule, event_body("pending_longer_than", whole, now, self.host))
        self._told_pending = still  # forget jobs that started or went: bounded by the queue

    def close(self) -> None:
        """Stop: hooks still running are killed (their timeout would not be kept once the
        daemon is gone); deliveries not begun are dropped."""
        self._closed = True
        with self._lock:
            running = list(self._running_pids)
        for pid in running:
            kill_session(pid)

    # -- delivery (pool threads) ----------------------------------------------------------
    def _to_pool(self, rule: NotifyRule | None, event: dict[str, Any]) -> None:
        if self._closed:
            return
        with self._lock:
            if not self._workers:
                # Daemon threads: a stopping daemon never waits for a hook (close() kills them).
                for pool, count in ((self._site, SITE_WORKERS), (self._users, USER_WORKERS)):
                    for _ in range(count):
                        worker = threading.Thread(
                            target=self._work,
                            args=(pool,),
                            daemon=True,
                            name=f"gpusched-notify-{len(self._workers)}",
                        )
                        worker.start()
                        self._workers.append(worker)
        pool, lane = (self._site, SITE) if rule else (self._users, event["job"]["uid"])
        if not pool.put(lane, (rule, event)):
            self._write_log(
                event,
                "all" if rule else f"uid {lane}'s entries",
                "dropped: too many notifications waiting",
            )

    def _work(self, pool: FairQueue) -> None:
        while not self._closed:
            lane, (rule, event) = pool.get()
            try:
                self._deliver(rule, event)
            finally:
                pool.done(lane)

    def _deliver(self, rule: NotifyRule | None, event: dict[str, Any]) -> None:
        try:
            if rule is None:
                self._deliver_owners(event)
                return
            if rule.command:
                self._run(rule, event, self.site_uid, "/", None)
            if rule.url:
                event = with_log_tail(event, rule.log_lines)
                outcome = webhook.post(
                    rule.url, {**event, "text": chat_text(event)}, rule.timeout_s, rule.retries
                )
                self._write_log(event, webhook.redacted(rule.url), outcome)
        except Exception:
            log.exception("notification for job %s failed", event["job"]["id"])

    def _deliver_owners(self, event: dict[str, Any]) -> None:
        """The job owner's own entries for this event, run as the owner from their home."""
        uid = event["job"]["uid"]
        try:
            path, rules = user_rules(uid, self.user_timeout_s)
        except ConfigError as exc:
            self._write_log(event, f"uid {uid}'s entries", exc.message)
            return
        home = os.path.dirname(os.path.dirname(os.path.dirname(path)))
        for rule in rules:
            if rule.wants(event["event"]):
                self._run(rule, event, uid, home, home)

    def _run(
        self,
        rule: NotifyRule,
        event: dict[str, Any],
        as_uid: int | None,
        cwd: str,
        home: str | None,
    ) -> None:
        event = with_log_tail(event, rule.log_lines)
        result = run_hook(
            rule.command,
            hook_env(event, home),
            json.dumps(event).encode(),
            rule.timeout_s,
            as_uid=as_uid,
            cwd=cwd,
            running=self._running,
        )
        detail = result.output.strip().splitlines()[-1:] if not result.ok else []
        self._write_log(event, rule.command[0], " ".join([result.outcome, *detail]))

    def _running(self, pid: int, started: bool) -> None:
        with self._lock:
            (self._running_pids.add if started else self._running_pids.discard)(pid)

    def _write_log(self, event: dict[str, Any], target: str, outcome: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        line = f"{stamp} job {event['job']['id']} {event['event']} -> {target}: {outcome}"
        line = line.replace("\n", " ")[:1000]  # one line per run, whatever the hook printed
        try:
            with open(self.log_path, "a", encoding="utf-8") as out:
                out.write(line + "\n")
        except OSError as exc:
            log.warning("cannot write %s: %s", self.log_path, exc)


def make_notifier(settings: Any, paths: Any, clock: Any) -> Notifier:
    """The daemon's notifier: the config's entries, and in system mode with a root daemon
    the job owners' own entries too."""
    root_system = paths.is_system and os.geteuid() == 0
    return Notifier(
        settings.notify,
        paths.notify_log,
        clock,
        site_uid(settings, paths.is_system),
        user_hooks=root_system,
        user_timeout_s=settings.user_notify_timeout_s,
    )


def site_uid(settings: Any, is_system: bool) -> int | None:
    """Whom site hooks run as: system mode's service user, when a root daemon has one."""
    if not (is_system and settings.service_user and os.geteuid() == 0):
        return None
    try:
        return pwd.getpwnam(settings.service_user).pw_uid
    except KeyError:
        return None


# -- what is sent -------------------------------------------------------------------------
def event_body(event: str, job: Job, now_s: float, host: str) -> dict[str, Any]:
    """The event as the hook's stdin and the webhook's body get it (stable field names)."""
    waited_s = (job.started_at or now_s) - job.submitted_at
    ran_s = (job.ended_at or now_s) - job.started_at if job.started_at else None
    return {
        "version": 1,
        "event": event,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_s)),
        "host": host,
        "gpusched_version": __version__,
        "job": {
            "id": job.id,
            "name": job.display_name,
            "user": job.user,
            "uid": job.uid,
            "state": job.state.value,
            "exit_code": job.exit_code,
            "signal": job.signal,
            "end_reason": job.end_reason,
            "attempt": job.attempt,
            "command": list(job.command),
            "cwd": job.cwd,
            "log": job.stdout_path,
            "err_log": job.stderr_path,
            "gpus": list(job.gpu_indices),
            "gpu_uuids": list(job.gpu_uuids),
            "submitted": job.submitted_at,
            "started": job.started_at,
            "ended": job.ended_at,
            "wait_s": max(0.0, waited_s),
            "run_s": None if ran_s is None else max(0.0, ran_s),
        },
    }


def with_log_tail(event: dict[str, Any], lines: int) -> dict[str, Any]:
    """The last lines of the job's output and, apart, of its errors (a failed job's
    traceback is on stderr); none twice when both go to one file."""
    job = event["job"]
    apart = job["err_log"] and job["err_log"] != job["log"]
    return {
        **event,
        "log_tail": log_tail(job["log"], lines, job["uid"]),
        "err_tail": log_tail(job["err_log"], lines, job["uid"]) if apart else [],
    }


def hook_env(event: dict[str, Any], home: str | None = None) -> dict[str, str]:
    """A hook's environment: a few basics and the job's facts, never its log. home: the
    user's a hook runs as (None: the daemon's)."""
    job = event["job"]

    def text(value: Any) -> str:
        return "" if value is None else str(int(value) if isinstance(value, float) else value)

    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": home or os.environ.get("HOME", "/"),
        "GPUSCHED_EVENT": event["event"],
        "GPUSCHED_HOSTNAME": event["host"],
        "GPUSCHED_VERSION": event["gpusched_version"],
        "GPUSCHED_JOB_GPUS": ",".join(map(str, job["gpus"])),
        "GPUSCHED_JOB_GPU_UUIDS": ",".join(job["gpu_uuids"]),
        "GPUSCHED_JOB_WORKDIR": job["cwd"],
        "GPUSCHED_JOB_LOG": job["log"],
        "GPUSCHED_JOB_SUBMIT_TIME": text(job["submitted"]),
        "GPUSCHED_JOB_START_TIME": text(job["started"]),
        "GPUSCHED_JOB_END_TIME": text(job["ended"]),
        "GPUSCHED_JOB_WAIT_SECONDS": text(job["wait_s"]),
        "GPUSCHED_JOB_RUNTIME_SECONDS": text(job["run_s"]),
    }
    for key in ("id", "name", "user", "state", "exit_code", "signal", "attempt"):
        env[f"GPUSCHED_JOB_{key.upper()}"] = text(job[key])
    return env


def chat_text(event: dict[str, Any]) -> str:
    """One line for a chat, with & < > escaped: a job named <!channel> pings nobody."""
    job = event["job"]
    name = f" ({job['name']})" if job["name"] else ""
    what = {
        "start": "started",
        "pending_longer_than": "still pending",
        "gpu_mem_over": "over its --gpu-mem",
    }.get(event["event"], job["state"])
    if job["exit_code"] not in (None, 0):
        what += f" (exit {job['exit_code']})"
    gpus = f" on GPUs {','.join(map(str, job['gpus']))}" if job["gpus"] else ""
    text = f"gpusched job {job['id']}{name} by {job['user']}: {what}{gpus} on {event['host']}"
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def log_tail(path: str, lines: int, owner_uid: int) -> list[str]:
    """The last lines of the job's log: a regular file of the job's owner, opened as the
    owner (privileges.open_owned): the path is the user's choice, in their directories."""
    if not path or lines <= 0:
        return []
    fd = open_owned(path, os.O_RDONLY, owner_uid)
    if fd is None:
        return []
    with os.fdopen(fd, "rb") as f:
        f.seek(max(0, os.fstat(fd).st_size - LOG_TAIL_READ_BYTES))
        text = f.read(LOG_TAIL_READ_BYTES).decode("utf-8", "replace")
    return text.splitlines()[-lines:]
