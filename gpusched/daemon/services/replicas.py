"""The daemon's services: definitions kept in the store, replicas (ordinary jobs) topped up
to the number wanted and replaced when they die or when the service is updated (new ones
healthy before old ones go, or an old one first where there is no room for one more), and
each front door kept in step with the running replicas."""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any

from gpusched.core import services as model
from gpusched.core.errors import GpuschedError, StoreWriteError
from gpusched.core.models import Job, JobState
from gpusched.core.services import GENERATION_VAR, PORT_VAR, SERVICE_VAR, SLOT_VAR
from gpusched.core.spec.syntax import signal_name
from gpusched.daemon.services.frontdoor import Door, minute_of_day
from gpusched.daemon.services.requests import META_PREFIX, ServiceRequests
from gpusched.daemon.state import DaemonState, Setup
from gpusched.proc import haproxy

log = logging.getLogger("gpusched.daemon.services.replicas")

_STEP_EVERY_S = 0.25
_SAMPLE_EVERY_S = 1.0
_DRAIN_MOST_S = 30.0  # a replica still busy after this is stopped all the same


class ServiceManager(ServiceRequests):
    """The services, their replicas and front doors, stepped by the loop; the requests
    that change them are ServiceRequests' (daemon/services/requests.py)."""

    def __init__(self, state: DaemonState, setup: Setup, submits: Any, changes: Any):
        self.state, self.setup, self.submits, self.changes = state, setup, submits, changes
        self.clock = setup.clock
        self.folder = os.path.join(setup.paths.state_dir, "services")
        self.services: dict[str, model.Service] = {}
        self.doors: dict[str, Door] = {}
        self._next_step = self._next_sample = 0.0
        self._replica_ids: dict[str, set[int]] | None = None  # None: not gathered yet
        for key, text in state.store.meta_starting(META_PREFIX).items():
            try:
                service = model.Service.from_dict(json.loads(text))
            except (ValueError, TypeError) as exc:
                log.error("service %s is unreadable in the store, left alone: %s", key, exc)
                continue
            self.services[service.name] = service

    # -- the services and their replicas ---------------------------------------------------
    def replicas(self, name: str) -> list[Job]:
        """The service's active replicas, oldest first. Their ids are kept, so that a step
        never walks the whole queue (100,000 pending jobs, say), but the first one."""
        jobs = self.state.jobs
        if self._replica_ids is None:  # the active jobs are loaded (JobControl.adopt)
            self._replica_ids = {}
            for job_id, job in jobs.alike():  # a template answers env and uid
                owner = self.services.get(job.env.get(SERVICE_VAR, ""))
                if owner is not None and job.uid == owner.uid:
                    self._replica_ids.setdefault(owner.name, set()).add(job_id)
        ids = {i for i in self._replica_ids.get(name, ()) if i in jobs}
        self._replica_ids[name] = ids
        return [jobs[i] for i in sorted(ids)]

    def save(self, service: model.Service) -> None:
        with self.state.write(undone="the service was not changed"):
            self.state.store.set_meta(META_PREFIX + service.name, json.dumps(service.to_dict()))
        self.services[service.name] = service

    def door(self, name: str) -> Door:
        if name not in self.doors:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            door = self.doors[name] = Door(self.folder, name, self.setup.paths.run_dir)
            if door.proxy.is_running():
                door.adopt()
        return self.doors[name]

    def start_proxy(self, service: model.Service, door: Door) -> None:
        """Write its config and start it; the request log is read from before it starts."""
        binary = haproxy.require_binary(self.setup.settings.haproxy)
        door.close()
        requests = door.open_log(fresh=True)  # a new port and secret: the old ones may be known
        door.proxy.write_config(
            service.listen,
            service.balance,
            service.health,
            requests.port,
            requests.token,
            haproxy.owner_identity(service.uid, service.name),
        )
        door.servers.clear()
        door.proxy.start(binary)
        door.problem = ""

    def free_port(self, taken: set[int]) -> int:
        while True:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port not in taken:
                return port

    def add_replica(self, service: model.Service, slot: int) -> int:
        taken = {int(j.env[PORT_VAR]) for name in self.services for j in self.replicas(name)}
        env = {
            **service.env,
            SERVICE_VAR: service.name,
            PORT_VAR: str(self.free_port(taken)),
            GENERATION_VAR: str(service.generation),
            SLOT_VAR: str(slot),
        }
        owner = Job(
            id=0,
            command=(),
            cwd=service.cwd,
            uid=service.uid,
            user=service.user,
            env=env,
            submitted_at=self.clock.time(),
        )
        # A submit's own checks and insert (daemon/requests/submits.py), for the service's owner.
        template = self.submits._template(service.job, owner)
        self.replicas(service.name)  # the ids are gathered before this one is added
        with self.state.write(undone="no replica was queued"):
            job_id: int = self.submits._insert(template, (None,), None)[0]
        assert self._replica_ids is not None  # gathered by replicas() above
        self._replica_ids.setdefault(service.name, set()).add(job_id)
        return job_id

    def stop_replica(self, service: model.Service, job: Job) -> None:
        with self.state.write(undone="the replica was not stopped"):
            self.changes._cancel_one(job, f"service {service.name}")
        self.door(service.name).seen.pop(job.id, None)  # stopped, not died

    def ended(self, job_id: int) -> tuple[str, str]:
        """Which replica a job was and how it ended, for the service's events."""
        job = self.state.find(job_id)
        if job is None:
            return f"replica job {job_id}", "ended"
        how = model.end_words(
            job.state.value,
            job.exit_code,
            signal_name(job.signal) if job.signal else "",
            job.end_reason,
        )
        return f"replica {job.env.get(SLOT_VAR, '?')} (job {job_id})", how

    # -- the loop's part -------------------------------------------------------------------
    def step(self) -> None:
        now_mono = self.clock.monotonic()
        if now_mono < self._next_step or not self.services:
            return
        self._next_step = now_mono + _STEP_EVERY_S
        sample = now_mono >= self._next_sample
        if sample:
            self._next_sample = now_mono + _SAMPLE_EVERY_S
        for name in list(self.services):
            try:
                self.step_service(self.services[name], sample)
            except StoreWriteError:
                pass  # in the log; the next step tries again
            except GpuschedError as exc:
                self.door(name).problem = exc.message
            except OSError as exc:  # HAProxy between a stop and a start, say: next step
                self.door(name).problem = f"HAProxy's admin socket did not answer: {exc}"
            except Exception:
                log.exception("service %s: a step failed", name)
        if sample:
            figures = [self.figures(s) for _, s in sorted(self.services.items())]
            self.state.note_service_figures(figures)

    def figures(self, service: model.Service) -> dict[str, Any]:
        door = self.door(service.name)
        return {
            "name": service.name,
            "wanted": service.wanted,
            "ready": sum(1 for s in door.servers.values() if s == "ready"),
            **door.summary(self.clock.time()),
        }

    def step_service(self, service: model.Service, sample: bool) -> None:
        door = self.door(service.name)
        if not door.proxy.is_running():
            if not door.due_start(self.clock.monotonic()):
                return
            door.note("front door (HAProxy) not running: starting it", self.clock.time())
            self.start_proxy(service, door)
        door.open_log()
        read = door.read_stats() and "BACKEND" in door.stats
        now = self.clock.time()
        latencies = door.take_requests(now)
        if sample:
            if read:  # an unanswered read is no measure of load: not a quiet second
                door.sample(now, latencies, self.gpu_util_pct(service))
            service = self.autoscale(service, door, now)
        replicas = [j for j in self.replicas(service.name) if not j.cancel_requested]
        door.count_ends({j.id for j in replicas}, self.clock.monotonic(), now, self.ended)
        self.sync_door(service, door, replicas, now)
        # Again: a replica that sync_door drained to the end is being stopped now.
        replicas = [j for j in self.replicas(service.name) if not j.cancel_requested]
        self.keep_count(service, door, replicas, now)
        door.problem = ""  # a whole step went through

    def gpu_util_pct(self, service: model.Service) -> float | None:
        indices = {
            i
            for j in self.replicas(service.name)
            if j.state is JobState.RUNNING
            for i in j.gpu_indices
        }
        utils = [
            g.util_pct
            for g in self.state.inventory.gpus
            if g.index in indices and g.util_pct is not None
        ]
        return sum(utils) / len(utils) if utils else None

    def autoscale(self, service: model.Service, door: Door, now: float) -> model.Service:
        wanted, why = model.decide(
            service, list(door.samples), now, door.last_change_s, minute_of_day(now)
        )
        if wanted == service.wanted:
            return service
        self.save(model.scaled(service, wanted))
        door.last_change_s = now
        door.scale_events += 1
        door.note(f"scaled {service.wanted} -> {wanted} replicas ({why})", now)
        return self.services[service.name]

    def weight(self, service: model.Service, job: Job) -> int:
        if service.balance != "weighted":
            return 1
        if service.weights:
            slot = int(job.env.get(SLOT_VAR, 0))
            return service.weights[slot % len(service.weights)]
        # From the replica's GPU: its memory in GiB, a stand-in for its model's size class.
        mem = [g.mem_total_bytes for g in self.state.inventory.gpus if g.index in job.gpu_indices]
        return max(1, min(256, (mem[0] >> 30) if mem else 1))

    def sync_door(
        self, service: model.Service, door: Door, replicas: list[Job], now: float
    ) -> None:
        """Running replicas in, checked before they take requests; ended ones out."""
        running = {j.id: j for j in replicas if j.state is JobState.RUNNING}
        for job_id, job in running.items():
            if job_id not in door.servers:
                door.proxy.add_server(
                    Door.server_name(job_id), int(job.env[PORT_VAR]), self.weight(service, job)
                )
                door.servers[job_id] = "checking"
        for job_id, status in list(door.servers.items()):
            stat = door.stats.get(Door.server_name(job_id))
            if status == "checking" and stat is not None and stat.checked_ok:
                door.proxy.ready_server(Door.server_name(job_id))
                door.servers[job_id] = "ready"
                door.note(f"replica job {job_id} passed its health check", now)
            elif job_id not in self.state.jobs or (status != "draining" and job_id not in running):
                if door.proxy.remove_server(Door.server_name(job_id)):
                    door.servers.pop(job_id, None)
            elif status == "draining":
                self.finish_drain(service, door, job_id, stat, now)

    def finish_drain(
        self, service: model.Service, door: Door, job_id: int, stat: Any, now: float
    ) -> None:
        since = door.draining_since.setdefault(job_id, now)
        if stat is not None and stat.in_flight > 0 and now - since < _DRAIN_MOST_S:
            return
        door.proxy.remove_server(Door.server_name(job_id))
        door.servers.pop(job_id, None)
        door.draining_since.pop(job_id, None)
        job = self.state.jobs.get(job_id)
        if job is not None:
            self.stop_replica(service, job)
            door.note(f"replica job {job_id} drained and stopped", now)

    def retire(self, service: model.Service, door: Door, job: Job, now: float) -> None:
        """Take a replica away: drained first if it is in the front door."""
        if door.servers.get(job.id) in ("ready", "checking") and job.state is JobState.RUNNING:
            door.proxy.drain_server(Door.server_name(job.id))
            door.servers[job.id] = "draining"
            door.draining_since[job.id] = now
        elif door.servers.get(job.id) != "draining":
            self.stop_replica(service, job)

    def keep_count(
        self, service: model.Service, door: Door, replicas: list[Job], now: float
    ) -> None:
        """As many replicas of this generation as wanted; while an update rolls, one more,
        and an old one retired for each new one that is ready. Where the one more cannot
        be placed beside the old ones, an old one goes first (maxSurge 0)."""
        live = [j for j in replicas if door.servers.get(j.id) != "draining"]
        current = [j for j in live if j.env.get(GENERATION_VAR) == str(service.generation)]
        old = [j for j in live if j not in current]
        ready_new = sum(1 for j in current if door.servers.get(j.id) == "ready")
        waiting = [j for j in current if j.state is JobState.PENDING]
        # The scheduler looked at it and could not place it ("waiting to be placed": not yet).
        no_room = [
            j for j in waiting if self.state.reason_of(j) not in ("", "waiting to be placed")
        ]
        # An old replica makes room only while every other one serves: none leaving, and
        # no new one still starting.
        busy = (
            len(replicas) < len(self.replicas(service.name))
            or len(live) < len(replicas)
            or any(j not in waiting and door.servers.get(j.id) != "ready" for j in current)
        )
        if old and (ready_new + len(old) > service.wanted or not service.wanted):
            # Replicas that never took a request go first, then the oldest.
            victim = min(old, key=lambda j: (door.servers.get(j.id) == "ready", j.id))
            self.retire(service, door, victim, now)
        elif old and no_room and len(live) > service.wanted and not busy:
            victim = min(old, key=lambda j: (door.servers.get(j.id) == "ready", j.id))
            door.note(
                f"no room for replica job {no_room[0].id} beside the old ones "
                f"({self.state.reason_of(no_room[0])}): old replica job {victim.id} "
                "goes first",
                now,
            )
            self.retire(service, door, victim, now)
        elif (
            not old
            and not busy
            and ready_new >= service.wanted
            and door.rolling == service.generation
        ):
            door.rolling = 0
            door.note(f"update {service.generation} done: every replica replaced", now)
        elif len(current) > service.wanted:
            # The newest go first, those not serving before those that are.
            victim = max(current, key=lambda j: (door.servers.get(j.id) != "ready", j.id))
            self.retire(service, door, victim, now)
        elif (
            len(current) < service.wanted
            and len(live) < service.wanted + (1 if old else 0)
            and not (old and waiting)
            and self.clock.monotonic() >= door.restart_at_mono
        ):
            slots = {int(j.env.get(SLOT_VAR, -1)) for j in current}
            slot = min(set(range(service.wanted + 1)) - slots)
            job_id = self.add_replica(service, slot)
            door.seen[job_id] = False
            door.note(f"replica job {job_id} queued", now)

    def close(self) -> None:
        for door in self.doors.values():
            door.close()
