"""`gpusched submit -- true` round trip on a warm daemon, against `tsp true` in the same run.

Each sample is the wall time of the real console script as a subprocess, from spawn to
exit. Before each sample the previous job is waited for (untimed), so the job's own
start-up does not compete with the client on a small machine. Timed alongside, for
contrast: `gpusched ls` through typer (GPUSCHED_NO_FAST_PATH=1), the same submit as a
wheel install would run it (when this checkout is installed editable), and a bare
interpreter start.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from common import (
    TSP,
    Gpusched,
    TaskSpooler,
    gpusched_script,
    interleaved,
    median_ms,
    plain_install_gpusched,
    print_table,
    ratio,
    script_python,
    timed_run,
    verdict,
)

TARGET_MS = 60.0


def submitter(gs: Gpusched, script: str) -> Callable[[], float]:
    def run() -> float:
        elapsed, out = timed_run([script, "submit", "--", "true"], gs.env)
        gs.wait([int(out)])
        return elapsed

    return run


def bare_start(gs: Gpusched, script: str) -> Callable[[], float]:
    """The script's interpreter doing nothing: the floor for any Python command line."""
    python = script_python(script)
    return lambda: timed_run([python, "-c", "pass"], gs.env)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="samples per command (default 50)")
    parser.add_argument("--ls-runs", type=int, default=15, help="samples of `ls` (default 15)")
    args = parser.parse_args()

    plain = plain_install_gpusched()
    with Gpusched() as gs, TaskSpooler() as ts:

        def ts_submit() -> float:
            elapsed, out = timed_run([TSP, "true"], ts.env)
            ts.cli("-w", out.strip())
            return elapsed

        contenders = {
            "gs": submitter(gs, gpusched_script()),
            "ts": ts_submit,
            "py": bare_start(gs, gpusched_script()),
        }
        if plain:
            contenders.update(plain=submitter(gs, plain), plain_py=bare_start(gs, plain))
        interleaved(3, contenders)  # fill the byte-code caches, untimed
        submit = interleaved(args.runs, contenders)
        listing = interleaved(
            args.ls_runs,
            {
                "gs": lambda: timed_run(
                    [gpusched_script(), "ls"], {**gs.env, "GPUSCHED_NO_FAST_PATH": "1"}
                )[0],
                "ts": lambda: timed_run([TSP, "-l"], ts.env)[0],
            },
        )

    gs_ms, ts_ms = median_ms(submit["gs"]), median_ms(submit["ts"])
    ls_ms, tsl_ms = median_ms(listing["gs"]), median_ms(listing["ts"])
    rows = [
        [
            "gpusched submit -- true",
            f"{gs_ms:.1f} ms",
            "tsp true",
            f"{ts_ms:.1f} ms",
            ratio(gs_ms, ts_ms),
            verdict(gs_ms, TARGET_MS),
        ]
    ]
    if plain:
        plain_ms = median_ms(submit["plain"])
        rows.append(
            [
                "  same, as a wheel install",
                f"{plain_ms:.1f} ms",
                "tsp true",
                f"{ts_ms:.1f} ms",
                ratio(plain_ms, ts_ms),
                verdict(plain_ms, TARGET_MS),
            ]
        )
    rows += [
        [
            "gpusched ls (typer path)",
            f"{ls_ms:.1f} ms",
            "tsp -l",
            f"{tsl_ms:.1f} ms",
            ratio(ls_ms, tsl_ms),
            "",
        ],
        ["python -c pass (the floor)", f"{median_ms(submit['py']):.1f} ms", "", "", "", ""],
    ]
    if plain:
        rows.append(
            [
                "  same, as a wheel install",
                f"{median_ms(submit['plain_py']):.1f} ms",
                "",
                "",
                "",
                "",
            ]
        )
    print_table(
        f"submit round trip, median wall time ({args.runs} runs each, interleaved)",
        ["command", "median", "peer", "peer median", "ratio", f"target <= {TARGET_MS:.0f} ms"],
        rows,
    )


if __name__ == "__main__":
    main()
