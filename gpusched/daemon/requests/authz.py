"""Who may act on a job (its owner or an admin; deny by default), what others see, and the audit log."""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import time
from collections.abc import Iterable
from typing import Any

from gpusched.core.errors import PermissionDenied
from gpusched.core.models import Job, job_to_dict
from gpusched.core.spec.values import HIDDEN
from gpusched.core.users import user_name

log = logging.getLogger("gpusched.daemon.requests.authz")

# What another user sees of a service's replica spec: what it holds, as `ls` shows of a job.
_SERVICE_JOB_PUBLIC = ("gpus", "gpu_mem_bytes", "cpus", "mem_bytes", "priority")


class Authz:
    """Decisions for one daemon: root and the daemon's own user are always admins, and so
    are members of `system.admin_group`; everyone else acts only on their own jobs."""

    def __init__(
        self, owner_uid: int, audit_path: str, admin_group: str = "", show_commands: str = "own"
    ):
        self.owner_uid, self.audit_path = owner_uid, audit_path
        self.admin_group, self.show_commands = admin_group, show_commands

    def is_admin(self, uid: int) -> bool:
        if uid in (0, self.owner_uid):
            return True
        if not self.admin_group:
            return False
        # Asked anew each time: a user removed from the group loses the right at once.
        try:
            group_gid = grp.getgrnam(self.admin_group).gr_gid
            entry = pwd.getpwuid(uid)
        except KeyError:
            return False
        return group_gid in os.getgrouplist(entry.pw_name, entry.pw_gid)

    def require_owner(
        self, jobs: Iterable[Job], creds: tuple[int, int, int], action: str, request: str
    ) -> None:
        """Refuse the whole request, before touching any job, if one is not the caller's.

        action completes "only they or an admin may ...", e.g. "cancel it".
        """
        uid = creds[1]
        strangers = [job for job in jobs if job.uid != uid]
        if strangers and not self.is_admin(uid):
            job = strangers[0]
            self.audit(creds, request, job.id, "not the owner")
            raise PermissionDenied(
                f"job {job.id} belongs to {job.user}; only they or an admin may {action}"
            )

    def require_admin(
        self, creds: tuple[int, int, int], request: str, what: str, root_only: bool = False
    ) -> None:
        uid = creds[1]
        allowed = uid in (0, self.owner_uid) if root_only else self.is_admin(uid)
        if not allowed:
            self.audit(creds, request, None, "not an admin")
            who = "root or the daemon's user" if root_only else "an admin"
            raise PermissionDenied(f"only {who} may {what}")

    def audit(
        self, creds: tuple[int, int, int], request: str, job_id: int | None, reason: str
    ) -> None:
        """One JSON line per denial; the file is the daemon's own (0600)."""
        pid, uid, _ = creds
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "uid": uid,
            "user": user_name(uid),
            "pid": pid,
            "request": request,
            "job": job_id,
            "denied": reason,
        }
        log.warning("denied %s of job %s to uid %d (pid %d): %s", request, job_id, uid, pid, reason)
        try:
            fd = os.open(
                self.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
            )
        except OSError:
            log.exception("cannot write the audit log %s", self.audit_path)
            return
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())
        finally:
            os.close(fd)

    # -- what a caller sees -----------------------------------------------------------------
    def viewer(self, uid: int) -> Viewer:
        sees_all = self.show_commands == "all" or self.is_admin(uid)
        return Viewer(uid, sees_all)


class Viewer:
    """One caller's view of the queue, the one rule every read request applies: of
    another user's job, service or usage row the caller sees who, when, what state and
    how much (ids, GPUs, counts), and never what it is or where it works (name, command,
    directory, log paths, environment), unless the caller is an admin or the daemon's
    `show_commands = "all"`."""

    def __init__(self, uid: int, sees_all: bool):
        self.uid, self.sees_all = uid, sees_all
        self._name = user_name(uid)

    def sees(self, owner_uid: int) -> bool:
        """Whether this caller sees the private facts of something owner_uid owns."""
        return self.sees_all or owner_uid == self.uid

    def job(self, job: Job) -> dict[str, Any]:
        data = job_to_dict(job)
        if self.sees(job.uid):
            return data
        # What the job is and where it works tells as much as its command: its name (the
        # default one is the program's), directory, log paths, environment and the pid
        # of the shell that submitted it.
        data["command"] = [HIDDEN]
        data["name"] = data["job_key"] = ""  # the key is the name, or the command
        data.update(cwd=HIDDEN, stdout_path=HIDDEN, stderr_path=HIDDEN, submit_pid=None)
        if data.get("output_pattern") or data.get("error_pattern"):  # --output, --error
            data.update(output_pattern=HIDDEN, error_pattern=HIDDEN)
        if data.get("container") and data["container"]["options"]:  # --env=NAME=VALUE...
            data["container"] = {**data["container"], "options": [HIDDEN]}
        if (data.get("end_reason") or "").startswith("cannot start:"):  # it names the program
            data["end_reason"] = f"cannot start: {HIDDEN}"
        return data

    def name_of(self, job: Job) -> str:
        """A job's name as job() shows it to this caller: empty when hidden."""
        return job.display_name if self.sees(job.uid) else ""

    def usage_key(self, key: str, owner_uid: int, by: str) -> str:
        """A `usage` row's group: another user's job names all count under HIDDEN."""
        return key if by != "name" or self.sees(owner_uid) else HIDDEN

    def service(self, shown: dict[str, Any]) -> dict[str, Any]:
        """A described service (daemon/services/requests.py): its name, owner, front door and
        replicas are everyone's to see; what its replicas run, where, and with what
        environment are its owner's (a problem may quote them)."""
        if self.sees(shown["uid"]):
            return shown
        job = {k: v for k, v in shown["job"].items() if k in _SERVICE_JOB_PUBLIC}
        return {
            **shown,
            "job": {**job, "command": [HIDDEN]},
            "cwd": HIDDEN,
            "env": None,
            "problem": HIDDEN if shown.get("problem") else "",
        }

    def jobs(self, jobs: Iterable[Job]) -> list[dict[str, Any]]:
        return [self.job(j) for j in jobs]

    def gpus(self, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """GPU dicts (inventory or `gpus` rows) with other users' process commands hidden."""
        if self.sees_all:
            return gpus
        out = []
        for gpu in gpus:
            gpu = dict(gpu)
            gpu["processes"] = [
                p if p.get("user") == self._name else {**p, "command": HIDDEN}
                for p in gpu.get("processes", ())
            ]
            if gpu.get("mig_devices"):
                gpu["mig_devices"] = self.gpus(gpu["mig_devices"])
            out.append(gpu)
        return out
