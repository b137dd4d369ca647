"""Inference services, pure: a service's definition and its checks, an update merged over
it, the replicas its schedule allows at a time of day, the autoscaling decision over a
window of load, and where a rolling update stands."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.spec import values
from gpusched.core.spec.values import shown

# In each replica's environment, besides what every job gets:
SERVICE_VAR = "GPUSCHED_SERVICE"  # whose replica it is
GENERATION_VAR = "GPUSCHED_SERVICE_GENERATION"  # the update it belongs to
SLOT_VAR = "GPUSCHED_SERVICE_REPLICA"  # 0, 1, ...: which weight of --weights it gets
PORT_VAR = "PORT"  # where it must listen
BALANCES = ("roundrobin", "leastconn", "weighted")
MAX_REPLICAS = 64
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_HOST = re.compile(r"[A-Za-z0-9.:\[\]-]+")
_HEALTH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*")
_WINDOW = re.compile(r"(\d\d):(\d\d)-(\d\d):(\d\d)=(\d+)")
# The seed's rule of thumb: above 70 % GPU utilization, add capacity.
GPU_UTIL_HIGH_PCT = 70.0
# Hysteresis: scale down only once every measure is below this share of its target, so
# that one replica less does not push the load straight back over the target.
DOWN_SHARE = 0.4


@dataclass(frozen=True)
class Autoscale:
    """When to add or remove a replica (only between min and max replicas)."""

    target_in_flight: float = 4.0  # requests in flight per replica
    target_latency_ms: float | None = None  # p95 through the front door
    window_s: float = 30.0
    cooldown_s: float = 60.0


@dataclass(frozen=True)
class Service:
    """A service as stored: its replicas' job (a submit's spec, environment and directory),
    its owner, and its front door."""

    name: str
    uid: int
    user: str
    job: dict[str, Any]  # one job spec, as `submit` sends it
    env: dict[str, str]
    cwd: str
    min_replicas: int = 1
    max_replicas: int = 1
    wanted: int = 1  # replicas wanted now (scale, autoscaling)
    listen: str = "127.0.0.1:0"
    balance: str = "roundrobin"
    health: str = ""  # an HTTP path; "" checks that the port accepts connections
    weights: tuple[int, ...] = ()  # per replica slot, for --balance weighted
    schedule: tuple[tuple[int, int, int], ...] = ()  # (from minute, to minute, at most)
    autoscale: Autoscale = field(default_factory=Autoscale)
    generation: int = 1  # raised by `service update`: replicas of older ones are replaced
    created_at: float = 0.0
    # A manual `service scale` holds autoscaling off until then (its cool-down).
    autoscale_resumes_at: float = 0.0

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas > self.min_replicas

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "autoscale"}
        out["weights"], out["schedule"] = list(self.weights), [list(w) for w in self.schedule]
        out["autoscale"] = dict(vars(self.autoscale))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Service:
        data = dict(data)
        data["weights"] = tuple(data.get("weights") or ())
        data["schedule"] = tuple(tuple(w) for w in data.get("schedule") or ())
        data["autoscale"] = Autoscale(**(data.get("autoscale") or {}))
        return cls(**data)


def check_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A create's or an update's definition as the client sent it, each value checked
    (the job spec itself is checked as a submit's)."""
    out: dict[str, Any] = {}
    # An update sends only what it changes: each of the three may come alone.
    if spec.get("job") is not None:
        out["job"] = values.mapping(spec["job"], "spec.job")
    if spec.get("env") is not None:
        out["env"] = values.environment(spec["env"], "spec.env")  # as a submit's
    if spec.get("cwd") is not None:
        out["cwd"] = values.text(spec["cwd"] or "/", "spec.cwd")
    if spec.get("min_replicas") is not None or spec.get("max_replicas") is not None:
        low = values.whole_number(spec.get("min_replicas"), "spec.min_replicas", 0, MAX_REPLICAS)
        high = values.whole_number(spec.get("max_replicas"), "spec.max_replicas", low, MAX_REPLICAS)
        out.update(min_replicas=low, max_replicas=high)
    if spec.get("listen") is not None:
        out["listen"] = parse_listen(values.text(spec["listen"], "spec.listen"))
    if spec.get("balance") is not None:
        out["balance"] = parse_balance(spec["balance"])
    if spec.get("health") is not None:
        out["health"] = parse_health(values.text(spec["health"], "spec.health"))
    out["weights"] = tuple(
        values.list_of(
            spec.get("weights") or [],
            "spec.weights",
            lambda w: values.whole_number(w, "a weight", 1, 256),
        )
    )
    out["schedule"] = tuple(
        tuple(
            values.list_of(
                w, "a schedule window", lambda n: values.whole_number(n, "a minute", 0, 1440)
            )
        )
        for w in values.list_of(spec.get("schedule") or [], "spec.schedule", lambda w: w)
    )
    if any(len(w) != 3 for w in out["schedule"]):
        raise UsageError("spec.schedule: each window is [from minute, to minute, at most]")
    rule = values.mapping(
        spec.get("autoscale") or {}, "spec.autoscale", keys=tuple(Autoscale.__dataclass_fields__)
    )
    out["autoscale"] = Autoscale(
        **{
            k: values.number(v, f"autoscale.{k}", 0.001, 10**7)
            for k, v in rule.items()
            if v is not None
        }
    )
    return out


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(
            f"service name {shown(name)} is not valid; use 1-32 lower-case "
            "letters, digits, '-' or '_', starting with a letter"
        )
    return name


