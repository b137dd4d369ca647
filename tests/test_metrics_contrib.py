"""The shipped Grafana dashboard and Prometheus alert rules (contrib/): they import as they
are, query only series a real daemon serves, and the rules pass promtool's checks and their
unit tests (one file per rule)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from metrics_scrape import PROMTOOL, needs_promtool, scrape, serving_home

DASHBOARD = REPO / "contrib" / "grafana" / "gpusched.json"
ALERTS = REPO / "contrib" / "prometheus" / "gpusched-alerts.yml"
ALERT_TESTS = REPO / "contrib" / "prometheus" / "tests"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The series Prometheus itself adds, which no gpusched scrape has.
PROMETHEUS_OWN = {"up"}


@pytest.fixture(scope="module")
def served_series(tmp_path_factory) -> set[str]:
    """Every series name in a real scrape of a daemon with running and pending jobs."""
    home, url = serving_home(tmp_path_factory.mktemp("contrib") / "home")
    try:
        yield scrape(url).series_names()
    finally:
        home.cleanup()


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def alert_rules() -> dict[str, str]:
    """Alert name -> its expression, as the rules file writes them."""
    text = ALERTS.read_text(encoding="utf-8")
    blocks = text.split("- alert: ")[1:]
    return {b.split()[0]: b.split("expr:", 1)[1].split("for:", 1)[0] for b in blocks}


def series_in(expr: str) -> set[str]:
    """gpusched series an expression reads (a metric name, not a label name)."""
    return set(re.findall(r"\b(gpusched_[a-z_]+)\b(?!\s*[=~!])", expr))


def test_the_dashboard_imports_as_is_with_a_datasource_variable():
    model = dashboard()
    text = DASHBOARD.read_text(encoding="utf-8")
    assert "__inputs" not in model and "DS_PROMETHEUS" not in text  # breaks provisioning
    assert "id" not in model and model["uid"] == "gpusched" and model["schemaVersion"] >= 37
    variables = model["templating"]["list"]
    assert [v["name"] for v in variables if v["type"] == "datasource"] == ["datasource"]
    assert {v["name"]: v["allValue"] for v in variables if v["type"] == "query"} == {
        "job": ".+",
        "instance": ".+",
    }
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        where = panel["title"]
        assert panel["description"] and panel["fieldConfig"]["defaults"]["unit"], where
        assert panel["datasource"] == DATASOURCE, where
        assert panel["targets"] and all(t["datasource"] == DATASOURCE for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, where


def test_every_query_picks_the_job_and_instance_and_a_rate_interval():
    for expr in dashboard_exprs():
        for selector in re.findall(r"gpusched_[a-z_]+\{([^}]*)\}", expr):
            assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, expr
        windows = re.findall(r"\[([^\]]+)\]", expr)
        assert all(w in ("$__rate_interval", "1h") for w in windows), expr


def test_the_dashboard_shows_what_the_issue_lists():
    queried = set().union(*map(series_in, dashboard_exprs()))
    assert {
        "gpusched_gpu_memory_used_bytes",
        "gpusched_gpu_memory_reserved_bytes",
        "gpusched_gpu_memory_total_bytes",
        "gpusched_gpu_utilization_ratio",
        "gpusched_jobs",
        "gpusched_job_wait_seconds_bucket",
        "gpusched_user_jobs",
        "gpusched_job_gpu_memory_used_bytes",
        "gpusched_job_gpu_memory_requested_bytes",
        "gpusched_loop_lag_seconds",
        "gpusched_nvml_up",
    } <= queried


@pytest.mark.e2e
def test_every_series_the_dashboard_queries_is_in_a_real_scrape(served_series):
    queried = set().union(*map(series_in, dashboard_exprs()))
    assert queried and queried - served_series == set()


@pytest.mark.e2e
def test_every_series_the_alerts_query_is_in_a_real_scrape(served_series):
    queried = set().union(*map(series_in, alert_rules().values()))
    assert queried and queried - served_series - PROMETHEUS_OWN == set()


def test_the_alerts_cover_what_the_issue_lists():
    assert set(alert_rules()) == {
        "GpuschedDown",
        "GpuschedNvmlFailing",
        "GpuschedGpuReadsStale",
        "GpuschedGpuLost",
        "GpuschedGpuMemoryHeldOutside",
        "GpuschedJobOverMemoryRequest",
        "GpuschedJobGpuIdle",
        "GpuschedOldestPendingJobTooOld",
        "GpuschedJobWaitP95High",
    }


def test_every_alert_has_a_unit_test_file_that_fires_it_and_keeps_it_quiet():
    for name in alert_rules():
        test = ALERT_TESTS / f"{name}.test.yml"
        assert test.exists(), f"no unit tests for {name}: write {test.name}"
        text = test.read_text(encoding="utf-8")
        assert f"alertname: {name}" in text and "exp_alerts: []" in text
        assert "exp_labels:" in text and "exp_annotations:" in text
    assert {p.name for p in ALERT_TESTS.glob("*.test.yml")} == {
        f"{name}.test.yml" for name in alert_rules()
    }


@pytest.mark.e2e
@needs_promtool
def test_promtool_checks_the_alert_rules():
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in check.stdout


@pytest.mark.e2e
@needs_promtool
def test_promtool_runs_every_alert_s_unit_tests():
    files = sorted(str(p) for p in ALERT_TESTS.glob("*.test.yml"))
    run = subprocess.run(
        [PROMTOOL, "test", "rules", *files], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("SUCCESS") == len(files)


@pytest.mark.e2e
@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path):
    """Each query as a recording rule (the variables given values), for promtool to parse."""
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, expr in enumerate(dashboard_exprs()):
        concrete = (
            expr.replace("$__rate_interval", "5m").replace("$job", ".+").replace("$instance", ".+")
        )
        lines += [f"      - record: dashboard:query{i}", f"        expr: {json.dumps(concrete)}"]
    rules = tmp_path / "dashboard-rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
