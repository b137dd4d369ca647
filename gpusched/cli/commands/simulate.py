"""`gpusched simulate`: replay a trace with the simulator and print its metrics, as a table
or as JSON. The simulator itself (sim/) only computes."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpusched.client.submit.jobrequest import size_option
from gpusched.core.config import read_config, settings_from_mapping
from gpusched.core.errors import ConfigError, UsageError
from gpusched.core.sched.queuerules import HostCapacity, QueueRules
from gpusched.core.sched.quotas import Quotas
from gpusched.sim import estimates as memory
from gpusched.sim import overuse, preemptsim, traces
from gpusched.sim.simulator import TAU_S, Metrics, check_choices, compute_metrics, simulate


def _report(trace: traces.Trace, metrics: Metrics, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "trace": trace.source,
        **settings,
        "arrival_scale": trace.arrival_scale,
        **asdict(metrics),
    }


def _print_table(report: dict[str, Any]) -> None:
    load = (
        f"load {report['load']:g} (arrivals x{report['arrival_scale']:.3f})"
        if report["load"] is not None
        else "original load"
    )
    seed = f", seed {report['seed']}" if report["arrivals"] == "poisson" else ""
    seed += f", quotas of {report['config']}" if report.get("config") else ""
    title = (
        f"{report['trace']}: {report['jobs']} jobs, {report['tenants']} tenants on "
        f"{report['gpus']} GPUs; policy {report['policy']}, discipline {report['discipline']}, "
        f"{load}, {report['arrivals']} arrivals{seed}"
    )
    lines = [
        ("average JCT", f"{report['avg_jct_s'] / 3600:.3f} h"),
        ("median JCT", f"{report['median_jct_s'] / 3600:.3f} h"),
        ("p99 JCT", f"{report['p99_jct_s'] / 3600:.3f} h"),
        ("average wait", f"{report['avg_wait_s'] / 3600:.3f} h"),
        (f"avg bounded slowdown (tau {TAU_S:g} s)", f"{report['avg_bounded_slowdown']:.3f}"),
        ("makespan", f"{report['makespan_s'] / 3600:.3f} h"),
        ("GPU utilization", f"{report['gpu_utilization'] * 100:.1f} %"),
        ("Jain fairness (bounded slowdown by tenant)", f"{report['jain_fairness']:.3f}"),
        *_priority_lines(report),
        ("simulated in", f"{report['elapsed_s']:.2f} s"),
    ]
    width = max(len(name) for name, _ in lines)
    sys.stdout.write(
        title + "\n" + "".join(f"  {name:<{width}}  {value:>10}\n" for name, value in lines)
    )


def _priority_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    high = report.get("high_priority")
    if not high:
        return []
    lines = [
        ("high-priority jobs", f"{high['jobs']} ({report['high_priority_share']:.0%})"),
        ("preemptions", str(report["preemptions"]) if report["preemption"] else "off"),
    ][0 if report["high_priority_share"] else 1 :]  # none under plain las
    if report["preemption"]:
        lines += [
            ("  per job", f"{report['preemptions_per_job']:.3f}"),
            ("  GPU time lost to restarts", f"{report['lost_gpu_share'] * 100:.2f} %"),
        ]
    if high["jobs"]:
        lines += [
            ("  their average JCT", f"{high['avg_jct_s'] / 3600:.3f} h"),
            ("  their avg bounded slowdown", f"{high['avg_bounded_slowdown']:.3f}"),
        ]
    return lines


def _host(cpus: int | None, mem: str | None) -> HostCapacity | None:
    """The simulated host's cores and memory; None (not counted) unless either is given."""
    if cpus is None and mem is None:
        return None
    if cpus is not None and cpus < 1:
        raise UsageError(f"--cpus must be 1 or more, not {cpus}")
    mem_bytes = size_option(mem, "--mem")
    return HostCapacity(cpus=cpus or 10**6, mem_bytes=2**62 if mem_bytes is None else mem_bytes)