def parse_replicas(text: str) -> tuple[int, int]:
    """'2' -> (2, 2); '1:4' -> (1, 4): MIN[:MAX]."""
    low, _, high = str(text).partition(":")
    try:
        low_n, high_n = int(low), int(high or low)
    except ValueError:
        raise UsageError(f"--replicas {shown(text)} is not MIN[:MAX]; e.g. 2 or 1:4") from None
    if not 0 <= low_n <= high_n <= MAX_REPLICAS:
        raise UsageError(f"--replicas {shown(text)}: need 0 <= MIN <= MAX <= {MAX_REPLICAS}")
    return low_n, high_n


def parse_listen(text: str) -> str:
    host, _, port = str(text).rpartition(":")
    # Written into HAProxy's config: nothing but a host name or address gets through.
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {shown(text)} is not HOST:PORT; e.g. 127.0.0.1:8080")
    return f"{host}:{int(port)}"


def parse_health(path: str) -> str:
    """An HTTP path (written into HAProxy's config: no spaces, no line breaks), or ""."""
    if path and not _HEALTH.fullmatch(str(path)):
        raise UsageError(f"--health {shown(path)} is not an HTTP path; e.g. /healthz")
    return path


def parse_balance(text: str) -> str:
    if text not in BALANCES:
        raise UsageError(f"--balance {shown(text)} is not one of {', '.join(BALANCES)}")
    return text


