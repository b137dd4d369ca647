"""Reading a /metrics scrape in tests: samples by name and labels, families by type and labels;
and a real daemon with running and pending jobs serving /metrics, shared by a test module."""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Home, wait_until

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing (Debian package `prometheus`; CI installs it)"
)
# A job that reports a quarter done, then waits to be cancelled.
PROGRESS_JOB = (
    "import time; from gpusched.job import progress; progress(0.25, 'warming up', "
    "min_interval_s=0); time.sleep(600)"
)
# What the served daemon's jobs are named and run: none of it may show up in a label.
SECRET_NAME, SECRET_ARG = "name-not-for-labels", "arg-not-for-labels"


class Scrape:
    """One scrape's text, parsed."""

    def __init__(self, text: str):
        self.text = text
        self.families = list(text_string_to_metric_families(text))

    def value(self, name: str, **labels: str) -> float | None:
        """The sample named (exposed name: with _total, _bucket...) whose labels include
        these; None when there is none."""
        for family in self.families:
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return sample.value
        return None

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [(s.labels, s.value) for f in self.families for s in f.samples if s.name == name]

    def shape(self, prefix: str = "gpusched_") -> dict[str, tuple[str, tuple[str, ...]]]:
        """Exposed family name (counters with _total) -> (type, its label names, le aside)."""
        out = {}
        for family in self.families:
            if not family.name.startswith(prefix):
                continue
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = sorted({k for s in family.samples for k in s.labels} - {"le"})
            out[name] = (family.type, tuple(labels))
        return out

    def series_names(self) -> set[str]:
        return {s.name for f in self.families for s in f.samples}


def scrape_registry(registry: Any) -> Scrape:
    return Scrape(generate_latest(registry).decode())


def metrics_url(home: Home) -> str:
    return json.loads(home.run("daemon", "status", "--json").stdout)["metrics"]


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=30) as response:
        return Scrape(response.read().decode())


def serving_home(root: Path, max_job_series: int = 64) -> tuple[Home, str]:
    """A daemon on 2 simulated GPUs serving /metrics on a free port, with two running jobs
    (one reporting progress) and one pending; the caller cleans the home up."""
    home = Home(root, "2x80GiB")
    home.write_config(f'[metrics]\nlisten = "127.0.0.1:0"\nmax_job_series = {max_job_series}\n')
    home.start()
    url = metrics_url(home)
    home.submit(
        "--gpus",
        "1",
        "--gpu-mem",
        "20GiB",
        "--name",
        SECRET_NAME,
        "--",
        sys.executable,
        "-c",
        PROGRESS_JOB,
        SECRET_ARG,
    )
    home.submit("--gpus", "1", "--", "sleep", "600")
    home.submit("--gpus", "2", "--", "sleep", "600")  # waits for both GPUs

    def settled() -> bool:
        m = scrape(url)
        return (
            m.value("gpusched_job_progress_ratio") is not None
            and m.value("gpusched_jobs", state="running") == 2
        )

    wait_until(settled, "two running jobs and one's progress in a scrape")
    return home, url
