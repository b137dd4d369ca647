"""The daemon loop's longest turn while a 100,000-element array is submitted and then
cancelled, against the turn of one small submit in the same run (issue 14: <= 100 ms).

The real loop (Daemon.step), request handlers and SQLite store, in this process, on a
temporary home with simulated GPUs; the elements are held, so nothing starts. Each turn
is timed from outside, as a request waiting behind it would see it. Also printed: the
same submit and cancel done in one turn, as before batches (batches.BIG_JOBS raised).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import REPO_ROOT, print_table, verdict  # noqa: F401 - REPO_ROOT puts the repo on the path

from gpusched.client.paths import ensure_private_dir, resolve_paths
from gpusched.core.config import load_settings
from gpusched.daemon.loop import Call, Daemon
from gpusched.daemon.requests import batches
from gpusched.daemon.requests.request import Request
from gpusched.gpus import open_backend
from gpusched.store.database import Store

TARGET_MS = 100.0
ME = (1, 0, 0)


def new_daemon(root: Path) -> Daemon:
    paths = resolve_paths({"GPUSCHED_HOME": str(root)})
    ensure_private_dir(paths.state_dir)
    settings = load_settings(paths.config_file, environ={})
    daemon = Daemon(paths, settings, open_backend("4x80GiB", paths.sim_processes))
    daemon.attach(Store(paths.db))
    daemon.take_over()
    return daemon


def array_args(root: Path, elements: int) -> dict:
    return {
        "jobs": [
            {
                "command": ["true"],
                "name": "",
                "gpus": 0,
                "gpu_mem_bytes": None,
                "priority": 0,
                "hold": True,
                "array": {"indices": list(range(elements)), "throttle": None},
            }
        ],
        "env": {"PATH": "/usr/bin:/bin", "HOME": str(root)},
        "cwd": str(root),
    }


def turns_of(daemon: Daemon, name: str, args: dict) -> tuple[list[float], dict]:
    """Each loop turn's seconds until the request is answered, and its result."""
    call = Call(Request(name, args, ME))
    turns, calls = [], [call]
    while not call.done.is_set():
        started = time.perf_counter()
        daemon.step(calls)
        turns.append(time.perf_counter() - started)
        calls = []
    assert call.error is None, call.error
    return turns, call.result


def one_run(elements: int, batched: bool) -> dict[str, float]:
    saved = batches.BIG_JOBS
    batches.BIG_JOBS = saved if batched else 10**9
    try:
        with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
            root = Path(tmp)
            daemon = new_daemon(root)
            small, _ = turns_of(daemon, "submit", array_args(root, 1))
            started = time.perf_counter()
            sub, result = turns_of(daemon, "submit", array_args(root, elements))
            sub_s = time.perf_counter() - started
            started = time.perf_counter()
            cancel, _ = turns_of(daemon, "cancel", {"ids": [result["array_ids"][0]]})
            cancel_s = time.perf_counter() - started
            daemon.state.store.close()
            return {
                "small": max(small),
                "submit_turn": max(sub),
                "submit_s": sub_s,
                "submit_turns": len(sub),
                "cancel_turn": max(cancel),
                "cancel_s": cancel_s,
                "cancel_turns": len(cancel),
            }
    finally:
        batches.BIG_JOBS = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--skip-unbatched",
        action="store_true",
        help="do not time the one-turn submit and cancel (slow)",
    )
    opts = parser.parse_args()
    rows = []
    for batched in (True, False):
        if not batched and opts.skip_unbatched:
            continue
        runs = [one_run(opts.elements, batched) for _ in range(opts.runs)]
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        label = "in batches" if batched else "one turn (before)"
        longest = max(med["submit_turn"], med["cancel_turn"]) * 1e3
        rows.append(
            [
                label,
                f"{med['small'] * 1e3:.1f}",
                f"{med['submit_turn'] * 1e3:.1f}",
                f"{med['submit_s']:.1f}",
                int(med["submit_turns"]),
                f"{med['cancel_turn'] * 1e3:.1f}",
                f"{med['cancel_s']:.1f}",
                int(med["cancel_turns"]),
                f"{longest / (med['small'] * 1e3):.0f}x",
                verdict(longest, TARGET_MS) if batched else "-",
            ]
        )
    print_table(
        f"Longest loop turn, {opts.elements:,}-element held array: submit, then "
        f"cancel (median of {opts.runs} runs; target <= {TARGET_MS:.0f} ms)",
        [
            "how",
            "1-job submit ms",
            "submit: longest turn ms",
            "submit s",
            "turns",
            "cancel: longest turn ms",
            "cancel s",
            "turns",
            "longest / 1-job",
            "verdict",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
