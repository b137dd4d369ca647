"""jobs/serve.py on the CPU: dynamic batching against --max-batch-size 1 in the same run.

Then a sweep of batch size x wait that picks the fastest pair within a p99 latency budget,
and optionally (--quantize) int8 dynamic quantization against float32. Each server is a
subprocess of its own; the clients are jobs/loadgen.py's threads in this process. Needs
torch (the project's `jobs` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from common import REPO_ROOT, interleaved, print_table, ratio

sys.path.insert(0, str(REPO_ROOT / "jobs"))
from loadgen import LoadResult, run_load

# An MLP of 17 M parameters: its forward pass for one request costs a few times what the
# Python HTTP side costs per request, as a real model's does; a batch reads the weights
# once for all its requests. A much smaller model leaves the HTTP side the bottleneck,
# and then batching cannot help (the model-only table shows the costs on this machine).
HIDDEN, LAYERS, FEATURES = 1024, 16, 64
MODEL_ARGS = (
    "--features",
    str(FEATURES),
    "--hidden",
    str(HIDDEN),
    "--layers",
    str(LAYERS),
    "--threads",
    "1",
)


class Server:
    """serve.py in a subprocess on a free port; stopped on exit."""

    def __init__(self, *args: str):
        self.args = args

    def __enter__(self) -> Server:
        self.dir = tempfile.TemporaryDirectory(prefix="bench-serve-")
        port_file = Path(self.dir.name) / "port"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO_ROOT / "jobs" / "serve.py"),
                "--port",
                "0",
                "--port-file",
                str(port_file),
                *MODEL_ARGS,
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"serve.py {' '.join(self.args)} did not start: "
                    f"{self.proc.stderr.read() if self.proc.poll() is not None else ''}"
                )
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"
        run_load(self.url, 4, 0.5, FEATURES)  # warm-up: first calls of each shape are slow
        return self

    def __exit__(self, *_exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.dir.cleanup()

    def load(self, clients: int, duration_s: float) -> LoadResult:
        result = run_load(self.url, clients, duration_s, FEATURES)
        if result.requests == 0:
            raise RuntimeError(f"no request succeeded against serve.py {' '.join(self.args)}")
        return result


def model_only(args: argparse.Namespace) -> None:
    """The forward pass alone, in this process, one thread: what batching can win at most."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # not needed
    import torch
    from serve import build_model

    torch.set_num_threads(1)
    model = build_model(FEATURES, HIDDEN, 10, LAYERS)
    rows, per_sample_ms = [], {}
    for batch in sorted({1, args.batch_size}):
        inputs = torch.randn(batch, FEATURES)
        with torch.inference_mode():
            model(inputs)
            times_s = []
            for _ in range(20):
                started_s = time.perf_counter()
                model(inputs)
                times_s.append(time.perf_counter() - started_s)
        per_sample_ms[batch] = statistics.median(times_s) * 1e3 / batch
        rows.append(
            (
                batch,
                f"{per_sample_ms[batch] * batch:.2f}",
                f"{per_sample_ms[batch]:.3f}",
                ratio(per_sample_ms[1], per_sample_ms[batch]),
            )
        )
    print_table(
        f"Model alone ({HIDDEN} wide, {LAYERS} layers), median of 20 forward passes",
        ("batch", "ms", "ms per request", "vs batch 1"),
        rows,
    )


def measure(
    args: argparse.Namespace, rounds: int, contenders: dict[str, tuple[str, ...]]
) -> dict[str, list[LoadResult]]:
    """Every contender's server up at once (an idle one costs nothing), loaded in turn,
    `rounds` times in alternating order, so that the machine's drift hits all alike."""
    results: dict[str, list[LoadResult]] = {name: [] for name in contenders}
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(Server(*flags)) for name, flags in contenders.items()}

        def one(name: str):
            def run() -> float:
                results[name].append(servers[name].load(args.clients, args.duration_s))
                return results[name][-1].throughput_rps

            return run

        interleaved(rounds, {name: one(name) for name in contenders})
    return results


def rps(results: list[LoadResult]) -> float:
    return statistics.median(r.throughput_rps for r in results)


def pct_ms(results: list[LoadResult], pct: float) -> float:
    return statistics.median(r.percentile_ms(pct) for r in results)