def _quotas(config: Path | None) -> tuple[Quotas | None, dict[str, list[str]] | None]:
    """The quotas of a config file, and the user -> groups of its [simulate.groups]
    (group = [users]; None: the group database's)."""
    if config is None:
        return None, None
    if not config.is_file():
        raise UsageError(f"--config {config}: no such file. Give a gpusched.toml")
    data = read_config(config)
    extra = data.pop("simulate", {})
    table = settings_from_mapping(data, str(config)).quotas
    members = extra.get("groups") if isinstance(extra, dict) else None
    if set(extra) - {"groups"} or (members is not None and not _is_groups(members)):
        raise ConfigError(
            f"{config}: [simulate] holds groups only, e.g. [simulate.groups] "
            'students = ["alice", "bob"]'
        )
    if members is None:
        return table, None
    groups: dict[str, list[str]] = {}
    for group, users in members.items():
        for user in users:
            groups.setdefault(user, []).append(group)
    return table, groups


def _is_groups(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(users, list) and all(isinstance(u, str) for u in users)
        for users in value.values()
    )


def _with_priorities(
    prepared: traces.Trace,
    gpus: int,
    policy: str,
    discipline: str,
    preemption: bool,
    share: float,
    seed: int,
) -> tuple[Metrics, dict[str, Any]]:
    """Replay with a seeded share of urgent jobs (and preemption): the metrics, and the
    report's further fields: the urgent jobs' own figures, how many preemptions."""
    if not 0 <= share <= 1:
        raise UsageError(f"--high-priority-share must be between 0 and 1, not {share:g}")
    urgent = preemptsim.urgent_ids(len(prepared.jobs), share, seed)
    results, replay = preemptsim.replay_with_priorities(
        prepared.jobs,
        gpus=gpus,
        urgent=urgent,
        policy=policy,
        queue=QueueRules(discipline=discipline),
        model=preemptsim.PreemptionModel() if preemption else None,
    )
    work_gpu_s = sum(r.num_gpus * r.duration_s for r in results)
    high = [r for n, r in enumerate(results) if n in urgent]
    high_metrics = compute_metrics(high, gpus) if high else None
    return compute_metrics(results, gpus), {
        "preemption": preemption,
        "high_priority_share": share,
        "preemptions": replay.preemptions,
        "preemptions_per_job": replay.preemptions / len(results) if results else 0.0,
        "lost_gpu_share": replay.lost_gpu_s / (work_gpu_s + replay.lost_gpu_s)
        if work_gpu_s
        else 0.0,
        "high_priority": {
            "jobs": len(high),
            "avg_jct_s": high_metrics and high_metrics.avg_jct_s,
            "avg_bounded_slowdown": high_metrics and high_metrics.avg_bounded_slowdown,
        },
    }


