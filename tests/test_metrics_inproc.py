"""/metrics figures from the daemon's own decisions (tests/inproc.py: the real loop, handlers
and store, a clock the test moves): counters and histograms fed at each transition, GPUs
lost and NVML failing, the per-job cap, and a scrape that touches neither NVML nor SQLite."""

from __future__ import annotations

import pytest

from fake_nvml import FakeDriver, fake_nvml, make_gpu
from gpusched.core.errors import StoreWriteError
from gpusched.core.models import Inventory
from gpusched.daemon.observe.metrics import make_registry
from gpusched.daemon.observe.telemetry import END_STATES
from gpusched.gpus.nvml import NvmlBackend
from inproc import Box
from metrics_scrape import Scrape, scrape_registry

__all__ = ["fake_nvml"]  # the fixture, imported so that pytest finds it here


def scrape_box(box: Box) -> Scrape:
    return scrape_registry(make_registry(box.daemon.state, box.daemon.setup))


def test_starts_and_ends_are_counted_by_final_state(make_box):
    box = make_box("1x80GiB")
    first, second, third = (box.submit("--gpus", "1", "--", "true") for _ in range(3))
    box.step()
    box.call("cancel", ids=[third])  # while it waits
    box.exit(first, 0, seconds=100)
    box.step(20)
    box.exit(second, 1, seconds=50)
    m = scrape_box(box)
    started = m.value("gpusched_jobs_started_total")
    assert m.value("gpusched_jobs_submitted_total") == 3
    assert {s: m.value("gpusched_jobs_ended_total", state=s) for s in END_STATES} == {
        **dict.fromkeys(END_STATES, 0.0),
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
    }
    assert m.value("gpusched_job_wait_seconds_count") == started
    # Every job that started has ended; a job cancelled before it started has no run time.
    assert m.value("gpusched_job_run_seconds_count") == started
    assert (
        m.value("gpusched_jobs", state="running") == m.value("gpusched_jobs", state="pending") == 0
    )


def test_wait_and_run_times_are_the_clock_s(make_box):
    box = make_box("1x80GiB")
    first = box.submit("--gpus", "1", "--", "true")
    second = box.submit("--gpus", "1", "--", "true")
    box.step()
    box.exit(first, 0, seconds=100)
    box.step()
    box.exit(second, 0, seconds=40)
    m = scrape_box(box)
    assert m.value("gpusched_job_wait_seconds_sum") == pytest.approx(100.0)
    assert m.value("gpusched_job_wait_seconds_count") == 2
    assert m.value("gpusched_job_wait_seconds_bucket", le="1.0") == 1
    assert m.value("gpusched_job_wait_seconds_bucket", le="120.0") == 2
    assert m.value("gpusched_job_run_seconds_sum") == pytest.approx(140.0)
    assert m.value("gpusched_job_run_seconds_bucket", le="60.0") == 1
    assert m.value("gpusched_job_run_seconds_bucket", le="+Inf") == 2


def test_a_retry_is_another_start_but_not_another_wait_or_end(make_box):
    box = make_box("1x80GiB")
    job = box.submit("--retries", "1", "--retry-delay", "0", "--gpus", "1", "--", "false")
    box.step()
    box.exit(job, 1, seconds=30)  # failed: queued again
    box.step()
    assert box.running() == {job}
    m = scrape_box(box)
    assert m.value("gpusched_jobs_started_total") == 2
    assert m.value("gpusched_job_wait_seconds_count") == 1
    assert m.value("gpusched_jobs_ended_total", state="failed") == 0
    assert m.value("gpusched_job_run_seconds_count") == 0
    box.exit(job, 1, seconds=20)
    m = scrape_box(box)
    assert m.value("gpusched_jobs_ended_total", state="failed") == 1
    assert m.value("gpusched_job_run_seconds_sum") == pytest.approx(20.0)


def test_every_queue_state_is_present_and_counted_by_user(make_box):
    box = make_box("1x80GiB")
    m = scrape_box(box)
    assert (
        m.value("gpusched_jobs", state="pending") == m.value("gpusched_jobs", state="running") == 0
    )
    assert m.samples("gpusched_user_jobs") == []
    assert m.value("gpusched_queue_oldest_pending_submit_timestamp_seconds") is None
    running = box.submit("--gpus", "1", "--", "true")
    box.step(5)
    held = box.submit("--hold", "--gpus", "1", "--", "true")
    box.step(5)
    waiting = box.submit("--gpus", "1", "--", "true")
    box.step()
    m = scrape_box(box)
    assert box.running() == {running}
    assert m.value("gpusched_jobs", state="pending") == 2
    assert m.value("gpusched_user_jobs", state="pending") == 2
    assert m.value("gpusched_user_jobs", state="running") == 1
    # A job on hold is not what makes a queue look stuck.
    assert (
        m.value("gpusched_queue_oldest_pending_submit_timestamp_seconds")
        == box.show(waiting)["submitted_at"]
        != box.show(held)["submitted_at"]
    )