def flags(batch: int, wait_ms: float) -> tuple[str, ...]:
    return ("--max-batch-size", str(batch), "--max-wait-ms", str(wait_ms))


def batching_vs_none(args: argparse.Namespace) -> None:
    batched, single = f"batch {args.batch_size}, wait {args.wait_ms:g} ms", "no batching (batch 1)"
    results = measure(
        args, args.rounds, {batched: flags(args.batch_size, args.wait_ms), single: flags(1, 0.0)}
    )
    print_table(
        f"Throughput, {args.clients} clients, median of {args.rounds} x "
        f"{args.duration_s:g} s (interleaved)",
        ("server", "req/s", "p50 ms", "p99 ms", "vs batch 1"),
        [
            (
                name,
                f"{rps(r):.0f}",
                f"{pct_ms(r, 50):.1f}",
                f"{pct_ms(r, 99):.1f}",
                ratio(rps(r), rps(results[single])),
            )
            for name, r in results.items()
        ],
    )


def sweep(args: argparse.Namespace) -> tuple[int, float] | None:
    """The pair with the most requests/s whose median p99 stays within the budget."""
    pairs = {
        (batch, wait_ms): flags(batch, wait_ms)
        for batch in args.sweep_batch
        for wait_ms in (args.sweep_wait_ms if batch > 1 else (0.0,))
    }
    results = measure(args, args.sweep_rounds, {f"{b} {w:g}": f for (b, w), f in pairs.items()})
    by_pair = {pair: results[f"{pair[0]} {pair[1]:g}"] for pair in pairs}
    fitting = [pair for pair, r in by_pair.items() if pct_ms(r, 99) <= args.budget_ms]
    best = max(fitting, key=lambda pair: rps(by_pair[pair]), default=None)
    print_table(
        f"Sweep, {args.clients} clients, median of {args.sweep_rounds} x "
        f"{args.duration_s:g} s per pair, p99 budget {args.budget_ms:g} ms",
        ("batch", "wait ms", "req/s", "p50 ms", "p99 ms", "in budget", ""),
        [
            (
                b,
                f"{w:g}",
                f"{rps(r):.0f}",
                f"{pct_ms(r, 50):.1f}",
                f"{pct_ms(r, 99):.1f}",
                "yes" if (b, w) in fitting else "no",
                "<- best" if (b, w) == best else "",
            )
            for (b, w), r in by_pair.items()
        ],
    )
    if best is None:
        print(
            f"  no pair kept p99 within {args.budget_ms:g} ms; raise --budget-ms or lower --clients"
        )
        return None
    print(
        f"  best within budget: --max-batch-size {best[0]} --max-wait-ms {best[1]:g} "
        f"({rps(by_pair[best]):.0f} req/s)"
    )
    return best


def quantized(args: argparse.Namespace, batch: int, wait_ms: float) -> None:
    results = measure(
        args,
        args.rounds,
        {"float32": flags(batch, wait_ms), "int8 dynamic": (*flags(batch, wait_ms), "--quantize")},
    )
    print_table(
        f"Quantization at batch {batch}, wait {wait_ms:g} ms",
        ("model", "req/s", "p99 ms", "vs float32"),
        [
            (name, f"{rps(r):.0f}", f"{pct_ms(r, 99):.1f}", ratio(rps(r), rps(results["float32"])))
            for name, r in results.items()
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per pair")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--wait-ms", type=float, default=2.0)
    parser.add_argument("--budget-ms", type=float, default=150.0, help="p99 latency budget")
    parser.add_argument("--sweep-rounds", type=int, default=2, help="interleaved rounds per pair")
    parser.add_argument("--sweep-batch", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--sweep-wait-ms", type=float, nargs="+", default=[1.0, 2.0, 5.0])
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--quantize", action="store_true", help="also int8 against float32")
    parser.add_argument("--quick", action="store_true", help="a smoke run (about a minute)")
    args = parser.parse_args()
    if args.quick:
        args.duration_s, args.rounds, args.sweep_rounds = 2.0, 1, 1
        args.sweep_batch, args.sweep_wait_ms = [1, 8, 32], [2.0]
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # torch's NumPy notice, in each server
    model_only(args)
    batching_vs_none(args)
    best = None if args.no_sweep else sweep(args)
    if args.quantize:
        quantized(args, *(best or (args.batch_size, args.wait_ms)))


if __name__ == "__main__":
    main()
