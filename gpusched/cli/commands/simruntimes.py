"""`gpusched simulate --runtimes predicted` and `--forecast`: their checks, their replay
(sim/runtimesim.py) and their report; every other replay is simulate.py's."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpusched.cli.commands.simulate import _print_table, _report, simulate_command
from gpusched.core.errors import UsageError
from gpusched.sim import runtimesim, traces
from gpusched.sim.simulator import check_choices, compute_metrics

# The options these replays do without, and their values when not given.
_WITHOUT = {
    "cpus": ("--cpus", None),
    "mem": ("--mem", None),
    "preemption": ("--preemption", False),
    "high_priority_share": ("--high-priority-share", None),
    "estimates": ("--estimates", False),
    "config": ("--config", None),
    "reserved": ("--reservations", ()),
}


def simulate(trace: Path, *, runtimes: str, forecast: bool, **options: Any) -> int:
    """`gpusched simulate`: with predicted runtimes or forecasts here, else simulate.py's."""
    if runtimes not in runtimesim.RUNTIMES:
        raise UsageError(f"--runtimes {runtimes!r}: choose one of {', '.join(runtimesim.RUNTIMES)}")
    if runtimes == "true" and not forecast:
        return simulate_command(trace, **options)
    given = [flag for key, (flag, unset) in _WITHOUT.items() if options.get(key, unset) != unset]
    given += ["--discipline las"] if options["discipline"] == "las" else []
    if given:
        raise UsageError(
            "--runtimes predicted and --forecast replay GPUs only, without priorities, "
            f"preemption or quotas; leave out {', '.join(given)}"
        )
    gpus, discipline, arrivals = options["gpus"], options["discipline"], options["arrivals"]
    rules = check_choices(gpus, options["policy"], discipline)  # before reading a large file
    started_s = time.perf_counter()
    prepared = traces.prepare(
        trace, gpus=gpus, load=options["load"], arrivals=arrivals, seed=options["seed"]
    )
    results, found = runtimesim.replay(
        prepared.jobs,
        gpus=gpus,
        rules=rules,
        discipline=discipline,
        predicted=runtimes == "predicted",
        with_forecast=forecast,
    )
    settings = {
        **{key: options[key] for key in ("gpus", "policy", "discipline", "load", "arrivals")},
        **dict.fromkeys(("cpus", "mem", "config")),
        "seed": options["seed"] if arrivals == "poisson" else None,
        "runtimes": runtimes,
    }
    report = _report(prepared, compute_metrics(results, gpus), settings)
    report.update({"forecast": asdict(found)} if found else {})
    report["elapsed_s"] = time.perf_counter() - started_s
    if options["as_json"]:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return 0
    _print_table(report)
    sys.stdout.write(f"  runtimes: {runtimes}\n" + (forecast_text(found) if found else ""))
    return 0


def forecast_text(found: runtimesim.ForecastReport) -> str:
    """simulate --forecast, in words."""
    return (
        f"  start forecasts, over the {found.jobs} jobs that waited "
        f"{runtimesim.WAITED_S:g} s or more: median error "
        f"{found.median_error_share * 100:.1f} % of the real wait; real start within "
        f"the 80 % interval {found.within_interval * 100:.1f} %; no forecast "
        f"{found.unknown}\n"
    )
