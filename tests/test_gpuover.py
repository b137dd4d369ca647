"""GPU memory promises kept: the pure rules (core/sched/gpupromise.py), then the daemon's
acts in process (tests/inproc.py) on simulated GPUs: report, stop and requeue a job that
uses more than its --gpu-mem on a GPU it shares, and a spiky neighbour counted at its peak."""

from __future__ import annotations

import signal
from dataclasses import replace

from gpusched.core.models import GpuInfo, GpuProcess, Inventory, Job, JobState, Request
from gpusched.core.sched import gpupromise, placement
from gpusched.daemon.observe.notify import events_of

GIB = 2**30


def _gpu(uuid: str, *procs: tuple[int, int], total: int = 80 * GIB) -> GpuInfo:
    return GpuInfo(
        index=int(uuid[-1]),
        uuid=uuid,
        name="GPU",
        mem_total_bytes=total,
        mem_used_bytes=sum(used for _, used in procs),
        processes=tuple(GpuProcess(pid=pid, gpu_uuid=uuid, used_mem_bytes=u) for pid, u in procs),
    )


def _job(job_id: int, gpu_mem: int | None, *uuids: str) -> Job:
    return Job(
        id=job_id,
        command=("train",),
        cwd="/",
        uid=0,
        user="u",
        request=Request(gpus=len(uuids), gpu_mem_bytes=gpu_mem),
        state=JobState.RUNNING,
        gpu_uuids=uuids,
    )


def _judge(gpus: list[GpuInfo], jobs: list[Job], margin: float = 10, floor: int = GIB) -> list:
    pid_jobs = {100 + job.id: job.id for job in jobs}
    return gpupromise.over_promise(Inventory(gpus=tuple(gpus)), jobs, pid_jobs, margin, floor)


# -- the rules ------------------------------------------------------------------------------
def test_a_job_past_its_gpu_mem_plus_margin_on_a_shared_gpu_is_over():
    a, b = _job(1, 10 * GIB, "g0"), _job(2, 60 * GIB, "g0")
    (over,) = _judge([_gpu("g0", (101, 30 * GIB), (102, 40 * GIB))], [a, b])
    assert (over.job_id, over.is_under_floor) == (1, False)
    assert over.text == "used 30.0 GiB of GPU 0, asked for 10.0 GiB"