def parse_weights(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        weights = tuple(int(w) for w in text.split(","))
    except ValueError:
        weights = ()
    if not weights or not all(1 <= w <= 256 for w in weights):
        raise UsageError(
            f"--weights {shown(text)} is not a list of whole numbers 1-256, one per replica: 3,1"
        )
    return weights


def parse_schedule(texts: Sequence[str]) -> tuple[tuple[int, int, int], ...]:
    """'00:00-07:00=1' -> (0, 420, 1): at most 1 replica from midnight to 7:00."""
    windows = []
    for text in texts:
        match = _WINDOW.fullmatch(text.strip())
        if not match:
            raise UsageError(f"--schedule {shown(text)} is not HH:MM-HH:MM=N; e.g. 00:00-07:00=1")
        h1, m1, h2, m2, most = (int(g) for g in match.groups())
        if h1 > 24 or h2 > 24 or m1 > 59 or m2 > 59:
            raise UsageError(f"--schedule {shown(text)}: no such time of day")
        windows.append((h1 * 60 + m1, h2 * 60 + m2, most))
    return tuple(windows)


def scheduled_cap(service: Service, minute_of_day: int) -> int:
    """The most replicas the schedule allows at this minute (windows may wrap midnight)."""
    cap = service.max_replicas
    for start, end, most in service.schedule:
        inside = (
            start <= minute_of_day < end
            if start <= end
            else (minute_of_day >= start or minute_of_day < end)
        )
        if inside:
            cap = min(cap, most)
    return cap


def bounds(service: Service, minute_of_day: int) -> tuple[int, int]:
    """(fewest, most) replicas now: a schedule window may go below MIN."""
    cap = scheduled_cap(service, minute_of_day)
    return min(service.min_replicas, cap), cap


@dataclass(frozen=True)
class LoadSample:
    """What the front door measured at one moment."""

    at_s: float
    in_flight: int  # requests being served or queued in the proxy
    running: int  # replicas up (passing health checks)
    p95_ms: float | None = None  # over the requests since the last sample
    gpu_util_pct: float | None = None  # mean over the replicas' GPUs


def p95(latencies_ms: Sequence[float]) -> float | None:
    if not latencies_ms:
        return None
    ordered = sorted(latencies_ms)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def decide(
    service: Service,
    samples: Sequence[LoadSample],
    now_s: float,
    last_change_s: float,
    minute_of_day: int,
) -> tuple[int, str]:
    """The replicas wanted, and why: one more while any measure is over its target over the
    whole window, one fewer once all are well below, none within the cool-down; always
    within MIN..MAX and the schedule."""
    low, high = bounds(service, minute_of_day)
    wanted = service.wanted
    if wanted > high or wanted < low:
        return max(low, min(high, wanted)), "schedule" if wanted > high else "minimum"
    rule = service.autoscale
    window = [s for s in samples if s.at_s >= now_s - rule.window_s]
    if (
        not service.autoscaled
        or now_s - last_change_s < rule.cooldown_s
        or not window
        or now_s < service.autoscale_resumes_at  # scaled by hand: its cool-down
        or window[0].at_s > now_s - rule.window_s * 0.8
    ):  # the window is not covered
        return wanted, ""
    ratios = load_ratios(rule, window)
    if ratios and max(ratios.values()) > 1.0 and wanted < high:
        worst = max(ratios, key=ratios.__getitem__)
        return wanted + 1, f"{worst} over target"
    if ratios and max(ratios.values()) < DOWN_SHARE and wanted > low:
        return wanted - 1, "load below target"
    return wanted, ""


def load_ratios(rule: Autoscale, window: Sequence[LoadSample]) -> dict[str, float]:
    """Each measure over the window against its target (1.0: on target). A measure is over
    its target only if it was in every sample (a burst is not a trend); below it on average."""
    out: dict[str, float] = {}
    per_replica = [s.in_flight / max(s.running, 1) / rule.target_in_flight for s in window]
    out["requests in flight"] = _trend(per_replica)
    if rule.target_latency_ms:
        latencies = [s.p95_ms / rule.target_latency_ms for s in window if s.p95_ms is not None]
        if latencies:
            out["p95 latency"] = _trend(latencies)
    utils = [s.gpu_util_pct / GPU_UTIL_HIGH_PCT for s in window if s.gpu_util_pct is not None]
    if utils:
        out["GPU utilization"] = _trend(utils)
    return out


def _trend(ratios: list[float]) -> float:
    """Over 1 only if every ratio is (sustained); otherwise the mean (for scaling down)."""
    low = min(ratios)
    return low if low > 1.0 else min(sum(ratios) / len(ratios), 1.0)


def scaled(service: Service, wanted: int) -> Service:
    return replace(service, wanted=wanted)


def merged_job(stored: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """An update's job spec: what it gives over what the service has (a nested mapping,
    the GPU constraints, key by key), so that `update -- CMD` keeps the service's --gpus.
    Asking for GPU memory or particular GPUs means a GPU, as at submit."""
    out = dict(stored)
    for key, value in given.items():
        out[key] = (
            {**out[key], **value}
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    wants_gpu = (
        given.get("gpu_mem_bytes")
        or given.get("gpu_mem_auto")
        or any((given.get("constraints") or {}).values())
    )
    if wants_gpu and not out.get("gpus"):
        out["gpus"] = 1
    if given.get("gpus") == 0:  # as resubmit's --gpus 0: no GPU memory nor GPU constraints
        for key in {"gpu_mem_bytes", "gpu_mem_auto", "constraints"} - given.keys():
            out.pop(key, None)
    return out


def end_words(state: str, exit_code: int | None, signal_name: str, end_reason: str) -> str:
    """How a replica's job ended, for the service's events: exit 3, SIGKILL, or why."""
    if end_reason:
        return end_reason
    if signal_name:
        return f"killed by {signal_name}"
    return f"exit {exit_code}" if exit_code is not None else state


def rollout_words(generation: int, wanted: int, replicas: Sequence[dict[str, Any]]) -> str:
    """Where an update stands (replicas as `service show` lists them), "" once no replica
    of an older update is left: how many are replaced, and what the next step waits for."""
    old = [r for r in replicas if r["generation"] != generation]
    if not old:
        return ""
    new = [r for r in replicas if r["generation"] == generation]
    ready = sum(1 for r in new if r["door"] == "ready")
    words = f"replica {min(ready, wanted)} of {wanted} replaced"
    pending = next((r for r in new if r["state"] == "pending"), None)
    starting = next((r for r in new if r["state"] != "pending" and r["door"] != "ready"), None)
    leaving = next((r for r in old if r["door"] == "draining"), None)
    if leaving is not None:
        return f"{words}; draining old replica job {leaving['job_id']}"
    if pending is not None:
        return (
            f"{words}; replica job {pending['job_id']} waits: "
            f"{pending['pending_reason'] or 'to be placed'}"
        )
    if starting is not None:
        return f"{words}; replica job {starting['job_id']} waits for its health check"
    return f"{words}; replacing the next one"