def test_per_job_series_are_capped_and_the_rest_counted(make_box):
    box = make_box("4x80GiB", "[metrics]\nmax_job_series = 2\n")
    ids = [box.submit("--gpus", "1", "--gpu-mem", "10GiB", "--", "true") for _ in range(3)]
    ids.append(box.submit("--gpus", "1", "--", "true"))  # a whole GPU
    box.step()
    assert box.running() == set(ids)
    m = scrape_box(box)
    shown = {labels["job_id"] for labels, _ in m.samples("gpusched_job_gpus")}
    assert shown == {str(ids[0]), str(ids[1])}
    assert m.value("gpusched_metrics_job_series_dropped") == 2
    assert m.value("gpusched_job_gpu_memory_requested_bytes", job_id=str(ids[0])) == 10 * 2**30
    assignment = m.samples("gpusched_job_gpu_assignment")
    gpu_of = {labels["job_id"]: (labels["gpu"], labels["uuid"]) for labels, _ in assignment}
    info = {(labels["gpu"], labels["uuid"]) for labels, _ in m.samples("gpusched_gpu_info")}
    assert set(gpu_of.values()) <= info  # the join from jobs to GPUs holds


def test_a_lost_gpu_stays_at_zero_under_its_uuid(make_box, fake_nvml):
    gpus = [make_gpu("H100", 0), make_gpu("H100", 1)]
    lost = gpus[1]
    driver = FakeDriver(gpus=list(gpus))
    fake_nvml(driver)
    box = make_box("1x80GiB")
    daemon = box.daemon
    daemon.backend = NvmlBackend()
    daemon.read_gpus()
    m = scrape_box(box)
    assert [v for _, v in m.samples("gpusched_gpu_up")] == [1.0, 1.0]
    assert m.value("gpusched_nvml_read_errors_total") == 0
    lost.is_lost = True  # fallen off the bus: NVML cannot even name it now
    daemon.read_gpus()
    m = scrape_box(box)
    assert m.value("gpusched_gpu_up", gpu="1", uuid=lost.uuid) == 0
    assert m.value("gpusched_gpu_up", gpu="0", uuid=gpus[0].uuid) == 1
    assert m.value("gpusched_nvml_read_errors_total") == 1
    assert m.value("gpusched_gpu_memory_used_bytes", gpu="1") is None
    del driver.gpus[1]  # and then gone from the list
    daemon.read_gpus()
    m = scrape_box(box)
    assert m.value("gpusched_gpu_up", gpu="1", uuid=lost.uuid) == 0
    assert m.value("gpusched_gpus_detected") == 1
    daemon.backend.close()


def test_a_failing_gpu_read_shows_as_nvml_down_and_counts(make_box, monkeypatch):
    box = make_box("2x80GiB")
    box.step(1)
    good = scrape_box(box)
    read_at = good.value("gpusched_nvml_last_read_timestamp_seconds")
    assert read_at == box.clock.time() - 1 and good.value("gpusched_nvml_up") == 1

    def broken(running=()):
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(box.daemon.backend, "read", broken)
    box.clock.advance(5)
    box.daemon.read_gpus()
    m = scrape_box(box)
    assert m.value("gpusched_nvml_up") == 0
    assert m.value("gpusched_nvml_read_errors_total") == 1
    assert m.value("gpusched_nvml_reads_total") == good.value("gpusched_nvml_reads_total") + 1
    assert m.value("gpusched_nvml_last_read_timestamp_seconds") == read_at
    assert [v for _, v in m.samples("gpusched_gpu_up")] == [0.0, 0.0]


class _Untouchable:
    """Stands in for the store and the GPU backend during a scrape: any use fails."""

    def __getattr__(self, name: str):
        raise AssertionError(f"a scrape used {name}")


def test_a_scrape_calls_neither_nvml_nor_sqlite(make_box, monkeypatch):
    box = make_box("2x80GiB")
    for _ in range(3):
        box.submit("--gpus", "1", "--", "true")
    box.step()
    registry = make_registry(box.daemon.state, box.daemon.setup)
    monkeypatch.setattr(box.daemon.state, "store", _Untouchable())
    monkeypatch.setattr(box.daemon, "backend", _Untouchable())
    m = scrape_registry(registry)
    assert m.value("gpusched_jobs", state="running") == 2
    assert m.value("gpusched_jobs", state="pending") == 1


def test_loop_lag_is_how_long_the_current_turn_has_run(make_box):
    box = make_box("1x80GiB")
    telemetry = box.daemon.state.telemetry
    assert scrape_box(box).value("gpusched_loop_lag_seconds") == 0
    with telemetry.turn(box.clock.monotonic):
        box.clock.advance(7.5)  # a slow pass: a scrape from another thread sees it
        assert scrape_box(box).value("gpusched_loop_lag_seconds") == 7.5
    assert scrape_box(box).value("gpusched_loop_lag_seconds") == 0


def test_a_failed_write_counts_nothing(make_box):
    box = make_box("1x80GiB")
    with box.failing_writes():
        with pytest.raises(StoreWriteError):
            box.submit("--gpus", "1", "--", "true")
    m = scrape_box(box)
    assert m.value("gpusched_jobs_submitted_total") == 0
    assert m.value("gpusched_jobs", state="pending") == 0


def test_an_unset_listen_serves_nothing(make_box):
    box = make_box("1x80GiB")
    assert box.call("status")["metrics"] == "off"


def test_the_nvml_problem_inventory_is_not_a_gpu(make_box):
    box = make_box("1x80GiB")
    box.daemon.state.note_gpus(Inventory(backend="nvml", problem="NVML is not loaded"), {}, 0.0)
    m = scrape_box(box)
    assert m.value("gpusched_nvml_up") == 0
    assert m.value("gpusched_gpus_detected") == 0