def simulate_command(
    trace: Path,
    *,
    gpus: int,
    policy: str,
    discipline: str,
    load: float | None,
    arrivals: str,
    seed: int,
    as_json: bool,
    cpus: int | None = None,
    mem: str | None = None,
    preemption: bool = False,
    high_priority_share: float | None = None,
    estimates: bool = False,
    config: Path | None = None,
) -> int:
    """`gpusched simulate`: replay, then print the metrics as a table or JSON."""
    rules = check_choices(gpus, policy, discipline)  # before reading a large file
    quota_table, groups = _quotas(config)
    if quota_table and (preemption or high_priority_share is not None or discipline == "las"):
        raise UsageError(
            "quotas (--config) replay without preemption; leave out --preemption, "
            "--high-priority-share and --discipline las"
        )
    started_s = time.perf_counter()
    prepared = traces.prepare(trace, gpus=gpus, load=load, arrivals=arrivals, seed=seed)
    host = _host(cpus, mem)
    if discipline == "las":
        # las preempts by attained service: without it no waiting job has any, and las is fifo.
        if host is not None or estimates:
            raise UsageError(
                "--discipline las replays with preemption, which counts GPUs only; "
                "leave out --cpus, --mem and --estimates"
            )
        preemption = True
        high_priority_share = high_priority_share or 0.0
    if (preemption or high_priority_share is not None) and host is not None:
        raise UsageError(
            "--preemption and --high-priority-share count GPUs only; leave out --cpus and --mem"
        )
    settings = {
        "gpus": gpus,
        "cpus": cpus,
        "mem": mem,
        "policy": policy,
        "discipline": discipline,
        "load": load,
        "arrivals": arrivals,
        "seed": seed if arrivals == "poisson" else None,
        "config": None if config is None else str(config),
    }
    model = None
    if estimates and (preemption or high_priority_share is not None):
        raise UsageError(
            "--estimates replays without priorities; leave out --preemption and "
            "--high-priority-share"
        )
    if preemption or high_priority_share is not None:
        share = (
            preemptsim.DEFAULT_HIGH_SHARE if high_priority_share is None else high_priority_share
        )
        metrics, extra = _with_priorities(
            prepared, gpus, policy, discipline, preemption, share, seed
        )
        report = {**_report(prepared, metrics, settings), **extra}
    else:
        jobs: Sequence[traces.TraceJob] = prepared.jobs
        if estimates:
            model = memory.memory_model(jobs, seed)
            jobs = memory.with_estimates(jobs, model, rules)
        results = simulate(
            jobs,
            gpus=gpus,
            policy=policy,
            discipline=discipline,
            host=host,
            quota_table=quota_table,
            groups=groups,
            origin_s=prepared.origin_s,
        )
        report = _report(prepared, compute_metrics(results, gpus), settings)
        if model is None and any(j.gpu_mem_peak_bytes for j in jobs):
            report["overuse"] = _overuse_of_trace(jobs, results)
        if model is not None:
            report["estimates"] = asdict(memory.report(jobs, model, results))
            peaks = [m.peak_bytes for m in model]
            asks = [j.gpu_mem_bytes for j in jobs]
            report["estimates"]["overuse"] = asdict(overuse.count(asks, peaks, results))
    report["elapsed_s"] = time.perf_counter() - started_s
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _print_table(report)
        if model is not None:
            sys.stdout.write(estimates_text(report["estimates"]))
        elif "overuse" in report:
            sys.stdout.write(overuse_text(report["overuse"]))
    return 0


def _overuse_of_trace(jobs: Sequence[traces.TraceJob], results: Sequence[Any]) -> dict[str, Any]:
    """Over-use by the trace's own asks and peaks; a job with no peak recorded is taken to
    use what it asked for."""
    peaks = [j.gpu_mem_peak_bytes or j.gpu_mem_bytes or 0 for j in jobs]
    return asdict(overuse.count([j.gpu_mem_bytes for j in jobs], peaks, results))


def estimates_text(found: dict[str, Any]) -> str:
    """simulate --estimates, in words."""
    return (
        f"  with --gpu-mem auto: {found['estimated']} jobs estimated, "
        f"{found['whole_gpu']} on whole GPUs (no history yet, or as large as a GPU); "
        f"{found['shared_gpu']} shared a GPU; {found['would_oom']} would have run out of "
        f"GPU memory; memory asked {found['mem_asked_ratio'] * 100:.1f} % of whole GPUs\n"
        + overuse_text(found["overuse"])
    )


def overuse_text(found: dict[str, Any]) -> str:
    """simulate --estimates: who a neighbour's over-use would have killed, without and with
    enforcement (sim/overuse.py)."""
    before, after = found["before"], found["after"]
    return (
        f"  over-use: {found['over_users']} jobs above their --gpu-mem; "
        f"{found['collisions']} starts took a GPU past its memory\n"
        f"    not enforced: {before['within_promise']} died within their promise, "
        f"{before['over_users']} over it; {before['lost_gpu_hours']:.1f} GPU-h lost\n"
        f"    enforced:     {after['within_promise']} died within their promise, "
        f"{after['over_users']} over it stopped; {after['lost_gpu_hours']:.1f} GPU-h lost\n"
    )
