"""/metrics as a user meets it: `[metrics] listen` in the config, the address in `daemon
status`, a real scrape of a real daemon with running and pending jobs on simulated GPUs,
its names and labels frozen (a rename breaks users' dashboards and alerts), and
`promtool check metrics` on it."""

from __future__ import annotations

import json
import socket
import subprocess

import psutil
import pytest

from conftest import Home, wait_until
from metrics_scrape import (
    PROMTOOL,
    SECRET_ARG,
    SECRET_NAME,
    metrics_url,
    needs_promtool,
    scrape,
    serving_home,
)

pytestmark = pytest.mark.e2e

GPU = ("gpu", "uuid")
JOB = ("job_id", "user")
# Every gpusched_* family: (type, label names). Changing this is changing what users'
# dashboards and alert rules query: do it only on purpose, and say so in the changelog.
FROZEN = {
    "gpusched_gpu_info": ("gauge", ("driver_version", "gpu", "name", "pci_bus_id", "uuid")),
    "gpusched_gpus_detected": ("gauge", ()),
    "gpusched_gpu_up": ("gauge", GPU),
    "gpusched_gpu_memory_total_bytes": ("gauge", GPU),
    "gpusched_gpu_memory_used_bytes": ("gauge", GPU),
    "gpusched_gpu_memory_reserved_bytes": ("gauge", GPU),
    "gpusched_gpu_memory_outside_bytes": ("gauge", GPU),
    "gpusched_gpu_jobs_running": ("gauge", GPU),
    "gpusched_gpu_utilization_ratio": ("gauge", GPU),
    "gpusched_gpu_temperature_celsius": ("gauge", GPU),
    "gpusched_gpu_power_draw_watts": ("gauge", GPU),
    "gpusched_gpu_power_limit_watts": ("gauge", GPU),
    "gpusched_jobs": ("gauge", ("state",)),
    "gpusched_user_jobs": ("gauge", ("state", "user")),
    "gpusched_queue_oldest_pending_submit_timestamp_seconds": ("gauge", ()),
    "gpusched_draining": ("gauge", ()),
    "gpusched_jobs_submitted_total": ("counter", ()),
    "gpusched_jobs_started_total": ("counter", ()),
    "gpusched_jobs_ended_total": ("counter", ("state",)),
    "gpusched_job_wait_seconds": ("histogram", ()),
    "gpusched_job_run_seconds": ("histogram", ()),
    "gpusched_job_gpus": ("gauge", JOB),
    "gpusched_job_gpu_assignment": ("gauge", ("gpu", "job_id", "user", "uuid")),
    "gpusched_job_gpu_memory_requested_bytes": ("gauge", JOB),
    "gpusched_job_gpu_memory_used_bytes": ("gauge", JOB),
    "gpusched_job_progress_ratio": ("gauge", JOB),
    "gpusched_job_start_timestamp_seconds": ("gauge", JOB),
    "gpusched_job_gpu_idle_seconds": ("gauge", ()),  # no idle job here: tests/test_memlearn_e2e.py
    "gpusched_jobs_gpu_idle": ("gauge", ()),
    "gpusched_jobs_gpu_mem_over": ("gauge", ()),
    "gpusched_metrics_job_series_dropped": ("gauge", ()),
    "gpusched_build_info": ("gauge", ("backend", "version")),
    "gpusched_daemon_start_timestamp_seconds": ("gauge", ()),
    "gpusched_loop_lag_seconds": ("gauge", ()),
    "gpusched_nvml_up": ("gauge", ()),
    "gpusched_nvml_reads_total": ("counter", ()),
    "gpusched_nvml_read_errors_total": ("counter", ()),
    "gpusched_nvml_last_read_timestamp_seconds": ("gauge", ()),
    "gpusched_store_writes_failing": ("gauge", ()),
    "gpusched_metrics_scrape_duration_seconds": ("gauge", ()),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(home, url): a daemon serving /metrics, two jobs running and one pending."""
    home, url = serving_home(tmp_path_factory.mktemp("metrics") / "home")
    yield home, url
    home.cleanup()


def test_daemon_status_shows_where_metrics_are_served(served):
    home, url = served
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert f"metrics: {url}" in home.run("daemon", "status").stdout.splitlines()


def test_metric_names_and_labels_are_frozen(served):
    shape = scrape(served[1]).shape()
    assert shape == FROZEN


def test_no_created_series_and_no_label_named_job(served):
    m = scrape(served[1])
    assert not [name for name in m.series_names() if name.endswith("_created")]
    labels = {k for f in m.families for s in f.samples for k in s.labels}
    assert "job" not in labels  # Prometheus's own target label: it would be renamed


def test_no_job_name_or_command_in_any_label(served):
    m = scrape(served[1])
    values = {v for f in m.families for s in f.samples for v in s.labels.values()}
    assert not [v for v in values if SECRET_NAME in v or SECRET_ARG in v or "sleep" in v]


def test_the_queue_running_jobs_and_gpus_as_scraped(served):
    home, url = served
    m = scrape(url)
    jobs = {j["id"]: j for j in home.jobs()}
    running = sorted(i for i, j in jobs.items() if j["state"] == "running")
    assert len(running) == 2 and m.value("gpusched_jobs", state="running") == 2
    assert m.value("gpusched_jobs", state="pending") == 1
    assert m.value("gpusched_jobs_ended_total", state="lost") == 0  # each final state: 0
    pending = [j for j in jobs.values() if j["state"] == "pending"]
    assert m.value("gpusched_queue_oldest_pending_submit_timestamp_seconds") == pytest.approx(
        pending[0]["submitted_at"]
    )
    first = str(running[0])
    assert m.value("gpusched_job_progress_ratio", job_id=first) == 0.25
    assert m.value("gpusched_job_gpu_memory_requested_bytes", job_id=first) == 20 * 2**30
    assert {labels["job_id"] for labels, _ in m.samples("gpusched_job_gpus")} == {
        str(i) for i in running
    }
    assert [v for _, v in m.samples("gpusched_gpu_up")] == [1.0, 1.0]
    assert m.value("gpusched_gpu_memory_total_bytes", gpu="0") == 80 * 2**30
    assert m.value("gpusched_metrics_job_series_dropped") == 0


@needs_promtool
def test_promtool_check_metrics_passes_on_a_real_scrape(served):
    text = scrape(served[1]).text
    check = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert (check.returncode, check.stdout, check.stderr) == (0, "", "")


@needs_promtool
def test_promtool_flags_what_the_naming_rules_forbid():
    """The check above can fail: promtool does object to names in MiB and bare counters."""
    bad = (
        "# HELP gpu_memory_used_MiB x\n# TYPE gpu_memory_used_MiB gauge\n"
        "gpu_memory_used_MiB 1\n# HELP jobs_started x\n# TYPE jobs_started counter\n"
        "jobs_started 1\n"
    )
    check = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60
    )
    assert check.returncode != 0


def test_metrics_are_off_unless_configured(home):
    home.start()
    assert json.loads(home.run("daemon", "status", "--json").stdout)["metrics"] == "off"
    assert "metrics: off" in home.run("daemon", "status").stdout


def test_a_taken_port_leaves_the_daemon_running_and_says_why(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home.write_config(f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
        home.start()
        status = metrics_url(home)
        assert status.startswith(f"not served: cannot listen on 127.0.0.1:{port}: ")
        assert "Set [metrics] listen to a free port" in status
        job = home.submit("--", "true")  # the queue works all the same
        assert home.wait_state(job, "succeeded")


@pytest.mark.parametrize(
    "listen", ['"19400"', '"localhost:"', '"127.0.0.1:99999"', '"host:port"', "19400"]
)
def test_a_bad_listen_address_is_one_line_naming_the_key(home: Home, listen: str):
    home.write_config(f"[metrics]\nlisten = {listen}\n")
    proc = home.run("daemon", "start", check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert "metrics.listen" in lines[0] and "127.0.0.1:19400" in lines[0]


def test_many_idle_connections_make_no_more_threads_than_the_bound(served):
    # Each connection held a thread of its own: 4,000 idle ones made 4,000 threads.
    from gpusched.daemon.observe.metricserver import MAX_CONNECTIONS

    home, url = served
    daemon = psutil.Process(home.daemon_pid())
    threads_before = daemon.num_threads()
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(300)]
    seen = [daemon.num_threads()]

    def answered():
        seen.append(daemon.num_threads())
        try:
            return scrape(url)
        except OSError:  # every connection it holds is taken: the idle ones go soon
            return None

    try:
        assert wait_until(answered, "a scrape once the idle connections are closed")
        # (A few of the daemon's own threads may come and go meanwhile.)
        assert max(seen) <= threads_before + MAX_CONNECTIONS + 8
        # Those over the bound are closed at once, the rest once idle for a while.
        assert all(sock.recv(1) == b"" for sock in idle)
    finally:
        for sock in idle:
            sock.close()
