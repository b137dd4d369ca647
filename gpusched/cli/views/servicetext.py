"""Services in words: `service ls` as a table, `service show` as a page (plain text)."""

from __future__ import annotations

import time
from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}ms"


def _replicas(service: dict[str, Any]) -> str:
    bounds = (
        f"{service['min_replicas']}"
        if service["min_replicas"] == service["max_replicas"]
        else f"{service['min_replicas']}:{service['max_replicas']}"
    )
    return f"{service['running']}/{service['wanted']} ({bounds})"


def table(services: list[dict[str, Any]]) -> str:
    rows = [("NAME", "USER", "REPLICAS", "LISTEN", "BALANCE", "REQUESTS", "REQ/S", "P95")]
    for s in services:
        rows.append(
            (
                s["name"],
                s["user"],
                _replicas(s),
                s["listen"],
                s["balance"],
                str(s["requests_total"]),
                f"{s['requests_per_s']:.1f}",
                _ms(s["p95_ms"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def details(s: dict[str, Any]) -> str:
    command = " ".join(s["job"].get("command") or [])
    auto = s["autoscale"]
    lines = [
        f"service {s['name']} ({s['user']}), update {s['generation']}",
        f"  command:   {command}",
        f"  replicas:  {s['running']} ready of {s['wanted']} wanted "
        f"(min {s['min_replicas']}, max {s['max_replicas']}; now allowed "
        f"{s['bounds_now'][0]}-{s['bounds_now'][1]})",
        f"  front door: {s['listen']}  balance {s['balance']}"
        f"{'  weights ' + ','.join(map(str, s['weights'])) if s['weights'] else ''}"
        f"  health {s['health'] or 'tcp connect'}  haproxy pid {s['proxy_pid'] or '-'}",
    ]
    if s["problem"]:
        lines.append(f"  problem:   {s['problem']}")
    if s.get("updating"):
        lines.append(f"  updating:  {s['updating']}")
    if s["max_replicas"] > s["min_replicas"]:
        target = (
            f", p95 under {_ms(auto['target_latency_ms'])}" if auto["target_latency_ms"] else ""
        )
        lines.append(
            f"  autoscale: {auto['target_in_flight']:g} in flight per replica{target}, "
            f"GPU under 70%, window {auto['window_s']:g}s, cool-down "
            f"{auto['cooldown_s']:g}s"
        )
        resumes = s.get("autoscale_resumes_at") or 0
        if resumes > time.time():
            lines.append(
                f"             scaled by hand: autoscaling resumes at "
                f"{time.strftime('%H:%M:%S', time.localtime(resumes))}"
            )
    lines.append(
        f"  requests:  {s['requests_total']} ({s['failed_total']} failed), "
        f"{s['requests_per_s']:.1f}/s over the last minute, in flight {s['in_flight']}, "
        f"p50 {_ms(s['p50_ms'])}, p95 {_ms(s['p95_ms'])}"
    )
    lines.append(
        "  latency:   "
        + "  ".join(
            f"<={b}ms:{n}" for b, n in zip(s["latency_buckets_ms"], s["latency_counts"]) if n
        )
        + (f"  more:{s['latency_counts'][-1]}" if s["latency_counts"][-1] else "")
    )
    lines.append("  JOB      STATE      PORT   UPDATE  DOOR       GPUS  REQUESTS  IN-FLIGHT")
    for r in s["replicas"]:
        gpus = ",".join(map(str, r["gpu_indices"])) or "-"
        lines.append(
            f"  {r['job_id']:<8} {r['state']:<10} {r['port']:<6} {r['generation']:<7} "
            f"{r['door']:<10} {gpus:<5} {r['requests']:<9} {r['in_flight']}"
            + (f"  ({r['pending_reason']})" if r["pending_reason"] else "")
        )
    if s["events"]:
        lines.append("  events:")
        lines += [
            f"    {time.strftime('%H:%M:%S', time.localtime(e['at']))}  {e['event']}"
            for e in s["events"][-10:]
        ]
    return "\n".join(lines)