def test_within_the_margin_alone_or_on_whole_gpus_no_job_is_over():
    shared = _gpu("g0", (101, 10 * GIB + GIB // 2), (102, 10 * GIB))
    assert _judge([shared], [_job(1, 10 * GIB, "g0"), _job(2, 60 * GIB, "g0")]) == []
    alone = _gpu("g0", (101, 30 * GIB))
    assert _judge([alone], [_job(1, 10 * GIB, "g0")]) == []  # it harms nobody there
    whole = _gpu("g0", (101, 70 * GIB), (999, GIB))  # a whole-GPU job is never judged
    assert _judge([whole], [_job(1, None, "g0")]) == []


def test_an_outside_process_makes_the_gpu_shared():
    gpu = _gpu("g0", (101, 30 * GIB), (999, 5 * GIB))
    assert [o.job_id for o in _judge([gpu], [_job(1, 10 * GIB, "g0")])] == [1]


def test_below_the_floor_the_job_over_its_promise_is_acted_on_never_one_within():
    # 80 GiB: A asked 10 uses 10.5 (within the margin), B asked 69 uses 69: 0.5 GiB free.
    gpu = _gpu("g0", (101, 10 * GIB + GIB // 2), (102, 69 * GIB))
    jobs = [_job(1, 10 * GIB, "g0"), _job(2, 69 * GIB, "g0")]
    (over,) = _judge([gpu], jobs, floor=GIB)
    assert (over.job_id, over.is_under_floor) == (1, True)
    assert _judge([gpu], jobs, floor=GIB // 4) == []  # above the floor: the margin holds


def test_outside_memory_is_counted_at_its_peak_over_the_window():
    spiky = [_gpu("g0", (999, used)) for used in (40 * GIB, 5 * GIB, 8 * GIB)]
    samples: dict = {}
    for t, gpu in enumerate(spiky):
        samples = gpupromise.track_outside(Inventory(gpus=(gpu,)), {}, samples, t * 60.0, 300)
    assert gpupromise.outside_peaks(samples) == {"g0": 40 * GIB}
    assert len(samples["g0"]) == 2  # 40 and the newest 8: 5 can never be the peak again
    loads = placement.gpu_loads(
        Inventory(gpus=(spiky[-1],)), [], {}, outside_peaks=gpupromise.outside_peaks(samples)
    )
    assert loads["g0"].effective_free_bytes == 40 * GIB  # not 72: the 40 may come back
    later = gpupromise.track_outside(Inventory(gpus=(spiky[-1],)), {}, samples, 400.0, 300)
    assert gpupromise.outside_peaks(later) == {"g0": 8 * GIB}


def test_a_whole_gpu_job_waits_out_a_neighbours_dip_too():
    samples: dict = {}
    for t, used in enumerate((20 * GIB, 0)):
        gpu = _gpu("g0", (999, used)) if used else _gpu("g0")
        samples = gpupromise.track_outside(Inventory(gpus=(gpu,)), {}, samples, t * 60.0, 300)
    loads = placement.gpu_loads(
        Inventory(gpus=(gpu,)), [], {}, outside_peaks=gpupromise.outside_peaks(samples)
    )
    assert loads["g0"].outside_used_bytes == 0  # what it holds now, as /metrics shows it
    assert not placement.fits(loads["g0"], Request(gpus=1), placement.PlacementRules())
    assert placement.fits(
        placement.gpu_loads(Inventory(gpus=(gpu,)), [], {})["g0"],
        Request(gpus=1),
        placement.PlacementRules(),
    )


def test_going_over_is_one_gpu_mem_over_event():
    running = _job(1, 10 * GIB, "g0")
    over = replace(running, gpu_mem_over_by="used 30.0 GiB of GPU 0, asked for 10.0 GiB")
    assert events_of(running, over) == ["gpu_mem_over"]
    assert events_of(over, over) == []


# -- the daemon, in process -----------------------------------------------------------------
def _pair(box, a_over: str = "", a_grace: str = "60") -> tuple[int, int]:
    """On one 80 GiB GPU: A asks for 10 GiB and uses 30, B asks for 60 and uses 45 so far."""
    extra = ["--gpu-mem-over", a_over] if a_over else []
    a = box.submit(
        "--gpu-mem",
        "10G",
        *extra,
        "--preempt-grace",
        a_grace,
        "--env",
        "GPUSCHED_SIM_MEM_USED=30G",
        "--",
        "python",
        "a.py",
    )
    b = box.submit("--gpu-mem", "60G", "--env", "GPUSCHED_SIM_MEM_USED=45G", "--", "python", "b.py")
    box.step()
    assert box.running() == {a, b}
    box.step(box.daemon.settings.gpu_poll_interval_s)  # the reading that sees A at 30 GiB
    return a, b


def test_report_flags_the_job_in_ls_show_and_metrics(make_box):
    box = make_box("1x80GiB")
    a, b = _pair(box)
    job = box.show(a)
    assert job["gpu_mem_over_by"] == "used 30.0 GiB of GPU 0, asked for 10.0 GiB"
    assert box.show(b)["gpu_mem_over_by"] == "" and box.running() == {a, b}
    assert any("gpu_over = report" in line for _, line in box.shims.notes)
    assert box.shims.signalled(a) == []
    lean = box.call("snapshot", lean=True)
    assert {j["id"]: j["gpu_mem_over_by"] for j in lean["jobs"]}[a].startswith("used 30.0")


def test_stop_sends_the_checkpoint_signal_then_sigterm_and_ends_gpu_oom(make_box):
    box = make_box("1x80GiB", '[memory]\ngpu_over = "stop"\n')
    a, b = _pair(box, a_grace="5")
    assert box.shims.signalled(a) == [signal.SIGUSR1] and box.shims.signalled(b) == []
    box.step(5)
    assert box.shims.signalled(a) == [signal.SIGUSR1, signal.SIGTERM]
    job = box.exit(a, None, signal.SIGTERM)
    assert job["state"] == "gpu_oom"
    assert job["end_reason"] == (
        "stopped: used 30.0 GiB of GPU 0, asked for 10.0 GiB (gpu_over = stop) (SIGTERM)"
    )
    assert box.running() == {b}


def test_below_the_floor_a_stop_needs_no_grace(make_box):
    box = make_box("1x80GiB", '[memory]\ngpu_free_floor = "20GiB"\n')
    a, b = _pair(box, a_over="stop")  # 80 - 30 - 45: 5 GiB free
    assert box.shims.signalled(a) == [signal.SIGUSR1]
    assert box.daemon.control.next_deadline() == box.clock.time()  # the next turn, at once
    box.step()
    assert box.shims.signalled(a) == [signal.SIGUSR1, signal.SIGTERM]
    assert box.shims.signalled(b) == []  # within its promise: never acted on


def test_requeue_runs_it_again_with_its_peak_times_1_25_where_it_fits(make_box):
    box = make_box("2x80GiB", '[scheduling]\npolicy = "pack"\n')
    a, b = _pair(box, a_over="requeue", a_grace="0")
    assert signal.SIGUSR1 in box.shims.signalled(a)
    box.step()  # the grace of 0 ran out: SIGTERM
    assert box.shims.signalled(a)[-1] == signal.SIGTERM
    job = box.exit(a, None, signal.SIGTERM)  # back to the queue, and placed again at once
    assert (job["attempt"], job["gpu_mem_bytes"]) == (2, 37 * GIB + GIB // 2)
    assert (
        "(peak 30.0 GiB x1.25) after attempt 1 went over (used 30.0 GiB of GPU"
        in job["gpu_mem_reason"]
    )
    assert "gpu_over = requeue" in job["requeue_reason"]
    assert job["state"] == "running" and job["gpus"] != box.show(b)["gpus"]  # not beside B


def test_a_spiky_neighbours_dip_does_not_invite_a_job(make_box):
    box = make_box("1x80GiB", '[memory]\nothers_peak_window = "5m"\n')
    poll = box.daemon.settings.gpu_poll_interval_s
    box.declare_outside({"gpu": 0, "pid": 999, "memory": "50GiB"})
    box.step(poll)
    box.declare_outside({"gpu": 0, "pid": 999, "memory": "5GiB"})
    box.step(poll)
    job = box.submit("--gpu-mem", "40G", "--", "python", "train.py")
    box.step()
    assert box.states(job) == ["pending"]
    assert box.show(job)["pending_reason"] == (
        "needs 1 GPU with 40.0 GiB free; most free is GPU 0 with 30.0 GiB (counting 45.0 GiB "
        "that processes gpusched did not start freed within [memory] others_peak_window)"
    )
    box.step(301)  # the 50 GiB reading left the window
    box.step(poll)
    assert box.states(job) == ["running"]


def test_a_stopped_job_retried_on_gpu_oom_runs_again_with_its_peak_times_1_25(make_box):
    box = make_box("2x80GiB", '[memory]\ngpu_over = "stop"\n')
    a = box.submit(
        "--gpu-mem",
        "10G",
        "--retries",
        "1",
        "--retry-on",
        "gpu_oom",
        "--retry-delay",
        "0",
        "--env",
        "GPUSCHED_SIM_MEM_USED=30G",
        "--",
        "python",
        "a.py",
    )
    box.submit("--gpu-mem", "60G", "--env", "GPUSCHED_SIM_MEM_USED=45G", "--", "python", "b.py")
    box.step()
    box.step(box.daemon.settings.gpu_poll_interval_s)
    box.step(60)  # the grace ran out
    job = box.exit(a, None, signal.SIGTERM)
    assert (job["attempt"], job["gpu_mem_bytes"]) == (2, 37 * GIB + GIB // 2)
    assert "(peak 30.0 GiB x1.25) after attempt 1 went over (used 30.0 GiB" in job["gpu_mem_reason"]


def test_top_marks_the_gpu_memory_of_a_job_over_its_promise():
    from test_tui import _jobs, frame

    jobs = tuple(j._replace(gpu_mem_over=j.id == 8) for j in _jobs())
    text = frame(140, jobs=jobs)
    (row,) = [line for line in text.splitlines() if " serve " in line]
    (other,) = [line for line in text.splitlines() if " train-llm " in line]
    assert "/ 20.0 GiB!" in row and "!" not in other


def test_a_restarted_daemon_keeps_a_stops_grace_then_sends_sigterm(make_box):
    box = make_box("1x80GiB", '[memory]\ngpu_over = "stop"\n')
    a, _ = _pair(box)
    assert box.shims.signalled(a) == [signal.SIGUSR1]  # 60 s of grace to go
    box.restart()
    box.step(box.daemon.settings.gpu_poll_interval_s)
    assert box.shims.signalled(a) == [signal.SIGUSR1]  # the grace is stored: not cut short
    box.step(60.0)
    assert box.shims.signalled(a) == [signal.SIGUSR1, signal.SIGTERM]
    assert box.exit(a, None, signal.SIGTERM)["state"] == "gpu_oom"


def test_a_job_cancelled_while_stopping_ends_cancelled(make_box):
    box = make_box("1x80GiB", '[memory]\ngpu_over = "stop"\n')
    a, _ = _pair(box)
    box.call("cancel", ids=[a])
    assert box.exit(a, None, signal.SIGTERM)["state"] == "cancelled"


def test_update_gpu_mem_over_stops_a_job_already_reported(make_box):
    box = make_box("1x80GiB")
    a, _ = _pair(box)
    assert box.shims.signalled(a) == []  # reported only
    said = box.call("update", ids=[str(a)], gpu_mem_over="stop")
    assert said["results"] == {str(a): "gpu_mem_over stop"}
    box.step(box.daemon.settings.gpu_poll_interval_s)
    assert box.shims.signalled(a) == [signal.SIGUSR1]
    assert box.show(a)["gpu_mem_over"] == "stop"
