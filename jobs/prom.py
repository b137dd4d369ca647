"""Just enough Prometheus text exposition (format 0.0.4) for serve.py: counters, gauges, histograms."""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    escaped = (
        v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in pairs.values()
    )
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(pairs, escaped)) + "}"


class Counter:
    def __init__(self, name: str, help_text: str, label_names: tuple[str, ...] = ()):
        self.name, self.help_text, self.label_names = name, help_text, label_names
        self.values: dict[tuple[str, ...], float] = {}
        self.lock = threading.Lock()

    def inc(self, *label_values: str, amount: float = 1.0) -> None:
        with self.lock:
            self.values[label_values] = self.values.get(label_values, 0.0) + amount

    def render(self) -> list[str]:
        with self.lock:
            items = sorted(self.values.items())
        if not self.label_names and not items:
            items = [((), 0.0)]  # an unlabelled counter exists from the start
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} counter"]
        for label_values, value in items:
            labels = _labels(dict(zip(self.label_names, label_values)))
            lines.append(f"{self.name}{labels} {_number(value)}")
        return lines


class Gauge:
    """Read at scrape time from a callback, so it is never stale."""

    def __init__(self, name: str, help_text: str, read: Callable[[], float]):
        self.name, self.help_text, self.read = name, help_text, read

    def render(self) -> list[str]:
        return [
            f"# HELP {self.name} {self.help_text}",
            f"# TYPE {self.name} gauge",
            f"{self.name} {_number(self.read())}",
        ]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        self.name, self.help_text = name, help_text
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum, self.lock = 0.0, threading.Lock()

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)  # le: value <= bound
        with self.lock:
            self.counts[index] += 1
            self.sum += value

    def render(self) -> list[str]:
        with self.lock:
            counts, total_sum = list(self.counts), self.sum
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip(self.bounds + (math.inf,), counts):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {cumulative}')
        lines += [f"{self.name}_sum {_number(total_sum)}", f"{self.name}_count {cumulative}"]
        return lines


def render(metrics: list) -> str:
    return "\n".join(line for metric in metrics for line in metric.render()) + "\n"
