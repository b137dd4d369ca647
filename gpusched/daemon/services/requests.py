"""The `service` requests (create, list, show, scale, update, delete): checked, stored,
answered; the loop's side of the services (replicas, front doors) is daemon/services/replicas.py."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpusched.core import services as model
from gpusched.core.errors import GpuschedError, NotFound, PermissionDenied, UsageError
from gpusched.core.models import Job, JobState
from gpusched.core.services import GENERATION_VAR, PORT_VAR
from gpusched.core.spec import limits
from gpusched.core.users import user_name
from gpusched.daemon.services.frontdoor import Door, minute_of_day

if TYPE_CHECKING:
    from gpusched.daemon.state import Clock, DaemonState, Setup

META_PREFIX = "service:"


class ServiceRequests:
    """The requests' half of ServiceManager, which provides services, doors, save(),
    door(), start_proxy(), free_port(), replicas() and the state."""

    state: DaemonState
    setup: Setup
    submits: Any  # Submits and Changes, which only the handlers know (daemon/requests/handlers.py)
    changes: Any
    clock: Clock
    folder: str
    services: dict[str, model.Service]
    doors: dict[str, Door]

    if TYPE_CHECKING:  # ServiceManager's (daemon/services/replicas.py)

        def replicas(self, name: str) -> list[Job]: ...
        def save(self, service: model.Service) -> None: ...
        def door(self, name: str) -> Door: ...
        def start_proxy(self, service: model.Service, door: Door) -> None: ...
        def free_port(self, taken: set[int]) -> int: ...

    def request(self, req: Any) -> dict[str, Any]:
        """The `service` request: one of protocol.SERVICE_ACTIONS."""
        args, action = req.args, req.args["action"]
        # Each answer as the caller may see it (authz.Viewer: another user's command is theirs).
        shown = self.setup.authz.viewer(req.creds[1]).service
        if action == "list":
            return {
                "services": [
                    shown(self.describe(service)) for _, service in sorted(self.services.items())
                ]
            }
        if "name" not in args or args["name"] is None:
            raise UsageError(f"service {action} needs a service name")
        if action == "create":
            return shown(self.create(args, req.creds))
        if action == "show":
            return shown(self.describe(self.find(args["name"])))
        if action == "scale":
            return shown(self.scale(args["name"], args.get("replicas"), req.creds))
        if action == "update":
            return shown(self.update(args["name"], args.get("spec") or {}, req.creds))
        return self.delete(args["name"], req.creds)

    def find(self, name: Any, creds: tuple[int, int, int] | None = None) -> model.Service:
        service = self.services.get(name) if isinstance(name, str) else None
        if service is None:
            known = ", ".join(sorted(self.services)) or "none yet"
            raise NotFound(
                f"no service {name!r} (services: {known}); `gpusched service ls` lists them"
            )
        if creds is not None:
            uid = creds[1]
            if uid != service.uid and not self.setup.authz.is_admin(uid):
                # As a job of another user's: audited, and exit 1 (not a bad command line).
                self.setup.authz.audit(creds, "service", None, f"not the owner of {name}")
                raise PermissionDenied(
                    f"service {name} belongs to {service.user}; only its "
                    "owner or an admin may change it"
                )
        return service

    def create(self, args: dict[str, Any], creds: tuple[int, int, int]) -> dict[str, Any]:
        name = model.check_name(args.get("name"))
        if name in self.services:
            raise UsageError(
                f"service {name} exists already; `gpusched service update {name}`"
                " changes it, `gpusched service delete` removes it"
            )
        spec = model.check_spec(args.get("spec") or {})
        if "job" not in spec:
            raise UsageError("a service needs a command; put it after `--`")
        spec.setdefault("env", {})
        spec.setdefault("cwd", "/")
        self.check_limits(spec)
        uid = creds[1]
        low, high = spec.pop("min_replicas", 1), spec.pop("max_replicas", 1)
        spec["listen"] = self.pick_listen(spec.get("listen") or "127.0.0.1:0")
        if int(spec["listen"].rpartition(":")[2]) < 1024 and not self.setup.authz.is_admin(uid):
            raise UsageError(
                f"--listen {spec['listen']}: ports below 1024 are for admins; "
                "pick a port from 1024 up"
            )
        service = model.Service(
            name=name,
            uid=uid,
            user=user_name(uid),
            min_replicas=low,
            max_replicas=high,
            wanted=low,
            created_at=self.clock.time(),
            **spec,
        )
        owner = Job(id=0, command=(), cwd=service.cwd, uid=uid, user=service.user, env={})
        template = self.submits._template(service.job, owner)  # refused now, not at each replica
        self.submits.check_priority(creds, template.priority)
        door = self.door(name)
        try:
            self.start_proxy(service, door)
            self.save(service)
        except GpuschedError:  # nothing of it is kept: its request log socket neither
            door.proxy.stop()
            door.close()
            self.doors.pop(name, None)
            raise
        door.note(
            f"created with {low} replica(s), front door on {service.listen}", self.clock.time()
        )
        return self.describe(service)

    def check_limits(self, spec: dict[str, Any]) -> None:
        """A replica's command, name, environment and directory against [limits], as a
        submit's are: a client can be bypassed, and each replica is queued from them."""
        limits.check_submit(
            {"jobs": [spec["job"]], "env": spec["env"], "cwd": spec["cwd"]},
            limits.from_settings(self.setup.settings),
        )

    def pick_listen(self, listen: str) -> str:
        if listen.endswith(":0"):
            return f"{listen[:-2]}:{self.free_port(set())}"
        return listen

    def scale(self, name: Any, replicas: Any, creds: tuple[int, int, int]) -> dict[str, Any]:
        service = self.find(name, creds)
        if not isinstance(replicas, int) or not 0 <= replicas <= model.MAX_REPLICAS:
            raise UsageError(f"replicas must be 0-{model.MAX_REPLICAS}, not {replicas!r}")
        if service.autoscaled and not service.min_replicas <= replicas <= service.max_replicas:
            raise UsageError(
                f"service {name} scales itself between {service.min_replicas} and "
                f"{service.max_replicas}; `gpusched service update {name} "
                f"--replicas MIN:MAX` changes that"
            )
        now = self.clock.time()
        if service.autoscaled:  # the autoscaler must not undo it at its next sample
            service = replace(service, autoscale_resumes_at=now + service.autoscale.cooldown_s)
        else:
            service = replace(service, min_replicas=replicas, max_replicas=replicas)
        self.save(model.scaled(service, replicas))
        door = self.door(name)
        door.scale_events += 1
        door.note(f"scaled to {replicas} replica(s) by {user_name(creds[1])}", now)
        return self.describe(self.services[name])

    def update(
        self, name: Any, spec: dict[str, Any], creds: tuple[int, int, int]
    ) -> dict[str, Any]:
        service = self.find(name, creds)
        given = model.check_spec(spec)
        changes: dict[str, Any] = {"generation": service.generation + 1}
        if given.keys() & {"job", "env", "cwd"}:
            # Over what the service has: what the update does not give stays as it was.
            job = {
                "job": model.merged_job(service.job, given.get("job") or {}),
                "env": {**service.env, **given.get("env", {})},
                "cwd": given.get("cwd", service.cwd),
            }
            self.check_limits(job)
            changes.update(job)
        if "min_replicas" in given:
            low, high = given["min_replicas"], given["max_replicas"]
            changes.update(
                min_replicas=low, max_replicas=high, wanted=max(low, min(high, service.wanted))
            )
        updated = replace(service, **changes)
        owner = Job(id=0, command=(), cwd=updated.cwd, uid=service.uid, user=service.user, env={})
        template = self.submits._template(updated.job, owner)
        self.submits.check_priority(creds, template.priority)
        self.save(updated)
        door = self.door(name)
        door.rolling = updated.generation
        door.note(
            f"update {updated.generation}: replicas replaced one at a time", self.clock.time()
        )
        return self.describe(updated)

    def delete(self, name: Any, creds: tuple[int, int, int]) -> dict[str, Any]:
        service = self.find(name, creds)
        with self.state.write(undone="the service was not deleted"):
            self.state.store.delete_meta(META_PREFIX + name)
            stopped = [j.id for j in self.replicas(name) if not j.state.is_final]
            for job in self.replicas(name):
                self.changes._cancel_one(job, f"service {name} deleted")
        del self.services[name]
        figures = [f for f in self.state.service_figures if f["name"] != name]
        self.state.note_service_figures(figures)
        door = self.doors.pop(name, None) or Door(self.folder, name, self.setup.paths.run_dir)
        door.proxy.stop()
        door.close()
        return {"name": service.name, "deleted": True, "stopped_jobs": stopped}

    def describe(self, service: model.Service) -> dict[str, Any]:
        door = self.door(service.name)
        now = self.clock.time()
        replicas = []
        for job in self.replicas(service.name):
            stat = door.stats.get(Door.server_name(job.id))
            replicas.append(
                {
                    "job_id": job.id,
                    "state": job.state.value,
                    "port": int(job.env[PORT_VAR]),
                    "generation": int(job.env.get(GENERATION_VAR, 1)),
                    "door": door.servers.get(job.id, "-"),
                    "gpu_indices": list(job.gpu_indices),
                    "requests": stat.total if stat else 0,
                    "in_flight": stat.in_flight if stat else 0,
                    "weight": stat.weight if stat else None,
                    "pending_reason": job.pending_reason if job.state is JobState.PENDING else "",
                }
            )
        low, high = model.bounds(service, minute_of_day(now))
        return {
            **service.to_dict(),
            "env": None,
            "running": sum(1 for r in replicas if r["door"] == "ready"),
            "bounds_now": [low, high],
            "replicas": replicas,
            "updating": model.rollout_words(service.generation, service.wanted, replicas),
            **door.summary(now),
        }
